"""The audit record ``audit-record/v1``: what one generate call leaves behind.

A record is a JSON object; its identity is its canonical bytes (RFC 8785) and its leaf
hash ``SHA-256(0x00 || canonical bytes)`` (RFC 9162). The dictionaries inside come from
the fingerprint structures of ``inference_wrapper``; this module only checks their shape.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ledger import content_records, merkle
from ledger.canonical import (
    Canonical,
    Layout,
    LayoutError,
    canonical_bytes,
    canonical_object,
    json_number,
    parse_canonical,
)
from ledger.errors import CanonicalFormError
from ledger.leaf_base import new_record_id as new_record_id  # re-exported for callers
from ledger.leaf_base import utc_timestamp as utc_timestamp
from ledger.leaf_base import validate_common
from ledger.report_record import REPORT_SCHEMA, validate_report
from ledger.stream_record import STREAM_START_SCHEMA, validate_stream_start

RECORD_SCHEMA = "audit-record/v1"
REQUIRED_SECTIONS = ("model", "hardware", "software", "data", "timings_ms")
TOP_LEVEL_KEYS = frozenset(("schema", "record_id", "created_at", "tenant", *REQUIRED_SECTIONS))


@dataclass(frozen=True)
class AuditRecord:
    """A record together with the exact bytes that were hashed."""

    body: Mapping[str, Any]
    canonical: bytes
    leaf_hash: bytes

    @property
    def record_id(self) -> str:
        return str(self.body["record_id"])

    @property
    def created_at(self) -> str:
        return str(self.body["created_at"])

    @property
    def tenant(self) -> str:
        return str(self.body["tenant"])

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> AuditRecord:
        validate_body(body)
        data = canonical_bytes(body)
        return cls(body, data, merkle.hash_leaf(data))

    @classmethod
    def from_canonical(cls, data: bytes) -> AuditRecord:
        """Parse stored bytes; refuses anything that is not a canonical v1 record."""
        body = parse_canonical(data)
        validate_body(body)
        return cls(body, data, merkle.hash_leaf(data))


Section = Mapping[str, Any] | Canonical


def timings_json(timings_ms: Mapping[str, float]) -> dict[str, int | float]:
    """Phase timings as records hold them: milliseconds rounded to the microsecond, an
    integral one as an int (the same RFC 8785 bytes, and the canonical fast path)."""
    return {k: json_number(round(float(v), 3)) for k, v in timings_ms.items()}


def record_members(*, tenant: str, model: Section, hardware: Section, software: Section,
                   data: dict[str, Any], timings_ms: dict[str, int | float],
                   record_id: str | None = None, created_at: str | None = None
                   ) -> dict[str, Any]:
    """The members of an ``audit-record/v1``, in one place; ``timings_ms`` as
    ``timings_json`` returns them. Sections stay as given (plain or ``Canonical``)."""
    return {
        "schema": RECORD_SCHEMA,
        "record_id": record_id or new_record_id(),
        "created_at": created_at or utc_timestamp(),
        "tenant": tenant,
        "model": model,
        "hardware": hardware,
        "software": software,
        "data": data,
        "timings_ms": timings_ms,
    }


def build_record(
    *,
    tenant: str,
    model: Section,
    hardware: Section,
    software: Section,
    data: Mapping[str, Any],
    timings_ms: Mapping[str, float],
    record_id: str | None = None,
    created_at: str | None = None,
) -> AuditRecord:
    """Assemble and canonicalize one record.

    Sections passed as ``Canonical`` (computed once per process) are spliced in as they
    are; the result is byte-identical to canonicalizing the whole body.
    """
    members = record_members(tenant=tenant, model=model, hardware=hardware,
                             software=software, data=dict(data),
                             timings_ms=timings_json(timings_ms), record_id=record_id,
                             created_at=created_at)
    body = {k: v.value if isinstance(v, Canonical) else v for k, v in members.items()}
    validate_body(body)
    data_bytes = canonical_object(members)
    return AuditRecord(body, data_bytes, merkle.hash_leaf(data_bytes))


def build_stream_start(
    *,
    tenant: str,
    model: Section,
    hardware: Section,
    software: Section,
    input_commitment: str,
    input_bytes: int,
    generation: Mapping[str, Any],
    route: str,
) -> AuditRecord:
    """Assemble and canonicalize an ``audit-stream-start/v1`` record
    (``ledger.stream_record`` holds its rules; ``Canonical`` sections spliced in)."""
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


class RecordFamily:
    """Records that differ only in known leaves (a batch's rows), canonicalized through
    one ``Layout`` per combination of optional members.

    The first record of a kind is encoded in full (sections spliced, as
    ``build_record`` does). A second record of the kind compiles the layout from the
    first body and checks it against the first record's bytes before using it: a layout
    that disagrees is never used (``LayoutError``). A kind with a single record (a batch
    of one) so costs no more than ``build_record``. Callers build every body from the
    same constants and list every leaf that changes from row to row in ``varying``;
    ``check_last`` encodes the last record of each kind in full, so that a leaf that
    varies but is not listed fails the batch instead of reaching the log.
    """

    def __init__(self, sections: Mapping[str, Canonical], varying: Sequence[str]) -> None:
        self._sections = dict(sections)  # spliced as they are: computed once per process
        self._varying = tuple(varying)
        self._layouts: dict[tuple[str, ...], Layout] = {}
        self._firsts: dict[tuple[str, ...], AuditRecord] = {}
        self._lasts: dict[tuple[str, ...], AuditRecord] = {}  # filled through a layout

    def record(self, body: dict[str, Any], optional: tuple[str, ...] = ()) -> AuditRecord:
        """``body``'s record; ``optional``: the paths of its optional leaves (part of its
        kind, and varying too)."""
        if not body["tenant"] or type(body["tenant"]) is not str:
            validate_body(body)  # raises: the one per-row leaf a caller supplies
        layout = self._layouts.get(optional)
        if layout is None:
            first = self._firsts.get(optional)
            if first is None:
                validate_body(body)
                data = self._full(body)
                record = AuditRecord(body, data, merkle.hash_leaf(data))
                self._firsts[optional] = record
                return record
            layout = Layout({**first.body, **self._sections}, [*self._varying, *optional])
            if layout.fill(first.body) != first.canonical:
                raise LayoutError("a record layout disagrees with the full encoding")
            self._layouts[optional] = layout
        data = layout.fill(body)
        record = AuditRecord(body, data, merkle.hash_leaf(data))
        self._lasts[optional] = record
        return record

    def check_last(self) -> None:
        """Encode the latest layout-filled record of each kind in full and compare."""
        for record in self._lasts.values():
            if self._full(record.body) != record.canonical:
                raise LayoutError("a record's bytes disagree with its body: a leaf that "
                                  "varies from row to row is missing from the layout")

    def _full(self, body: Mapping[str, Any]) -> bytes:
        return canonical_object({**body, **self._sections})


def _validate_audit_record(body: Mapping[str, Any]) -> None:
    missing = TOP_LEVEL_KEYS - set(body)
    if missing:
        raise CanonicalFormError(f"missing keys {sorted(missing)}", field="record")
    extra = set(body) - TOP_LEVEL_KEYS
    if extra:
        raise CanonicalFormError(f"unknown keys {sorted(extra)}", field="record")
    for section in REQUIRED_SECTIONS:
        if not isinstance(body[section], Mapping):
            raise CanonicalFormError("must be an object", field=f"record.{section}")


# Every kind of leaf the log may hold, by its ``schema`` member. Other kinds (a streamed
# request's start record, an auditor's access record, an erasure record) are defined in
# pure modules of their own and listed here, so that a verifier knows all of them.
LEAF_KINDS: dict[str, Callable[[Mapping[str, Any]], None]] = {
    RECORD_SCHEMA: _validate_audit_record,
    content_records.ACCESS_SCHEMA: content_records.validate_access,
    content_records.ERASURE_SCHEMA: content_records.validate_erasure,
    STREAM_START_SCHEMA: validate_stream_start,
    REPORT_SCHEMA: validate_report,
}


def validate_body(body: Any) -> None:
    """Check a leaf's shape: the members every kind has, then its kind's own rules."""
    if not isinstance(body, Mapping):
        raise CanonicalFormError("a record is a JSON object")
    validator = LEAF_KINDS.get(body.get("schema"))  # type: ignore[arg-type]
    if validator is None:
        raise CanonicalFormError(f"schema must be one of {sorted(LEAF_KINDS)}",
                                 field="record.schema")
    validate_common(body)
    validator(body)


def mirror_columns(record: AuditRecord) -> dict[str, Any]:
    """The typed, indexed columns an auditor queries by, taken from the record itself.

    Leaves of other kinds lack some sections; their columns are then NULL.
    """
    body = record.body
    hardware, software = body.get("hardware", {}), body.get("software", {})
    data, model = body.get("data", {}), body.get("model", {})
    torch_info = software.get("torch", {})
    return {
        "record_id": record.record_id,
        "created_at": body["created_at"],
        "tenant": body["tenant"],
        "model_name": model.get("name"),
        "model_digest": model.get("digest"),
        "accelerator": hardware.get("accelerator"),
        "accelerator_model": hardware.get("accelerator_model"),
        "driver_version": hardware.get("driver_version"),
        "torch_version": torch_info.get("version"),
        "torch_commit": torch_info.get("git_version"),
        "service_revision": software.get("service", {}).get("git_revision"),
        "input_commitment": data.get("input_commitment"),
        "output_commitment": data.get("output_commitment"),
    }
