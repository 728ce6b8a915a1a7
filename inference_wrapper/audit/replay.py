"""Replay a recorded inference: same model (by digest), same contract, same parameters,
same padding, and compare the output token digest.

The other rows of the recorded batch are other clients' private prompts, so a replay runs
this row alone with the recorded padding; on the same hardware and software greedy
decoding reproduces it. When it does not, the fingerprint differences explain why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inference_wrapper.audit.data_fingerprint import token_ids_digest
from inference_wrapper.defaults import DEFAULT_MODEL_DIR, PINNED_MANIFEST
from inference_wrapper.engine.contract import TokenizationContract
from inference_wrapper.engine.modelfiles import load_manifest, manifest_digest
from inference_wrapper.engine.params import GenerationParams
from ledger.errors import InvalidInputError, LedgerError


class ReplayRefusedError(InvalidInputError):
    """The replay cannot be a faithful one (another model, another tokenizer)."""


@dataclass
class ReplayResult:
    reproduced: bool
    recorded_output_digest: str
    replayed_output_digest: str
    input_ids_match: bool
    replayed_text: str
    differences: list[str] = field(default_factory=list)


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}.{key}" if prefix else key))
        return out
    return {prefix: value}


def fingerprint_differences(recorded: dict[str, Any], current: dict[str, Any],
                            section: str) -> list[str]:
    then, now = _flatten(recorded), _flatten(current)
    return [f"{section}.{key}: then {then.get(key)!r}, now {now.get(key)!r}"
            for key in sorted(set(then) | set(now)) if then.get(key) != now.get(key)]


def _load_for(record: dict[str, Any], model_dir: Path | None, manifest_path: Path | None,
              device: str | None) -> tuple[Any, TokenizationContract]:
    """The model a record names (``model``) and its recorded tokenization contract
    (``software.tokenization_contract``), refusing any other model."""
    from inference_wrapper.engine.model import load_model

    wanted = record["model"]["digest"]
    manifest: dict[str, Any] | None
    if model_dir is None:
        pinned = load_manifest(PINNED_MANIFEST)
        if manifest_digest(pinned) != wanted:
            raise ReplayRefusedError("--model-dir", f"the record names model {wanted}, which "
                                     "is not the shipped default; give its directory")
        model_dir, manifest = DEFAULT_MODEL_DIR, pinned
    else:
        manifest = load_manifest(manifest_path) if manifest_path else None
    loaded = load_model(model_dir, name=record["model"]["name"], manifest=manifest,
                        device=device)
    if loaded.digest != wanted:
        raise ReplayRefusedError("--model-dir", f"refusing to replay: {model_dir} has model "
                                 f"digest {loaded.digest}, the record names {wanted}")
    recorded_contract = dict(record["software"]["tokenization_contract"])
    recorded_contract.pop("schema", None)
    return loaded, TokenizationContract(**recorded_contract)


def replay(record: dict[str, Any], prompt: str, *, model_dir: Path | None = None,
           manifest_path: Path | None = None, device: str | None = None) -> ReplayResult:
    from inference_wrapper.audit.generator import AuditedGenerator

    loaded, contract = _load_for(record, model_dir, manifest_path, device)
    try:
        generator = AuditedGenerator(loaded, contract=contract)
    except ValueError as exc:
        raise ReplayRefusedError("tokenization_contract", str(exc)) from exc
    data = record["data"]
    generation = {k: v for k, v in data["generation"].items() if k != "do_sample"}
    try:
        request = generator.prepare(prompt, GenerationParams(**generation),
                                    truncate=bool(data.get("truncated")),
                                    stop=tuple(data.get("stop", ())))
    except LedgerError:
        raise
    result = generator.run_batch([request], min_length=data["batch"]["padded_length"]).result
    replayed = token_ids_digest(result.output_ids[0])
    differences = (
        fingerprint_differences(record["hardware"], generator.hardware, "hardware")
        + fingerprint_differences(
            {k: v for k, v in record["software"].items() if k != "tokenization_contract"},
            generator.software, "software")
    )
    return ReplayResult(
        reproduced=replayed == data["output_ids_digest"],
        recorded_output_digest=data["output_ids_digest"],
        replayed_output_digest=replayed,
        input_ids_match=token_ids_digest(result.input_ids[0]) == data["input_ids_digest"],
        replayed_text=result.texts[0],
        differences=differences,
    )


def replay_v2(record: dict[str, Any], environment: dict[str, Any], prompt: str, *,
              input_salt: bytes | None, output_salt: bytes | None,
              stop: tuple[str, ...] = (), model_dir: Path | None = None,
              manifest_path: Path | None = None, device: str | None = None) -> ReplayResult:
    """Replay an ``audit-record/v2`` under its environment leaf (already checked).

    A v2 record holds its token ids and stop strings only as commitments, so the caller
    gives them: the output salt opens ``output_ids``, the input salt ``input_ids`` and
    ``stop`` (the request's stop strings, in order).
    """
    from inference_wrapper.audit.generator import AuditedGenerator
    from ledger.leaves import commitments

    legacy = {"model": environment["model"],
              "software": {"tokenization_contract": environment["tokenization_contract"]}}
    loaded, contract = _load_for(legacy, model_dir, manifest_path, device)
    if output_salt is None:
        raise InvalidInputError("--output-salt", "replaying a v2 record compares the "
                                "output token ids through their commitment: give the salt")
    if "stop" in record["commitments"] and not (input_salt is not None and stop and
                                                commitments.opens(
            record["commitments"]["stop"], input_salt, commitments.STOP,
            commitments.stop_bytes(stop))):
        raise ReplayRefusedError("--stop", "the request had stop strings, which the record "
                                 "holds only as a commitment: give them (--stop, in order) "
                                 "with the input salt")
    if stop and "stop" not in record["commitments"]:
        raise ReplayRefusedError("--stop", "the recorded request had no stop strings")
    try:
        generator = AuditedGenerator(loaded, contract=contract)
    except ValueError as exc:
        raise ReplayRefusedError("tokenization_contract", str(exc)) from exc
    data = record["data"]
    generation = {k: v for k, v in data["generation"].items() if k != "do_sample"}
    request = generator.prepare(prompt, GenerationParams(**generation),
                                truncate=bool(data["truncated"]), stop=stop)
    result = generator.run_batch([request], min_length=data["shape"][1]).result
    ids = commitments.token_ids_bytes(result.output_ids[0])
    replayed = commitments.commit(output_salt, commitments.OUTPUT_IDS, ids)
    real_input = [token for token, kept in zip(result.input_ids[0], result.attention_mask[0],
                                               strict=True) if kept]
    input_match = input_salt is not None and commitments.opens(
        record["commitments"]["input_ids"], input_salt, commitments.INPUT_IDS,
        commitments.token_ids_bytes(real_input))
    differences = (
        fingerprint_differences(environment["hardware"], generator.hardware, "hardware")
        + fingerprint_differences(environment["software"], generator.software, "software"))
    return ReplayResult(
        reproduced=replayed == record["commitments"]["output_ids"],
        recorded_output_digest=record["commitments"]["output_ids"],
        replayed_output_digest=replayed,
        input_ids_match=input_match,
        replayed_text=result.texts[0],
        differences=differences,
    )
