"""Opening a stored v2 leaf: envelope and body checked together (verify's check 1 core).

The kinds of v2 body the log may hold, and whether each is tenant-scoped (its envelope
carries the tenant tag of the body's tenant) or log-wide (no tag, no tenant).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ledger import merkle
from ledger.canonical import parse_canonical, parse_strict
from ledger.errors import CanonicalFormError, LeafBindingError
from ledger.leaves.batch_layouts import BatchLayouts
from ledger.leaves.content_leaves import (
    ACCESS_KIND,
    ERASURE_KIND,
    validate_access_v2,
    validate_erasure_v2,
)
from ledger.leaves.envelope import (
    Leaf,
    canonical_envelope,
    check_body_digest,
    envelope_bytes,
    parse_envelope,
    tenant_tag,
)
from ledger.leaves.environment import ENVIRONMENT_KIND, validate_environment
from ledger.leaves.record_v2 import RECORD_KIND, validate_record_v2
from ledger.leaves.report import REPORT_KIND, validate_report_v2
from ledger.leaves.stream_start import STREAM_START_KIND, validate_stream_start_v2

# kind -> (the body's rules, tenant-scoped?). Every kind a v2 leaf may be (decision
# records 0026 and 0043); a verifier refuses any other.
V2_KINDS: dict[str, tuple[Callable[[Mapping[str, Any]], None], bool]] = {
    RECORD_KIND: (validate_record_v2, True),
    ENVIRONMENT_KIND: (validate_environment, False),
    STREAM_START_KIND: (validate_stream_start_v2, True),
    ACCESS_KIND: (validate_access_v2, True),
    ERASURE_KIND: (validate_erasure_v2, True),
    REPORT_KIND: (validate_report_v2, True),
}
# Kinds whose body names an environment leaf (checked with it, as 0026's check 1 says).
NAMES_ENVIRONMENT = frozenset((RECORD_KIND, STREAM_START_KIND))


def open_leaf(envelope: bytes, body: bytes, origin: str, *, strict: bool = False,
              layouts: BatchLayouts | None = None) -> Leaf:
    """The leaf these bytes make, or the error that says why they make none: the
    envelope's shape, the body's digest, the body's kind rules, and the envelope's
    kind, time and tenant tag against the body's. ``strict`` also refuses bytes that are
    not in canonical form (what the writer produced; fsck checks it). ``layouts``: a
    bulk reader's, which proves most records by their batch's layout (same rules)."""
    if layouts is not None:
        record = layouts.read(body)
        # The envelope the writer makes for this body: equal bytes are a canonical
        # envelope naming its digest, kind, time and tenant tag.
        if record is not None and envelope == envelope_bytes(
                RECORD_KIND, record["created_at"], tenant_tag(origin, record["tenant"]), body):
            return Leaf(envelope, body, merkle.hash_leaf(envelope), RECORD_KIND, record)
    fields = canonical_envelope(envelope)
    canonical = fields is not None  # then it needs no second parse under ``strict``
    if fields is None:
        fields = parse_envelope(envelope)
    check_body_digest(fields, body)
    kind = fields["kind"]
    rules = V2_KINDS.get(kind)
    if rules is None:
        raise CanonicalFormError(f"kind must be one of {sorted(V2_KINDS)}",
                                 field="envelope.kind")
    validate, tenant_scoped = rules
    content = _canonical(body, "body") if strict else parse_strict(body)
    if strict and not canonical:
        _canonical(envelope, "envelope")
    if not isinstance(content, dict) or content.get("schema") != kind:
        raise LeafBindingError(f"the envelope's kind is {kind}, the body's schema is "
                               f"{content.get('schema') if isinstance(content, dict) else None}")
    validate(content)
    if content["created_at"] != fields["created_at"]:
        raise LeafBindingError(f"the envelope's time {fields['created_at']} is not the "
                               f"body's {content['created_at']}")
    expected = tenant_tag(origin, content["tenant"]) if tenant_scoped else None
    if fields["tenant_tag"] != expected:
        raise LeafBindingError(
            f"the envelope's tenant tag {fields['tenant_tag']} is not "
            + (f"the tag of tenant {content['tenant']!r} in log {origin!r}" if tenant_scoped
               else "null (a log-wide leaf has none)"))
    if layouts is not None and kind == RECORD_KIND:
        layouts.learn(content, body)
    return Leaf(envelope, body, merkle.hash_leaf(envelope), kind, content)


def _canonical(data: bytes, part: str) -> Any:
    """``parse_canonical``, its error naming the part (``body``, ``envelope``): a v2
    leaf's bytes must be the very bytes its digests commit to (decision 0050)."""
    try:
        return parse_canonical(data)
    except CanonicalFormError as exc:
        raise CanonicalFormError(f"must be the canonical bytes committed to: {exc.reason}",
                                 field=part) from exc
