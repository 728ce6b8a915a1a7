"""The stream start record ``audit-stream-start/v1``: written before a streamed answer.

A streamed request leaves two leaves. This one is committed before any token leaves the
server; it names the request (input commitment, fingerprints, parameters) but holds no
output. The request's ordinary ``audit-record/v1`` follows, committed before the final
chunk, and names this one in ``data.stream_start_record_id``. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ledger.canonical import Canonical
from ledger.errors import CanonicalFormError

if TYPE_CHECKING:
    from ledger.record import AuditRecord

STREAM_START_SCHEMA = "audit-stream-start/v1"
START_SECTIONS = ("model", "hardware", "software", "data")
START_KEYS = frozenset(("schema", "record_id", "created_at", "tenant", *START_SECTIONS))
START_DATA_KEYS = frozenset(("input_commitment", "input_bytes", "generation", "route"))


def validate_stream_start(body: Mapping[str, Any]) -> None:
    """The kind's own rules (``ledger.record.validate_body`` checks the common ones)."""
    keys = set(body)
    if keys != START_KEYS:
        wrong = sorted((START_KEYS - keys) | (keys - START_KEYS))
        raise CanonicalFormError(f"a stream start record has exactly {sorted(START_KEYS)}; "
                                 f"wrong: {wrong}", field="record")
    for section in START_SECTIONS:
        if not isinstance(body[section], Mapping):
            raise CanonicalFormError("must be an object", field=f"record.{section}")
    data = body["data"]
    if set(data) != START_DATA_KEYS:
        raise CanonicalFormError(f"must hold exactly {sorted(START_DATA_KEYS)}",
                                 field="record.data")
    if not isinstance(data["input_commitment"], str) or not data["input_commitment"]:
        raise CanonicalFormError("must be a non-empty string",
                                 field="record.data.input_commitment")
    if not isinstance(data["generation"], Mapping):
        raise CanonicalFormError("must be an object", field="record.data.generation")


def build_stream_start(
    *,
    tenant: str,
    model: Mapping[str, Any] | Canonical,
    hardware: Mapping[str, Any] | Canonical,
    software: Mapping[str, Any] | Canonical,
    input_commitment: str,
    input_bytes: int,
    generation: Mapping[str, Any],
    route: str,
) -> AuditRecord:
    """Assemble and canonicalize a start record (``Canonical`` sections spliced in)."""
    # Imported here: ledger.record imports this module to register the kind.
    from ledger import merkle
    from ledger.canonical import canonical_object
    from ledger.record import AuditRecord, new_record_id, utc_timestamp, validate_body

    members: dict[str, Any] = {
        "schema": STREAM_START_SCHEMA,
        "record_id": new_record_id(),
        "created_at": utc_timestamp(),
        "tenant": tenant,
        "model": model,
        "hardware": hardware,
        "software": software,
        "data": {"input_commitment": input_commitment, "input_bytes": input_bytes,
                 "generation": dict(generation), "route": route},
    }
    body = {k: v.value if isinstance(v, Canonical) else v for k, v in members.items()}
    validate_body(body)
    data_bytes = canonical_object(members)
    return AuditRecord(body, data_bytes, merkle.hash_leaf(data_bytes))
