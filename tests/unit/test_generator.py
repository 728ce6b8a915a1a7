"""The audited generator: records, determinism, and bad input refused before generate."""

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from inference_wrapper.engine.params import GenerationParams
from ledger import merkle
from ledger.digest import commitment_matches
from ledger.errors import InvalidInputError
from ledger.record import AuditRecord

PROMPT = "The ledger keeps every inference:"

DATA_TYPES: dict[str, Any] = {
    "input_commitment": str, "input_bytes": int, "input_shape": list,
    "input_ids_digest": str, "input_token_count": int, "truncated": bool,
    "attention_mask": dict, "output_ids_digest": str, "output_token_count": int,
    "output_commitment": str, "finish_reason": str, "generation": dict, "batch": dict,
}


def test_record_fields_present_and_typed(tiny_generator: Any) -> None:
    out = tiny_generator.generate(PROMPT, GenerationParams(max_new_tokens=8))
    body = out.record.body
    assert body["schema"] == "audit-record/v1"
    for key, kind in DATA_TYPES.items():
        assert isinstance(body["data"][key], kind), key
    mask = body["data"]["attention_mask"]
    assert mask["length"] % 8 == 0 and mask["padding_side"] == "left"
    assert mask["real_tokens"] + mask["padding"] == mask["length"]
    assert body["data"]["generation"] == {
        "max_new_tokens": 8, "temperature": 0.0, "top_p": 1.0, "seed": None, "do_sample": False,
    }
    assert set(body["timings_ms"]) == {"parse", "tokenize", "forward", "decode"}
    assert all(isinstance(v, float) for v in body["timings_ms"].values())
    assert body["hardware"]["accelerator"] in ("none", "cuda")


def test_record_bytes_hash_to_leaf_and_commitments_open(tiny_generator: Any) -> None:
    out = tiny_generator.generate(PROMPT, GenerationParams(max_new_tokens=8))
    assert out.record.leaf_hash == merkle.hash_leaf(out.record.canonical)
    assert AuditRecord.from_canonical(out.record.canonical).body == out.record.body
    data = out.record.body["data"]
    assert commitment_matches(data["input_commitment"], out.input_salt, PROMPT)
    assert commitment_matches(data["output_commitment"], out.output_salt, out.text)
    assert out.input_salt.hex() not in out.record.canonical.decode()


def test_batch_rows_get_their_own_mask_and_composition(tiny_generator: Any) -> None:
    params = GenerationParams(max_new_tokens=4)
    prompts = ["a", "a much longer prompt than the first one", "mid length"]
    outs = tiny_generator.generate_batch([tiny_generator.prepare(p, params) for p in prompts])
    for row, (prompt, out) in enumerate(zip(prompts, outs, strict=True)):
        data = out.record.body["data"]
        assert data["batch"]["size"] == 3 and data["batch"]["row"] == row
        assert data["input_shape"][0] == 3
        assert data["attention_mask"]["real_tokens"] == len(prompt.encode())
    assert len({o.record.record_id for o in outs}) == 3


def test_batch_records_equal_the_reference_encoding(tiny_generator: Any) -> None:
    """A batch's records are canonicalized through one layout per kind of row; each must
    equal RFC 8785's bytes of its body, whatever its tenant, stop strings and user."""
    import dataclasses

    import rfc8785

    params = GenerationParams(max_new_tokens=4)
    # Two rows of each kind, differing in every leaf a caller chooses.
    rows = [
        ("t1", {}), ('quote"tenant', {}),
        ("\u00e9t\u00e9", {"stop": ("\u00e9\"\\", "\U0001f600\n")}), ("t2", {"stop": ("x",)}),
        ("\U0001f601", {"user": "u\u2028\x00"}), ("t1", {"user": "plain"}),
        ("t3", {"stop": ("x",), "user": "a"}), ("t4", {"stop": ("\x7f",), "user": "\\"}),
    ]
    requests = [tiny_generator.prepare(f"prompt {i}" * (i + 1), params, tenant, **extra)
                for i, (tenant, extra) in enumerate(rows)]
    requests += [dataclasses.replace(requests[i], stream_start_id=f"start-{i}\u00e9")
                 for i in (0, 1)]
    outs = tiny_generator.generate_batch(requests)
    for out in outs:
        assert out.record.canonical == rfc8785.dumps(dict(out.record.body))
        assert out.record.leaf_hash == merkle.hash_leaf(out.record.canonical)
    assert [o.record.tenant for o in outs] == [t for t, _ in rows] + [rows[0][0], rows[1][0]]
    assert outs[2].record.body["data"]["stop"] == ["\u00e9\"\\", "\U0001f600\n"]
    assert outs[9].record.body["data"]["stream_start_record_id"] == "start-1\u00e9"
    assert len({o.record.body["data"]["batch"]["id"] for o in outs}) == 1


