"""Leaves about retained content: ``access-record/v1`` and ``erasure-record/v1``.

They go through the same append as audit records, so every read of retained content and
every erasure is itself in the log, proved and anchored like everything else. Pure:
bodies in, bodies out; ``ledger.record.LEAF_KINDS`` lists their validators.

An access leaf names who read (API key id, role, the key's tenant), which record (id and
tenant), why (the purpose given) and when. An erasure leaf names the records whose data
keys were destroyed, why (a request, or the end of the retention period) and by whom.
Neither holds any content, salt or subject id.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ledger.errors import CanonicalFormError, InvalidInputError

ACCESS_SCHEMA = "access-record/v1"
ERASURE_SCHEMA = "erasure-record/v1"
ACCESS_KEYS = frozenset(("record_id", "tenant", "accessor", "purpose", "channel"))
ACCESSOR_KEYS = frozenset(("key_id", "role", "tenant"))
ERASURE_KEYS = frozenset(("records", "reason", "requested_by", "selector"))
# Optional: the legal basis of an erasure before the minimum retention (decision 38), and
# the erasure leaf a "cancelled" leaf withdraws (a legal hold placed while it was logged).
ERASURE_OPTIONAL_KEYS = frozenset(("legal_basis", "cancels"))
ERASURE_REASONS = ("request", "expiry", "cancelled")
MAX_LEGAL_BASIS_CHARS = 500
MAX_PURPOSE_CHARS = 500


def _exact_keys(value: Any, keys: frozenset[str], where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise CanonicalFormError("must be an object", field=where)
    if set(value) != keys:
        raise CanonicalFormError(f"must have exactly the keys {sorted(keys)}", field=where)
    return value


def _text(value: Any, where: str, limit: int = 256) -> None:
    if not isinstance(value, str) or not value or len(value) > limit:
        raise CanonicalFormError(f"must be a string of 1 to {limit} characters", field=where)


def _top_level(body: Mapping[str, Any], section: str) -> None:
    expected = {"schema", "record_id", "created_at", "tenant", section}
    if set(body) != expected:
        raise CanonicalFormError(f"must have exactly the keys {sorted(expected)}",
                                 field="record")


def validate_access(body: Mapping[str, Any]) -> None:
    """Shape of an ``access-record/v1`` leaf."""
    _top_level(body, "access")
    access = _exact_keys(body["access"], ACCESS_KEYS, "record.access")
    _text(access["record_id"], "record.access.record_id", 64)
    _text(access["tenant"], "record.access.tenant", 128)
    _text(access["purpose"], "record.access.purpose", MAX_PURPOSE_CHARS)
    if access["channel"] not in ("http", "cli"):
        raise CanonicalFormError("must be http or cli", field="record.access.channel")
    accessor = _exact_keys(access["accessor"], ACCESSOR_KEYS, "record.access.accessor")
    for key in ACCESSOR_KEYS:
        _text(accessor[key], f"record.access.accessor.{key}", 128)


def validate_erasure(body: Mapping[str, Any]) -> None:
    """Shape of an ``erasure-record/v1`` leaf."""
    _top_level(body, "erasure")
    section = body["erasure"]
    optional = set(section) & ERASURE_OPTIONAL_KEYS if isinstance(section, Mapping) else set()
    erasure = _exact_keys(section, ERASURE_KEYS | optional, "record.erasure")
    if "legal_basis" in erasure:
        _text(erasure["legal_basis"], "record.erasure.legal_basis", MAX_LEGAL_BASIS_CHARS)
    if "cancels" in erasure:
        _text(erasure["cancels"], "record.erasure.cancels", 64)
    if (erasure["reason"] == "cancelled") != ("cancels" in erasure):
        raise CanonicalFormError("a cancelled erasure names the leaf it cancels, and only it",
                                 field="record.erasure.cancels")
    records = erasure["records"]
    if not isinstance(records, list) or not records:
        raise CanonicalFormError("must be a non-empty list", field="record.erasure.records")
    for i, record_id in enumerate(records):
        _text(record_id, f"record.erasure.records[{i}]", 64)
    if erasure["reason"] not in ERASURE_REASONS:
        raise CanonicalFormError(f"must be one of {list(ERASURE_REASONS)}",
                                 field="record.erasure.reason")
    if erasure["selector"] not in ("records", "subject", "expiry"):
        raise CanonicalFormError("must be records, subject or expiry",
                                 field="record.erasure.selector")
    _text(erasure["requested_by"], "record.erasure.requested_by", 128)


def access_body(*, leaf_id: str, created_at: str, record_id: str, record_tenant: str,
                key_id: str, role: str, key_tenant: str, purpose: str,
                channel: str) -> dict[str, Any]:
    """The body of an access leaf; its ``tenant`` is the tenant whose content was read, so
    a tenant's own listing shows who read its records."""
    body = {
        "schema": ACCESS_SCHEMA, "record_id": leaf_id, "created_at": created_at,
        "tenant": record_tenant,
        "access": {"record_id": record_id, "tenant": record_tenant, "purpose": purpose,
                   "channel": channel,
                   "accessor": {"key_id": key_id, "role": role, "tenant": key_tenant}},
    }
    validate_access(body)
    return body


def erasure_body(*, leaf_id: str, created_at: str, tenant: str, records: Sequence[str],
                 reason: str, selector: str, requested_by: str,
                 legal_basis: str | None = None, cancels: str | None = None
                 ) -> dict[str, Any]:
    """The body of an erasure leaf (record ids sorted, so the same erasure has one form)."""
    section: dict[str, Any] = {"records": sorted(records), "reason": reason,
                               "selector": selector, "requested_by": requested_by}
    if legal_basis is not None:
        section["legal_basis"] = legal_basis
    if cancels is not None:
        section["cancels"] = cancels
    body = {
        "schema": ERASURE_SCHEMA, "record_id": leaf_id, "created_at": created_at,
        "tenant": tenant, "erasure": section,
    }
    validate_erasure(body)
    return body


def check_legal_basis(basis: Any) -> str | None:
    """The stated legal basis of an early erasure: None, or printable text of 3 to 500
    characters (e.g. "GDPR Art. 17(1)(d): unlawfully processed, ticket 8812")."""
    if basis is None:
        return None
    if not isinstance(basis, str) or not 3 <= len(basis.strip()) <= MAX_LEGAL_BASIS_CHARS:
        raise InvalidInputError("legal_basis", f"must be 3 to {MAX_LEGAL_BASIS_CHARS} "
                                "characters")
    if not basis.isprintable():
        raise InvalidInputError("legal_basis", "must be printable text on one line")
    return basis.strip()


def check_purpose(purpose: Any) -> str:
    """A purpose is required for every content read: printable, 3 to 500 characters."""
    if not isinstance(purpose, str) or not 3 <= len(purpose.strip()) <= MAX_PURPOSE_CHARS:
        raise InvalidInputError("purpose", f"must say why, in 3 to {MAX_PURPOSE_CHARS} "
                                "characters")
    if not purpose.isprintable():
        raise InvalidInputError("purpose", "must be printable text on one line")
    return purpose.strip()
