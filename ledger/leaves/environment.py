"""The ``environment/v1`` body: an engine's hardware, software, model, tokenization
contract and generation config, logged once as its own leaf.

The audit pipeline appends one when an engine starts and again whenever any of these
change, before the first record that refers to it; each ``audit-record/v2`` names its
environment by leaf index and leaf hash, and a verifier checks both leaves. Log-wide: the
envelope carries no tenant tag and the body no tenant. Nothing here comes from a request,
so nothing here needs a commitment.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ledger.canonical import canonical_bytes
from ledger.errors import CanonicalFormError
from ledger.leaf_base import new_record_id, utc_timestamp, validate_common
from ledger.leaves.envelope import Leaf, is_timestamp, seal

ENVIRONMENT_KIND = "environment/v1"
SECTIONS = ("model", "hardware", "software", "tokenization_contract")
ENVIRONMENT_KEYS = frozenset(("schema", "record_id", "created_at", "engine", *SECTIONS,
                              "generation_config_digest"))
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}\Z")
# The mirror's filter columns an environment answers, as audit recomputes them.
ENVIRONMENT_COLUMNS = ("model_name", "model_digest", "accelerator", "accelerator_model",
                       "driver_version", "torch_version", "torch_commit",
                       "service_revision")


def environment_sections(*, model: Mapping[str, Any], hardware: Mapping[str, Any],
                         software: Mapping[str, Any],
                         tokenization_contract: Mapping[str, Any],
                         generation_config_digest: str) -> dict[str, Any]:
    """What an environment is, without its id and time: two engines (or one engine
    before and after a change) have the same environment when these are equal."""
    return {"model": dict(model), "hardware": dict(hardware), "software": dict(software),
            "tokenization_contract": dict(tokenization_contract),
            "generation_config_digest": generation_config_digest}


def build_environment(
    *,
    engine: str,
    model: Mapping[str, Any],
    hardware: Mapping[str, Any],
    software: Mapping[str, Any],
    tokenization_contract: Mapping[str, Any],
    generation_config_digest: str,
    record_id: str | None = None,
    created_at: str | None = None,
) -> Leaf:
    """An engine's environment leaf (log-wide: no tenant tag)."""
    content: dict[str, Any] = {
        "schema": ENVIRONMENT_KIND,
        "record_id": record_id or new_record_id(),
        "created_at": created_at or utc_timestamp(),
        "engine": engine,
        **environment_sections(model=model, hardware=hardware, software=software,
                               tokenization_contract=tokenization_contract,
                               generation_config_digest=generation_config_digest),
    }
    validate_environment(content)
    return seal(ENVIRONMENT_KIND, content, canonical_bytes(content), None)


def validate_environment(body: Mapping[str, Any]) -> None:
    """An ``environment/v1`` body's rules."""
    if set(body) != ENVIRONMENT_KEYS:
        wrong = sorted(ENVIRONMENT_KEYS ^ set(body))
        raise CanonicalFormError(f"an environment/v1 body has exactly "
                                 f"{sorted(ENVIRONMENT_KEYS)}; wrong: {wrong}",
                                 field="environment")
    if body["schema"] != ENVIRONMENT_KIND:
        raise CanonicalFormError(f"must be {ENVIRONMENT_KIND!r}", field="environment.schema")
    validate_common(body, ("record_id", "created_at", "engine"))
    if not is_timestamp(body["created_at"]):
        raise CanonicalFormError("must be RFC 3339 UTC with milliseconds",
                                 field="environment.created_at")
    for section in SECTIONS:
        if not isinstance(body[section], Mapping):
            raise CanonicalFormError("must be an object", field=f"environment.{section}")
    model = body["model"]
    if not isinstance(model.get("name"), str) or not model["name"]:
        raise CanonicalFormError("must be a non-empty string", field="environment.model.name")
    if not isinstance(model.get("digest"), str) or not _DIGEST.match(model["digest"]):
        raise CanonicalFormError("must be 'sha256:<64 hex>'",
                                 field="environment.model.digest")
    if not isinstance(body["generation_config_digest"], str) or not _DIGEST.match(
            body["generation_config_digest"]):
        raise CanonicalFormError("must be 'sha256:<64 hex>'",
                                 field="environment.generation_config_digest")


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def environment_columns(body: Mapping[str, Any]) -> dict[str, str | None]:
    """The mirror's filter columns, from an environment body (the one definition: the
    writer fills them, ``audit`` recomputes them from the leaf's bytes)."""
    model, hardware, software = body["model"], body["hardware"], body["software"]
    torch_info = software.get("torch") or {}
    service = software.get("service") or {}
    return {
        "model_name": _text(model.get("name")),
        "model_digest": _text(model.get("digest")),
        "accelerator": _text(hardware.get("accelerator")),
        "accelerator_model": _text(hardware.get("accelerator_model")),
        "driver_version": _text(hardware.get("driver_version")),
        "torch_version": _text(torch_info.get("version")),
        "torch_commit": _text(torch_info.get("git_version")),
        "service_revision": _text(service.get("git_revision")),
    }


def fingerprints(body: Mapping[str, Any]) -> dict[str, Any]:
    """What ``verify`` prints of a record's environment."""
    return {**environment_columns(body),
            "tokenizer_digest": body["tokenization_contract"].get("tokenizer_digest"),
            "generation_config_digest": body["generation_config_digest"],
            "engine": body["engine"], "environment_created_at": body["created_at"]}
