"""The ``access-record/v2`` and ``erasure-record/v2`` bodies: every read of retained
content and every erasure, in the log as v2 leaves (decision records 0038, 0043).

Neither holds content, a salt, a subject id or any function of them: an access leaf
names who read which record and why; an erasure leaf names the records whose data keys
were destroyed, why and at whose request. Both are tenant-scoped (the envelope carries
the tag of the tenant whose content it is about), so a tenant's auditor sees them in its
own window and nobody else reads their bodies.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ledger.canonical import canonical_bytes
from ledger.content_records import (
    ERASURE_REASONS,
    MAX_LEGAL_BASIS_CHARS,
    MAX_PURPOSE_CHARS,
)
from ledger.errors import CanonicalFormError
from ledger.leaves import fields
from ledger.leaves.envelope import Leaf, seal, tenant_tag

ACCESS_KIND = "access-record/v2"
ERASURE_KIND = "erasure-record/v2"
TOP_KEYS = frozenset(("schema", "record_id", "created_at", "tenant"))
ACCESS_KEYS = frozenset(("record_id", "accessor", "purpose", "channel"))
ACCESSOR_KEYS = frozenset(("key_id", "role", "tenant"))
CHANNELS = ("http", "cli")
ERASURE_KEYS = frozenset(("records", "reason", "selector", "requested_by"))
ERASURE_OPTIONAL_KEYS = frozenset(("legal_basis", "cancels"))
SELECTORS = ("records", "subject", "expiry")
MAX_ERASED_RECORDS = 100_000  # what a reader accepts in one leaf (older leaves included)
# What a writer names in one leaf (decision 0061). A body travels in a tile bundle behind a
# 16-bit length, so it must stay under 65,535 bytes. A named record costs at most 259
# bytes (64 characters of 4 UTF-8 bytes, two quotes, a comma) and the other members at
# most 3,747 (every text at its limit, 4-byte characters): 200 records make at most
# 55,547 bytes, a sixth under the limit. A UUIDv7 record id costs 39 bytes (~8 KB a leaf).
RECORDS_PER_ERASURE_LEAF = 200


def build_access(*, origin: str, record_id: str, record_tenant: str, key_id: str,
                 role: str, key_tenant: str, purpose: str, channel: str,
                 leaf_id: str, created_at: str) -> Leaf:
    """The leaf of one read of ``record_id``'s content; tenant-scoped to the record's
    tenant, so that tenant's listing shows who read its records."""
    content: dict[str, Any] = {
        "schema": ACCESS_KIND, "record_id": leaf_id, "created_at": created_at,
        "tenant": record_tenant,
        "access": {"record_id": record_id, "purpose": purpose, "channel": channel,
                   "accessor": {"key_id": key_id, "role": role, "tenant": key_tenant}},
    }
    validate_access_v2(content)
    return seal(ACCESS_KIND, content, canonical_bytes(content),
                tenant_tag(origin, record_tenant))


def build_erasure(*, origin: str, tenant: str, records: Sequence[str], reason: str,
                  selector: str, requested_by: str, leaf_id: str, created_at: str,
                  legal_basis: str | None = None, cancels: str | None = None) -> Leaf:
    """The leaf of one erasure of at most ``MAX_ERASED_RECORDS`` (record ids sorted: one
    erasure has one form). A writer names more than ``RECORDS_PER_ERASURE_LEAF`` in
    several leaves (``erasure_parts``), or its body could not be published."""
    section: dict[str, Any] = {"records": sorted(records), "reason": reason,
                               "selector": selector, "requested_by": requested_by}
    if legal_basis is not None:
        section["legal_basis"] = legal_basis
    if cancels is not None:
        section["cancels"] = cancels
    content: dict[str, Any] = {"schema": ERASURE_KIND, "record_id": leaf_id,
                               "created_at": created_at, "tenant": tenant,
                               "erasure": section}
    validate_erasure_v2(content)
    return seal(ERASURE_KIND, content, canonical_bytes(content), tenant_tag(origin, tenant))


def erasure_parts(records: Iterable[str]) -> list[list[str]]:
    """``records`` sorted, each once, cut into the lists of at most
    ``RECORDS_PER_ERASURE_LEAF`` that one erasure's leaves name (one erasure, one form).
    An erasure that fits in one leaf has exactly the leaf it always had."""
    ordered = sorted(set(records))
    return [ordered[start:start + RECORDS_PER_ERASURE_LEAF]
            for start in range(0, len(ordered), RECORDS_PER_ERASURE_LEAF)]


def validate_access_v2(body: Mapping[str, Any]) -> None:
    """An ``access-record/v2`` body's rules."""
    fields.exact_members(body, TOP_KEYS | {"access"}, "access")
    fields.common_members(body, ACCESS_KIND, "access")
    access = fields.exact_members(body["access"], ACCESS_KEYS, "access.access")
    fields.text(access["record_id"], "access.access.record_id", 64)
    fields.text(access["purpose"], "access.access.purpose", MAX_PURPOSE_CHARS)
    if access["channel"] not in CHANNELS:
        raise CanonicalFormError(f"must be one of {list(CHANNELS)}",
                                 field="access.access.channel")
    accessor = fields.exact_members(access["accessor"], ACCESSOR_KEYS,
                                    "access.access.accessor")
    for key in sorted(ACCESSOR_KEYS):
        fields.text(accessor[key], f"access.access.accessor.{key}", 128)


def validate_erasure_v2(body: Mapping[str, Any]) -> None:
    """An ``erasure-record/v2`` body's rules."""
    fields.exact_members(body, TOP_KEYS | {"erasure"}, "erasure")
    fields.common_members(body, ERASURE_KIND, "erasure")
    erasure = fields.exact_members(body["erasure"], ERASURE_KEYS, "erasure.erasure",
                                   ERASURE_OPTIONAL_KEYS)
    records = erasure["records"]
    if not isinstance(records, list) or not 0 < len(records) <= MAX_ERASED_RECORDS:
        raise CanonicalFormError(f"must be a list of 1 to {MAX_ERASED_RECORDS} record ids",
                                 field="erasure.erasure.records")
    for i, record_id in enumerate(records):
        fields.text(record_id, f"erasure.erasure.records[{i}]", 64)
    if records != sorted(set(records)):
        raise CanonicalFormError("must be sorted, each id once",
                                 field="erasure.erasure.records")
    if erasure["reason"] not in ERASURE_REASONS:
        raise CanonicalFormError(f"must be one of {list(ERASURE_REASONS)}",
                                 field="erasure.erasure.reason")
    if erasure["selector"] not in SELECTORS:
        raise CanonicalFormError(f"must be one of {list(SELECTORS)}",
                                 field="erasure.erasure.selector")
    fields.text(erasure["requested_by"], "erasure.erasure.requested_by", 128)
    if "legal_basis" in erasure:
        fields.text(erasure["legal_basis"], "erasure.erasure.legal_basis",
                    MAX_LEGAL_BASIS_CHARS)
    if "cancels" in erasure:
        fields.text(erasure["cancels"], "erasure.erasure.cancels", 64)
    if (erasure["reason"] == "cancelled") != ("cancels" in erasure):
        raise CanonicalFormError("a cancelled erasure names the leaf it cancels, and only it",
                                 field="erasure.erasure.cancels")
