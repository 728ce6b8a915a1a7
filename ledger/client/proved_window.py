"""A filtered window proved complete through the tiles: the library call behind
``audit-ledger query --prove`` and the console's search.

Every leaf of the window's range is read and checked against the signed root
(``ledger.window``); the filters are then applied to each leaf created in the window:
a v1 leaf by its own columns, a v2 record by its tenant tag and, for the other filters,
by its published body and the environment leaf it names (read, proved included, its body
checked, ``ledger.leaves.environment.environment_columns``). A tenant filter is applied
to the tag first, so a tenant's auditor never asks for another tenant's body.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol

from ledger import merkle
from ledger.body_bundles import envelope_tag
from ledger.canonical import canonical_bytes, parse_strict
from ledger.checkpoint import Checkpoint, NoteVerifier
from ledger.cosignature import WitnessKey, valid_cosigners
from ledger.errors import InvalidInputError, LeafBindingError
from ledger.leaves.envelope import is_envelope, tenant_tag
from ledger.leaves.environment import (
    ENVIRONMENT_COLUMNS,
    ENVIRONMENT_KIND,
    environment_columns,
)
from ledger.leaves.kinds import open_leaf
from ledger.window import MAX_LAG, WindowAnswer, WindowError, check_window

# The filters a window answers, as the mirror names them (the CLI's --tenant etc.): the
# tenant and every column an environment defines (v1 records carry the same columns).
FILTERS = ("tenant", *ENVIRONMENT_COLUMNS)


class BodyReader(Protocol):
    """Where a v2 leaf's body and other leaves of the checkpoint's tree come from."""

    def body(self, index: int, entry: bytes) -> bytes:
        """Leaf ``index``'s published body, checked against its envelope ``entry``."""

    def proved_leaf(self, index: int) -> bytes:
        """Leaf ``index``'s bytes, proved included in the checkpoint's tree."""


