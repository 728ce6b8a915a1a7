"""The ``audit-leaf/v2`` envelope: what the Merkle tree holds for every v2 leaf.

    {"body":"sha256:<hex>","created_at":"...","kind":"audit-record/v2",
     "schema":"audit-leaf/v2","tenant_tag":"sha256:<hex>"|null}

The leaf hash is RFC 9162's ``SHA-256(0x00 || envelope bytes)``; the body (canonical
JSON) is stored and served beside it and bound by its digest. A reader of the envelopes
alone (tiles, a tenant's completeness check) learns each leaf's kind, time and tenant
tag, never its body. The tag names a tenant only to whoever knows the tenant's name and
the log's origin (decision record 0026 says what that discloses).
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ledger import merkle
from ledger.canonical import canonical_bytes, parse_strict
from ledger.digest import SHA256_PREFIX
from ledger.errors import CanonicalFormError, LeafBindingError

ENVELOPE_SCHEMA = "audit-leaf/v2"
ENVELOPE_KEYS = frozenset(("schema", "kind", "created_at", "tenant_tag", "body"))
TENANT_TAG_LABEL = "audit-ledger tenant-tag/v1\n"
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}\Z")
# RFC 3339 UTC with milliseconds, as ``utc_timestamp`` writes it. ASCII digits only: a
# str pattern's ``\d`` also matches other scripts' digits (Arabic-Indic, ...).
TIMESTAMP = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z\Z")


def is_timestamp(value: object) -> bool:
    """Whether ``value`` is a leaf time: ``TIMESTAMP``'s form and a real instant (no month
    13, no hour 24, no leap second). verify.js's ``isTimestamp`` is the same rule."""
    if not isinstance(value, str) or not TIMESTAMP.match(value):
        return False
    try:  # the pattern holds ASCII digits only, so int() reads each field as written
        datetime.datetime(int(value[0:4]), int(value[5:7]), int(value[8:10]),
                          int(value[11:13]), int(value[14:16]), int(value[17:19]))
    except ValueError:
        return False
    return True


@functools.lru_cache(maxsize=4096)  # a log has few tenants; every record needs its tag
def tenant_tag(origin: str, tenant: str) -> str:
    """The tag a tenant's leaves carry in this log (``origin``): a hash of both names,
    so one tenant's tags differ from log to log."""
    text = TENANT_TAG_LABEL + origin + "\n" + tenant
    return SHA256_PREFIX + hashlib.sha256(text.encode("utf-8")).hexdigest()


def body_digest(body: bytes) -> str:
    return SHA256_PREFIX + hashlib.sha256(body).hexdigest()


@dataclass(frozen=True)
class Leaf:
    """A v2 leaf: its envelope bytes (hashed into the tree), its body bytes (stored
    beside it), the leaf hash, and the parsed body (``content``)."""

    envelope: bytes
    body: bytes
    leaf_hash: bytes
    kind: str
    content: Mapping[str, Any]

    @property
    def canonical(self) -> bytes:
        """The bytes the tree hashes (a v1 record's ``canonical`` is the same thing)."""
        return self.envelope

    @property
    def record_id(self) -> str:
        return str(self.content["record_id"])

    @property
    def created_at(self) -> str:
        return str(self.content["created_at"])

    @property
    def tenant(self) -> str | None:
        """The tenant of a tenant-scoped leaf; None for a log-wide one (environment)."""
        tenant = self.content.get("tenant")
        return None if tenant is None else str(tenant)


def envelope_members(kind: str, created_at: str, tag: str | None, body: bytes
                     ) -> dict[str, Any]:
    return {"schema": ENVELOPE_SCHEMA, "kind": kind, "created_at": created_at,
            "tenant_tag": tag, "body": body_digest(body)}


def envelope_bytes(kind: str, created_at: str, tag: str | None, body: bytes) -> bytes:
    """The envelope's canonical bytes, written out: every value is ASCII from a checked
    alphabet (a kind, an RFC 3339 time, hex digests), so RFC 8785 is this exact text
    (``tests/unit/test_leaves_v2.py`` compares it with the encoder)."""
    if not is_timestamp(created_at):
        raise CanonicalFormError("must be RFC 3339 UTC with milliseconds",
                                 field="envelope.created_at")
    if (tag is not None and not _DIGEST.match(tag)) \
            or not kind.isascii() or '"' in kind or "\\" in kind or not kind.isprintable():
        return canonical_bytes(envelope_members(kind, created_at, tag, body))
    return (b'{"body":"sha256:' + hashlib.sha256(body).hexdigest().encode("ascii")
            + b'","created_at":"' + created_at.encode("ascii") + b'","kind":"'
            + kind.encode("ascii") + b'","schema":"audit-leaf/v2","tenant_tag":'
            + (b"null" if tag is None else b'"' + tag.encode("ascii") + b'"') + b"}")


def seal(kind: str, content: Mapping[str, Any], body: bytes, tag: str | None) -> Leaf:
    """The leaf of an already validated body (``body``: its canonical bytes)."""
    envelope = envelope_bytes(kind, str(content["created_at"]), tag, body)
    return Leaf(envelope, body, merkle.hash_leaf(envelope), kind, content)


