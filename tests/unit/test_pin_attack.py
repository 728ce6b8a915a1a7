"""The PIN attack of issue 20, run as an attacker would against a record and its
environment leaf: tokenize "my PIN is 0000".."my PIN is 9999" with the shipped tokenizer
and compare every unsalted digest of each candidate with every digest and commitment the
leaves hold.

Against an ``audit-record/v1`` it finds the (erased) PIN: its token id digests are
unsalted. Against ``audit-record/v2`` it finds nothing: content appears only as HMACs
under salts the attacker does not have. The records are sealed by the serving code
(``AuditedGenerator.seal``) from a batch tokenized under the shipped contract.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from collections.abc import Iterable
from typing import Any

import pytest

from inference_wrapper.audit.generator import AuditedGenerator, BatchResult, LogBinding
from inference_wrapper.defaults import DEFAULT_MODEL_DIR, DEFAULT_MODEL_NAME, PINNED_MANIFEST
from inference_wrapper.engine.contract import tokenizer_digest
from inference_wrapper.engine.modelfiles import load_manifest, manifest_digest
from inference_wrapper.engine.params import GenerationParams
from inference_wrapper.engine.protocol import EngineResult
from ledger.leaves import commitments
from ledger.leaves.envelope import Leaf
from ledger.leaves.record_v2 import EnvironmentRef

PIN = "7236"
PROMPT = f"my PIN is {PIN}"
OUTPUT = "42."
HEX64 = re.compile(r"[0-9a-f]{64}")
pytestmark = pytest.mark.slow  # the shipped model's tokenizer (scripts/setup.sh)


@pytest.fixture(scope="module")
def generator() -> AuditedGenerator:
    """The serving generator over the shipped tokenizer (no weights needed: only the
    sealing side runs here)."""
    import torch
    from transformers import AutoTokenizer

    from inference_wrapper.engine.model import LoadedModel

    assert DEFAULT_MODEL_DIR.is_dir(), "run scripts/setup.sh first"
    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL_DIR, local_files_only=True)
    loaded = LoadedModel(
        name=DEFAULT_MODEL_NAME, directory=DEFAULT_MODEL_DIR, model=None, tokenizer=tokenizer,
        device=torch.device("cpu"), digest=manifest_digest(load_manifest(PINNED_MANIFEST)),
        tokenizer_digest=tokenizer_digest(DEFAULT_MODEL_DIR),
        generation_config_digest="sha256:" + "0" * 64, pinned=True)
    return AuditedGenerator(loaded)


def _batch(generator: AuditedGenerator) -> BatchResult:
    request = generator.prepare(PROMPT, GenerationParams(max_new_tokens=8), tenant="acme")
    encoded, truncated = generator.contract.encode(generator.loaded.tokenizer, [PROMPT])
    output_ids = generator.loaded.tokenizer(OUTPUT, add_special_tokens=False)["input_ids"]
    result = EngineResult(engine_id="engine-0", params=request.params,
                          input_ids=encoded["input_ids"].tolist(),
                          attention_mask=encoded["attention_mask"].tolist(),
                          output_ids=[output_ids], texts=[OUTPUT], finish_reasons=["stop"],
                          truncated=truncated, timings_ms={"tokenize": 0.1, "forward": 5.0,
                                                           "decode": 0.1})
    return BatchResult([request], result, generator.environment())


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)
    elif isinstance(value, str):
        yield value


def _int64(ids: list[int]) -> bytes:
    return struct.pack(f"<{len(ids)}q", *ids)


def attack(documents: list[Any], tokenizer: Any, add_special_tokens: bool) -> dict[str, str]:
    """What an attacker holding ``documents`` (the JSON it can read) learns: the PIN and
    the output it confirms, by every unsalted digest it can compute."""
    targets = {match for text in _strings(documents) for match in HEX64.findall(text)}
    # The padding the record discloses (v1: data.attention_mask; v2: data.padding).
    pad_count, side = 0, "left"
    for document in documents:
        data = document.get("data", {}) if isinstance(document, dict) else {}
        if "attention_mask" in data:
            pad_count, side = data["attention_mask"]["padding"], data["attention_mask"][
                "padding_side"]
        elif "padding" in data:
            pad_count, side = data["padding"]["count"], data["padding"]["side"]
    pad = [tokenizer.pad_token_id or 0] * pad_count

    def digests(text: str, ids: list[int]) -> set[str]:
        padded = pad + ids if side == "left" else ids + pad
        return {hashlib.sha256(data).hexdigest() for data in (
            text.encode(), _int64(ids), _int64(padded), struct.pack(f"<{len(ids)}i", *ids))}

    found: dict[str, str] = {}
    candidates = [f"my PIN is {i:04d}" for i in range(10_000)]
    encoded = tokenizer(candidates, add_special_tokens=add_special_tokens)["input_ids"]
    for text, ids in zip(candidates, encoded, strict=True):
        if digests(text, ids) & targets:
            found["prompt"] = text
            break
    output_ids = tokenizer(OUTPUT, add_special_tokens=False)["input_ids"]
    if {hashlib.sha256(_int64(output_ids)).hexdigest(),
            hashlib.sha256(OUTPUT.encode()).hexdigest()} & targets:
        found["output"] = OUTPUT
    return found


def test_the_attack_finds_the_pin_in_a_v1_record(generator: AuditedGenerator) -> None:
    record = generator.seal(_batch(generator))[0].record
    assert not isinstance(record, Leaf) and record.body["schema"] == "audit-record/v1"
    found = attack([json.loads(record.canonical)], generator.loaded.tokenizer,
                   generator.contract.add_special_tokens)
    assert found == {"prompt": PROMPT, "output": OUTPUT}


def test_the_attack_finds_nothing_in_a_v2_record_and_its_environment(
        generator: AuditedGenerator) -> None:
    environment = generator.environment_leaf()
    log = LogBinding("attack.example/log")
    log.bind(generator.environment(), EnvironmentRef(0, environment.leaf_hash))
    output = generator.seal(_batch(generator), log)[0]
    record = output.record
    assert isinstance(record, Leaf) and record.kind == "audit-record/v2"
    documents = [json.loads(record.envelope), json.loads(record.body),
                 json.loads(environment.envelope), json.loads(environment.body)]
    found = attack(documents, generator.loaded.tokenizer,
                   generator.contract.add_special_tokens)
    assert found == {}
    # Not because the record holds nothing: it commits to exactly these values, which
    # the caller's salts open (and only they).
    held = record.content["commitments"]
    assert commitments.opens(held["input"], output.input_salt, "input", PROMPT.encode())
    assert commitments.opens(held["output"], output.output_salt, "output", OUTPUT.encode())
    batch = _batch(generator).result
    real = [t for t, m in zip(batch.input_ids[0], batch.attention_mask[0], strict=True) if m]
    assert commitments.opens(held["input_ids"], output.input_salt, "input_ids", _int64(real))
    assert record.content["data"]["input_token_count"] == len(real)


def test_the_attack_finds_nothing_in_a_v2_stream_start(generator: AuditedGenerator) -> None:
    environment = generator.environment_leaf()
    log = LogBinding("attack.example/log")
    log.bind(generator.environment(), EnvironmentRef(0, environment.leaf_hash))
    request = generator.prepare(PROMPT, GenerationParams(max_new_tokens=8), tenant="acme",
                                stop=("\n",), user="alice")
    start = generator.stream_start(request, "/v1/completions", log)
    assert isinstance(start, Leaf) and start.kind == "audit-stream-start/v2"
    documents = [json.loads(start.envelope), json.loads(start.body)]
    found = attack(documents, generator.loaded.tokenizer,
                   generator.contract.add_special_tokens)
    assert found == {}
    assert "input_bytes" not in start.body.decode()  # v1's byte count of the prompt
    # It commits under the request's own salt, to the value the completed record will.
    assert commitments.opens(start.content["commitments"]["input"], request.input_salt,
                             "input", PROMPT.encode())


def test_token_counts_are_the_residual_risk_decision_0043_states(
        generator: AuditedGenerator) -> None:
    """The counts a v2 body discloses (for billing and replay) narrow no PIN: every one of
    the 10,000 candidates has the recorded count. What they do tell apart is an answer
    from a small known set whose members have different token lengths; 0043 keeps them
    disclosed with that stated, and this measures both with the shipped tokenizer."""
    environment = generator.environment_leaf()
    log = LogBinding("attack.example/log")
    log.bind(generator.environment(), EnvironmentRef(0, environment.leaf_hash))
    record = generator.seal(_batch(generator), log)[0].record
    assert isinstance(record, Leaf)
    data = record.content["data"]
    tokenizer = generator.loaded.tokenizer
    candidates = [f"my PIN is {i:04d}" for i in range(10_000)]
    encoded = tokenizer(candidates, add_special_tokens=generator.contract.add_special_tokens)
    same_count = sum(len(ids) == data["input_token_count"] for ids in encoded["input_ids"])
    assert same_count == 10_000  # the count leaves every candidate: it finds no PIN
    outputs = [f"{i:04d}" for i in range(10_000)]
    lengths = {len(ids) for ids in tokenizer(outputs, add_special_tokens=False)["input_ids"]}
    assert len(lengths) == 1  # nor a 4-digit answer
    # The residual risk: "approved" and "denied" differ in length, so the count says which.
    yes, no = (len(tokenizer(word, add_special_tokens=False)["input_ids"])
               for word in ("approved", "denied"))
    assert yes != no