def _check_text(name: str, value: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate (argv's undecodable bytes)
        raise InvalidInputError(name.replace("_", "-"), "is not valid Unicode text") from exc


class LeafFilter:
    """The filters applied to one leaf's bytes (a ``keep`` for ``check_window``)."""

    def __init__(self, filters: Mapping[str, str], origin: str,
                 reader: BodyReader | None = None) -> None:
        unknown = sorted(set(filters) - set(FILTERS))
        if unknown:
            raise InvalidInputError(unknown[0], f"a proved window filters by "
                                    f"{', '.join(FILTERS)}")
        for name, value in filters.items():
            _check_text(name, value)
        self.filters, self.origin, self.reader = dict(filters), origin, reader
        self.tag = tenant_tag(origin, filters["tenant"]) if "tenant" in filters else None
        self.others = {k: v for k, v in filters.items() if k != "tenant"}
        self._wanted = [value.encode() for value in filters.values()]
        # A v1 record's tenant as canonical JSON spells it (RFC 8785: raw UTF-8, never
        # \u escapes for printable text), for the tenant-only fast path.
        self._tenant_member = (b'"tenant":' + canonical_bytes(filters["tenant"])
                               if set(filters) == {"tenant"} else None)
        self._environments: dict[int, tuple[str, str, dict[str, str | None]]] = {}

    def body_tags(self) -> set[str | None] | None:
        """The tenant tags whose bodies the filter reads (None: every tag), so the
        caller can fetch them ahead; the log-wide environments come with them."""
        if not self.others:
            return set()
        return {self.tag, None} if "tenant" in self.filters else None

    def __call__(self, index: int, entry: bytes) -> bool:
        if not self.filters:
            return True
        if is_envelope(entry):
            return self._keep_v2(index, entry)
        if self._tenant_member is not None and entry.count(b'"tenant":') == 1:
            # One tenant member in the whole leaf, so no duplicate can give it another
            # tenant: a leaf not spelling the wanted one there is not the tenant's; one
            # that does is parsed (in C) to see the member is the record's own.
            at = entry.find(self._tenant_member)
            end = at + len(self._tenant_member)
            if at >= 0 and entry[end:end + 1] in (b",", b"}"):
                value = json.loads(entry)
                if isinstance(value, dict) and value.get("tenant") == self.filters["tenant"]:
                    return True
            elif b"\\" not in entry:  # spelled without escapes: another tenant's
                return False
        from ledger.audit import open_record
        from ledger.record import mirror_columns

        # Without a backslash every JSON string is spelled out in the bytes: a record not
        # holding each wanted value verbatim cannot match, and is not parsed.
        if b"\\" not in entry and not all(value in entry for value in self._wanted):
            return False
        columns: dict[str, Any] = mirror_columns(open_record(entry))
        return all(str(columns.get(name)) == value for name, value in self.filters.items())

    def _keep_v2(self, index: int, entry: bytes) -> bool:
        # The tag first: strictly parsed, so an envelope with two tags is refused.
        if "tenant" in self.filters and envelope_tag(entry) != self.tag:
            return False
        if not self.others:
            return True
        if self.reader is None:
            raise InvalidInputError(sorted(self.others)[0].replace("_", "-"),
                                    "v2 leaves are filtered by it through their bodies; "
                                    "this source carries envelopes only")
        body = self.reader.body(index, entry)
        named = _named_environment(body)
        if named is not None and not self._matches(self._environment(index, *named)):
            # Cannot match: its environment, read unambiguously and bound (index, hash,
            # engine), is not the filter's. Only a record that matches is opened whole
            # (its kind's rules, its envelope's time and tag), as v1 records are parsed.
            return False
        leaf = open_leaf(entry, body, self.origin)
        ref = leaf.content.get("environment")
        if ref is None:  # a log-wide leaf (an environment) has no filter columns of its own
            return False
        columns = self._environment(index, int(ref["leaf_index"]), str(ref["leaf_hash"]),
                                    str(leaf.content["engine"]))
        return self._matches(columns)

    def _matches(self, columns: Mapping[str, str | None]) -> bool:
        return all(str(columns.get(name)) == value for name, value in self.others.items())

    def _environment(self, index: int, at: int, leaf_hash: str, engine: str
                     ) -> dict[str, str | None]:
        """The filter columns of the environment leaf ``at`` that record ``index`` names:
        before it, proved included at ``at``, hashing to the named leaf hash, its body
        checked, of the record's own engine (as verify, audit and fsck check it)."""
        assert self.reader is not None
        if not 0 <= at < index:
            raise LeafBindingError(f"leaf {index} names environment leaf {at}, which is "
                                   "not before it")
        known = self._environments.get(at)
        if known is None:
            entry = self.reader.proved_leaf(at)
            leaf = open_leaf(entry, self.reader.body(at, entry), self.origin)
            if leaf.kind != ENVIRONMENT_KIND:
                raise LeafBindingError(f"leaf {index} names leaf {at} as its environment; "
                                       f"it is a {leaf.kind}")
            known = (merkle.hash_leaf(entry).hex(), str(leaf.content["engine"]),
                     environment_columns(leaf.content))
            self._environments[at] = known
        if known[0] != leaf_hash:
            raise LeafBindingError(f"leaf {index} names environment leaf {at} with another "
                                   "leaf hash than the tree holds there")
        if known[1] != engine:
            raise LeafBindingError(f"leaf {index} ran on {engine}, the environment leaf {at} "
                                   f"it names is {known[1]}'s")
        return known[2]


# The members a record's environment is read from before the record is opened.
_NAMED = (b'"environment"', b'"engine"', b'"leaf_index"', b'"leaf_hash"')


def _named_environment(body: bytes) -> tuple[int, str, str] | None:
    """(leaf index, leaf hash, engine) of the environment a record body names, read with
    one meaning, or None when the body names none in that shape (the caller then opens
    the leaf strictly and says what is wrong). Without a backslash every key is spelled
    out in the bytes, so each of these occurring once means no duplicate could give the
    record another environment, and the quick parser reads them as the strict one would;
    otherwise the strict parser reads the body."""
    try:
        if b"\\" not in body and all(body.count(key) == 1 for key in _NAMED):
            content = json.loads(body.decode("utf-8"))
        else:
            content = parse_strict(body)
    except (ValueError, RecursionError):  # CanonicalFormError is a ValueError
        return None
    ref = content.get("environment") if isinstance(content, dict) else None
    if not isinstance(ref, dict):
        return None
    at, leaf_hash, engine = ref.get("leaf_index"), ref.get("leaf_hash"), content.get("engine")
    if type(at) is not int or not isinstance(leaf_hash, str) or not isinstance(engine, str):
        return None
    return at, leaf_hash, engine


def prove_filtered_window(log: Any, since: datetime, until: datetime,
                          filters: Mapping[str, str], lag: timedelta = MAX_LAG
                          ) -> tuple[WindowAnswer, list[bytes]]:
    """Prove the window ``[since, until)`` complete in ``log`` (a
    ``ledger.client.tiles.TiledLog`` over a checkpoint the caller verified: pinned key,
    witnesses) and apply ``filters`` (``FILTERS``) to every leaf in it. Returns the
    answer ("complete: every leaf in [a, b) read and checked, N matched") and the leaves
    ``[a, b)``; raises ``WindowError`` (open window, broken lag rule), a
    ``VerificationError`` (a leaf, body or tile that does not check) or
    ``InvalidInputError`` (a filter the log cannot answer)."""
    keep = LeafFilter(filters, log.checkpoint.origin, log)
    start, end = log.window_range(since, until, lag)
    entries = log.entries(start, end)
    tags = keep.body_tags()
    if tags is None or tags:
        log.prefetch_bodies(start, end, tags)
    checkpoint: Checkpoint = log.checkpoint
    return check_window(checkpoint, since, until, start, entries, log.nodes.node, keep,
                        lag, read=log.leaves_read(start, end)), entries


def prove_window_from(source: Any, verifier: NoteVerifier, since: datetime, until: datetime,
                      filters: Mapping[str, str], *, witnesses: Sequence[WitnessKey] = (),
                      quorum: int | None = None, origin: str | None = None
                      ) -> tuple[WindowAnswer, list[bytes], str]:
    """The whole check for a caller holding a tile source (``open_tiles(...)``, or
    ``ledger.store.tile_reads.StoreTiles`` inside the service): its checkpoint opened
    with the pinned ``verifier`` (and ``origin``, default the key's name), cosigned by
    ``quorum`` (default all) of ``witnesses`` unless none are given (then the answer's
    third part says "UNWITNESSED"), the window proved and filtered
    (``prove_filtered_window``). Returns (answer, leaves read, how it is vouched for)."""
    from ledger.client.tiles import TiledLog

    note = source.get("checkpoint")
    if note is None:
        raise WindowError("no checkpoint is published there")
    checkpoint = verifier.open_checkpoint(note, origin or verifier.name)
    vouched = "UNWITNESSED"
    if witnesses:
        cosigned = valid_cosigners(note, witnesses)
        if len(cosigned) < (quorum or len(witnesses)):
            raise WindowError(f"checkpoint {checkpoint.size} carries {len(cosigned)} valid "
                              f"cosignatures of the {quorum or len(witnesses)} needed")
        vouched = "witnessed by " + ", ".join(sorted(cosigned))
    answer, entries = prove_filtered_window(TiledLog(source, checkpoint, note), since,
                                            until, filters)
    return answer, entries, vouched