class BatchSealer:
    """``seal`` for many bodies of one kind and one time (a batch's records): the time
    and the kind are checked once and each tenant tag once, so each leaf costs its two
    hashes and the envelope text around its body digest (``envelope_bytes``)."""

    def __init__(self, kind: str, created_at: str) -> None:
        self.kind, self.created_at = kind, created_at
        self._tails: dict[str | None, bytes] = {}  # checked as ``seal`` is: at the first

    def seal(self, content: Mapping[str, Any], body: bytes, tag: str | None) -> Leaf:
        """The leaf of an already validated body of this kind and time."""
        if content["created_at"] != self.created_at:
            return seal(self.kind, content, body, tag)
        tail = self._tails.get(tag)
        if tail is None:  # the first body with this tag: as ``seal`` makes it
            leaf = seal(self.kind, content, body, tag)
            # What follows the body digest is the same for every body (``body`` is the
            # envelope's first member, and its digest all that depends on the body).
            self._tails[tag] = leaf.envelope[_DIGEST_END:] \
                if leaf.envelope.startswith(_PLAIN_HEAD) else b""
            return leaf
        if not tail:
            return seal(self.kind, content, body, tag)
        envelope = _PLAIN_HEAD + hashlib.sha256(body).hexdigest().encode("ascii") + tail
        return Leaf(envelope, body, merkle.hash_leaf(envelope), self.kind, content)


_PLAIN_HEAD = b'{"body":"sha256:'
_DIGEST_END = len(_PLAIN_HEAD) + 64


def parse_envelope(envelope: bytes) -> dict[str, Any]:
    """An envelope's members, shape-checked (not yet bound to any body)."""
    value = parse_strict(envelope)
    if not isinstance(value, dict) or set(value) != ENVELOPE_KEYS:
        got = sorted(value) if isinstance(value, dict) else type(value).__name__
        raise CanonicalFormError(f"an envelope has exactly {sorted(ENVELOPE_KEYS)}; "
                                 f"got {got}", field="envelope")
    if value["schema"] != ENVELOPE_SCHEMA:
        raise CanonicalFormError(f"must be {ENVELOPE_SCHEMA!r}", field="envelope.schema")
    if not isinstance(value["kind"], str) or not value["kind"]:
        raise CanonicalFormError("must be a non-empty string", field="envelope.kind")
    if not is_timestamp(value["created_at"]):
        raise CanonicalFormError("must be RFC 3339 UTC with milliseconds",
                                 field="envelope.created_at")
    tag = value["tenant_tag"]
    if tag is not None and (not isinstance(tag, str) or not _DIGEST.match(tag)):
        raise CanonicalFormError("must be null or 'sha256:<64 hex>'",
                                 field="envelope.tenant_tag")
    if not isinstance(value["body"], str) or not _DIGEST.match(value["body"]):
        raise CanonicalFormError("must be 'sha256:<64 hex>'", field="envelope.body")
    return value


# An envelope exactly as ``envelope_bytes`` writes it: RFC 8785 text whose values need no
# escapes, so a full match is the canonical form and its groups are the members (body
# digest, time, kind, tenant tag or None), each that member's only value. The time is
# matched in form only (``canonical_envelope`` checks it is an instant).
CANONICAL_ENVELOPE = re.compile(
    rb'\{"body":"(sha256:[0-9a-f]{64})","created_at":"([0-9]{4}-[0-9]{2}-[0-9]{2}T'
    rb'[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z)","kind":"([a-z0-9][a-z0-9/._-]{0,63})",'
    rb'"schema":"audit-leaf/v2","tenant_tag":(?:null|"(sha256:[0-9a-f]{64})")\}')


def canonical_envelope(envelope: bytes) -> dict[str, Any] | None:
    """The members of an envelope in canonical form with plain values (every envelope the
    writer makes), without the JSON parser: exactly what ``parse_envelope`` returns for
    those bytes. None for any other bytes (``parse_envelope`` then judges them)."""
    found = CANONICAL_ENVELOPE.fullmatch(envelope)
    if found is None or not is_timestamp(found.group(2).decode("ascii")):
        return None
    body, created_at, kind, tag = found.groups()
    return {"schema": ENVELOPE_SCHEMA, "kind": kind.decode("ascii"),
            "created_at": created_at.decode("ascii"),
            "tenant_tag": None if tag is None else tag.decode("ascii"),
            "body": body.decode("ascii")}


def is_envelope(leaf_bytes: bytes) -> bool:
    """Whether stored leaf bytes are a v2 envelope (a v1 leaf is its record itself).
    A cheap test on the bytes: canonical JSON puts ``body`` first and every v1 record
    starts with another member, so this never mistakes one for the other."""
    return leaf_bytes.startswith(b'{"body":"sha256:')


def check_body_digest(envelope: Mapping[str, Any], body: bytes) -> None:
    if body_digest(body) != envelope["body"]:
        raise LeafBindingError(f"the body hashes to {body_digest(body)}, the envelope "
                               f"names {envelope['body']}")
