"""v2 bodies published beside the entry bundles, one bundle per tenant tag (pure;
docs/decisions/0045).

For entry bundle ``tile/entries/<N>[.p/<W>]`` and each tenant tag its envelopes carry,
``bodies/<tag hex>/<N>[.p/<W>]`` holds the bodies of that tag's v2 leaves among those
``W`` leaves, in index order, encoded as an entry bundle is (uint16 length, bytes). The
log-wide leaves (environments: no tag) go to ``bodies/log/<N>[.p/<W>]``. A tag with no
leaf there has no file. The reader knows from the envelopes which files exist and which
body belongs to which leaf, and checks each body against its envelope's digest.

Keyed by tag, a tenant's auditor reads only its own tenant's bodies (and the log-wide
environments its filters need); a static host grants it the prefix ``bodies/<its tag>/``
and ``bodies/log/``. Keyed by the entry bundle's width, a file never changes.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ledger import tiles
from ledger.digest import SHA256_PREFIX
from ledger.errors import InvalidInputError, MalformedProofError
from ledger.leaves.envelope import (
    CANONICAL_ENVELOPE,
    body_digest,
    is_envelope,
    parse_envelope,
)
from ledger.tiles import TileRef

PREFIX = "bodies"
LOG_WIDE = "log"  # the path segment of leaves without a tenant tag
_HEX = re.compile(r"[0-9a-f]{64}")


def segment(tag: str | None) -> str:
    """The path segment of a tenant tag (``sha256:<hex>`` -> ``<hex>``), or ``log``."""
    if tag is None:
        return LOG_WIDE
    if not tag.startswith(SHA256_PREFIX) or not _HEX.fullmatch(tag[len(SHA256_PREFIX):]):
        raise ValueError(f"not a tenant tag: {tag!r}")
    return tag[len(SHA256_PREFIX):]


def body_path(tag: str | None, ref: TileRef) -> str:
    """Where the bodies of ``tag``'s leaves in entry bundle ``ref`` are published."""
    if not ref.entries:
        raise ValueError("bodies go beside an entry bundle")
    return f"{PREFIX}/{segment(tag)}/{ref.path[len('tile/entries/'):]}"


def parse_body_path(path: str) -> tuple[str | None, TileRef]:
    """(tenant tag or None, entry bundle) of ``bodies/<tag hex|log>/<N>[.p/<W>]``; raise
    InvalidInputError naming the path otherwise."""
    parts = path.split("/", 2)
    if len(parts) != 3 or parts[0] != PREFIX:
        raise InvalidInputError("path", "is not a bodies path")
    if parts[1] == LOG_WIDE:
        tag = None
    elif _HEX.fullmatch(parts[1]):
        tag = SHA256_PREFIX + parts[1]
    else:
        raise InvalidInputError("path", "names neither a tenant tag nor the log-wide bodies")
    return tag, tiles.parse_path("tile/entries/" + parts[2])


def envelope_tag(entry: bytes) -> str | None:
    """An envelope's tenant tag. Every envelope the writer makes is canonical with plain
    values, read by one whole-string pattern (``CANONICAL_ENVELOPE``): its match is the
    whole envelope, so the member it reads is the envelope's only ``tenant_tag``, never
    text inside another member. Any other bytes are parsed strictly, and an envelope
    with a duplicate, an extra member or another spelling of the member's name is
    refused (CanonicalFormError) instead of being filed under a tag it names somewhere
    (decision 0050). Whoever opens the leaf checks the rest (its time as an instant)."""
    found = CANONICAL_ENVELOPE.fullmatch(entry)
    if found is not None:
        tag = found.group(4)
        return None if tag is None else tag.decode("ascii")
    parsed = parse_envelope(entry)["tenant_tag"]
    return None if parsed is None else str(parsed)


def tags_of(entries: Sequence[bytes]) -> dict[str | None, list[int]]:
    """The positions of the v2 leaves in a bundle, by tenant tag (v1 leaves have no
    body and are left out)."""
    found: dict[str | None, list[int]] = {}
    for position, entry in enumerate(entries):
        if is_envelope(entry):
            found.setdefault(envelope_tag(entry), []).append(position)
    return found


def split_bodies(entries: Sequence[bytes], bodies: Sequence[bytes | None]
                 ) -> dict[str | None, list[bytes]]:
    """A bundle's bodies grouped for publishing: tag -> its leaves' bodies in order."""
    grouped: dict[str | None, list[bytes]] = {}
    for tag, positions in tags_of(entries).items():
        found = [bodies[p] for p in positions]
        missing = [p for p, body in zip(positions, found, strict=True) if body is None]
        if missing:
            raise MalformedProofError(f"the v2 leaf at position {missing[0]} of the bundle "
                                      "has no stored body")
        grouped[tag] = [b for b in found if b is not None]
    return grouped


def decode_bodies(data: bytes) -> list[bytes]:
    """Every body in a body bundle, however many."""
    out, at = [], 0
    while at < len(data):
        length = int.from_bytes(data[at:at + 2], "big")
        if at + 2 > len(data) or length == 0 or at + 2 + length > len(data):
            raise MalformedProofError("a body bundle's entry overruns the bundle")
        out.append(data[at + 2:at + 2 + length])
        at += 2 + length
    return out


def attach(entries: Sequence[bytes], positions: Sequence[int], data: bytes,
           first: int) -> dict[int, bytes]:
    """The bodies of one body bundle by leaf index (``first`` is the bundle's first
    leaf), each checked against its envelope's digest; raise MalformedProofError naming
    the leaf whose body does not match."""
    bodies = tiles.decode_bundle(data, len(positions))
    out: dict[int, bytes] = {}
    for position, body in zip(positions, bodies, strict=True):
        entry = entries[position]
        if not entry.startswith(b'{"body":"' + body_digest(body).encode() + b'"'):
            raise MalformedProofError(f"the published body of leaf {first + position} does "
                                      "not hash to its envelope's body digest")
        out[first + position] = body
    return out