def test_a_per_row_leaf_missing_from_the_layout_fails_the_batch(
        tiny_generator: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Should someone add a per-row leaf to the record and not to ROW_LEAVES, the later
    rows would carry the first row's value in their bytes: sealing refuses instead."""
    from inference_wrapper.audit import generator as generator_module
    from ledger.canonical import LayoutError

    leaves = tuple(leaf for leaf in generator_module.ROW_LEAVES if leaf != "data.input_bytes")
    monkeypatch.setattr(generator_module, "ROW_LEAVES", leaves)
    params = GenerationParams(max_new_tokens=2)
    requests = [tiny_generator.prepare("a" * (i + 1), params) for i in range(3)]
    with pytest.raises(LayoutError, match="missing from the layout"):
        tiny_generator.generate_batch(requests)


def test_an_integral_parse_time_seals(tiny_generator: Any) -> None:
    import dataclasses

    request = dataclasses.replace(tiny_generator.prepare("hi", GenerationParams(
        max_new_tokens=2)), parse_ms=0)
    out = tiny_generator.generate_batch([request, request])
    assert [o.record.body["timings_ms"]["parse"] for o in out] == [0, 0]


STRIP = ("record_id", "created_at")


def _deterministic_view(record: dict[str, Any]) -> dict[str, Any]:
    record = {k: v for k, v in record.items() if k not in STRIP and k != "timings_ms"}
    data = dict(record["data"])
    data.pop("input_commitment"), data.pop("output_commitment")
    data["batch"] = {k: v for k, v in data["batch"].items() if k != "id"}
    return record | {"data": data}


SCRIPT = """
import json, sys, torch
torch.set_num_threads(1)
from pathlib import Path
from inference_wrapper.audit.generator import AuditedGenerator
from inference_wrapper.engine.model import load_model
from inference_wrapper.engine.params import GenerationParams
manifest = json.loads(Path(sys.argv[2]).read_text())
gen = AuditedGenerator(load_model(Path(sys.argv[1]), name="tiny-llama", manifest=manifest))
out = gen.generate(sys.argv[3], GenerationParams(max_new_tokens=16))
print(json.dumps({"text": out.text, "record": json.loads(out.record.canonical)}))
"""


def test_greedy_output_and_record_identical_across_processes(tiny_model_dir: Path) -> None:
    manifest = tiny_model_dir.parent / "tiny-llama.manifest.json"
    results = []
    for _ in range(2):
        proc = subprocess.run(
            [sys.executable, "-c", SCRIPT, str(tiny_model_dir), str(manifest), PROMPT],
            capture_output=True, text=True, check=True, timeout=120,
        )
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    first, second = results
    assert first["text"] == second["text"]
    assert _deterministic_view(first["record"]) == _deterministic_view(second["record"])
    assert first["record"]["record_id"] != second["record"]["record_id"]


class CountingModel:
    """Wraps the real model and counts generate calls."""

    def __init__(self, model: Any) -> None:
        self.model, self.calls = model, 0

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.model.generate(*args, **kwargs)


@pytest.mark.parametrize(
    ("prompt", "params", "field", "message"),
    [
        ("", {}, "prompt", "must not be empty"),
        ("   \n", {}, "prompt", "must not be empty"),
        ("x" * 20_000, {}, "prompt", "the limit is 16384"),
        (b"caf\xe9", {}, "prompt", "not valid UTF-8"),
        ("\ud800", {}, "prompt", "not valid Unicode"),
        (42, {}, "prompt", "must be a string"),
        ("ok", {"max_new_tokens": -1}, "max_new_tokens", "between 1 and 512"),
        ("ok", {"max_new_tokens": 0}, "max_new_tokens", "between 1 and 512"),
        ("ok", {"max_new_tokens": 10_000}, "max_new_tokens", "between 1 and 512"),
        ("ok", {"max_new_tokens": True}, "max_new_tokens", "must be an integer"),
        ("ok", {"temperature": math.nan}, "temperature", "must be finite"),
        ("ok", {"temperature": -0.5}, "temperature", "between 0.0 and 2.0"),
        ("ok", {"temperature": 9.0}, "temperature", "between 0.0 and 2.0"),
        ("ok", {"temperature": 1e-300}, "temperature", "0 (greedy) or at least 0.01"),
        ("ok", {"top_p": 0.0}, "top_p", "greater than 0"),
        ("ok", {"top_p": math.inf}, "top_p", "must be finite"),
        ("ok", {"seed": -3}, "seed", "between 0 and"),
    ],
)
def test_bad_input_refused_before_generate(
    tiny_generator: Any, prompt: Any, params: dict[str, Any], field: str, message: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    counter = CountingModel(tiny_generator.loaded.model)
    monkeypatch.setattr(tiny_generator.loaded, "model", counter)
    with pytest.raises(InvalidInputError) as info:
        tiny_generator.generate(prompt, GenerationParams(**params))
    assert info.value.field == field
    assert message in str(info.value)
    assert counter.calls == 0


def test_sampling_records_the_seed_it_used(tiny_generator: Any) -> None:
    out = tiny_generator.generate(PROMPT, GenerationParams(max_new_tokens=8, temperature=0.8))
    seed = out.record.body["data"]["generation"]["seed"]
    assert isinstance(seed, int)
    again = tiny_generator.generate(
        PROMPT, GenerationParams(max_new_tokens=8, temperature=0.8, seed=seed)
    )
    assert again.output_token_ids == out.output_token_ids


def test_over_long_prompt_truncated_on_the_contract_side(tiny_generator: Any) -> None:
    from dataclasses import replace

    contract = tiny_generator.contract
    short = replace(contract, max_length=16)
    encoded, truncated = short.encode(tiny_generator.loaded.tokenizer, ["x" * 10 + "END!" * 10])
    assert truncated == [True]
    row = encoded["input_ids"][0].tolist()
    assert len(row) == 16
    assert tiny_generator.loaded.tokenizer.decode(row) == "END!" * 4  # left side cut
