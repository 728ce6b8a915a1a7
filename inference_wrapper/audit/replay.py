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


def replay(record: dict[str, Any], prompt: str, *, model_dir: Path | None = None,
           manifest_path: Path | None = None, device: str | None = None) -> ReplayResult:
    from inference_wrapper.audit.generator import AuditedGenerator
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
    try:
        generator = AuditedGenerator(loaded, contract=TokenizationContract(**recorded_contract))
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
