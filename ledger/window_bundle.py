"""The offline window bundle: every leaf of a window's range, the tiles' nodes around
it and the signed checkpoint, so ``verify`` can prove the window complete with no
network (pure). A leaf dropped from it is named by its index; one re-indexed to hide the
gap changes the root.

It also carries the v2 bodies the exporting key could read (decision 0049): each is
checked against the envelope of its leaf (digest, kind, time, tenant tag), and the
environment leaves before the range that its records name come with their own
inclusion proofs, so ``verify`` filters by model or driver offline as ``query --prove``
does through the tiles.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from ledger import merkle, tiles
from ledger.checkpoint import Checkpoint
from ledger.errors import MalformedProofError, RootMismatchError, VerificationError
from ledger.leaves.envelope import body_digest, is_envelope, parse_envelope
from ledger.leaves.kinds import open_leaf
from ledger.window import MAX_LAG, WindowAnswer, WindowError, check_window

FORMAT = "audit-ledger/window-bundle/v1"


@dataclass(frozen=True)
class WindowBundle:
    checkpoint: bytes  # the signed note, with its cosignatures
    since: datetime
    until: datetime
    start: int
    end: int  # the leaves [start, end) are all in the bundle
    entries: Sequence[tuple[int, bytes]]  # (leaf index, exact leaf bytes)
    nodes: Mapping[tuple[int, int], bytes]  # the perfect subtrees outside the range
    max_lag: timedelta = MAX_LAG
    # v2 bodies by leaf index: the range's leaves the exporter could read, and ``leaves``'
    bodies: Mapping[int, bytes] = field(default_factory=dict)
    # leaves before the range (environments its records name), proved by ``nodes``
    leaves: Mapping[int, bytes] = field(default_factory=dict)

    def dumps(self) -> str:
        return json.dumps({
            "format": FORMAT, "checkpoint": self.checkpoint.decode(),
            "since": self.since.isoformat(), "until": self.until.isoformat(),
            "max_lag_s": self.max_lag.total_seconds(), "start": self.start, "end": self.end,
            "entries": [{"leaf_index": i, "leaf": base64.b64encode(e).decode()}
                        for i, e in self.entries],
            "nodes": [{"level": lv, "index": ix, "hash": h.hex()}
                      for (lv, ix), h in sorted(self.nodes.items())],
            "leaves": _encoded(self.leaves, "leaf"),
            "bodies": _encoded(self.bodies, "body"),
        }, indent=1)

    @classmethod
    def loads(cls, text: str) -> WindowBundle:
        try:
            raw = json.loads(text)
            if raw.get("format") != FORMAT:
                raise MalformedProofError(f"not a {FORMAT} file")
            return cls(raw["checkpoint"].encode(), datetime.fromisoformat(raw["since"]),
                       datetime.fromisoformat(raw["until"]), int(raw["start"]), int(raw["end"]),
                       [(int(e["leaf_index"]), base64.b64decode(e["leaf"], validate=True))
                        for e in raw["entries"]],
                       {(int(n["level"]), int(n["index"])): bytes.fromhex(n["hash"])
                        for n in raw["nodes"]},
                       timedelta(seconds=float(raw["max_lag_s"])),
                       _decoded(raw.get("bodies", []), "bodies", "body"),
                       _decoded(raw.get("leaves", []), "leaves", "leaf"))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise MalformedProofError(f"window bundle: {exc}") from exc


def _encoded(items: Mapping[int, bytes], name: str) -> list[dict[str, Any]]:
    return [{"leaf_index": i, name: base64.b64encode(data).decode()}
            for i, data in sorted(items.items())]


def _decoded(items: list[dict[str, Any]], section: str, name: str) -> dict[int, bytes]:
    out: dict[int, bytes] = {}
    for item in items:
        index = int(item["leaf_index"])
        if index in out:  # one leaf, one body: a second could only be a substitute
            raise MalformedProofError(f"leaf {index} is given twice in the window bundle's "
                                      f"{section}")
        out[index] = base64.b64decode(item[name], validate=True)
    return out


def is_window_bundle(text: str) -> bool:
    return f'"format": "{FORMAT}"' in text[:200]


class BundleReader:
    """The bundle's bodies and extra leaves for ``ledger.client.proved_window.LeafFilter``
    (its ``BodyReader``), each checked before it is handed out. Leaves of the range are
    trusted only once ``check_window`` has rebuilt the root from them (it has, before it
    calls the filter)."""

    def __init__(self, bundle: WindowBundle, checkpoint: Checkpoint) -> None:
        self.bundle, self.checkpoint = bundle, checkpoint
        self._checked: set[int] = set()

    def node(self, level: int, idx: int) -> bytes:
        """A perfect subtree outside the leaves the bundle carries, from its nodes."""
        found = self.bundle.nodes.get((level, idx))
        if found is None:
            raise MalformedProofError(f"the bundle lacks tree node ({level}, {idx})")
        return found

    def body(self, index: int, entry: bytes) -> bytes:
        body = self.bundle.bodies.get(index)
        if body is None:
            raise MalformedProofError(f"leaf {index}'s body is not in the window bundle "
                                      "(the exporting key may not read it)")
        if index not in self._checked:
            check_body(index, entry, body, self.checkpoint.origin)
            self._checked.add(index)
        return body

    def proved_leaf(self, index: int) -> bytes:
        bundle = self.bundle
        if bundle.start <= index < bundle.end:
            return bundle.entries[index - bundle.start][1]
        entry = bundle.leaves.get(index)
        if entry is None:
            raise MalformedProofError(f"leaf {index}, outside the range [{bundle.start}, "
                                      f"{bundle.end}), is not in the window bundle")
        try:
            tiles.check_leaves(self.checkpoint.size, self.checkpoint.root, index, index + 1,
                               [merkle.hash_leaf(entry)], self.node)
        except RootMismatchError as exc:
            raise WindowError(f"leaf {index} in the window bundle is not the tree's leaf "
                              f"{index}: the root rebuilt from it differs") from exc
        return entry

    def check_all(self) -> None:
        """Every extra leaf proved and every body checked against its envelope, read by
        the filter or not: nothing the bundle holds goes unchecked."""
        bundle = self.bundle
        for index in bundle.leaves:
            if bundle.start <= index < bundle.end:
                raise MalformedProofError(f"leaf {index} is given twice in the window bundle")
            self.proved_leaf(index)
        for index in sorted(bundle.bodies):
            inside = bundle.start <= index < bundle.end
            entry = (bundle.entries[index - bundle.start][1] if inside
                     else bundle.leaves.get(index))
            if entry is None or not is_envelope(entry):
                raise MalformedProofError(f"the window bundle holds a body for leaf {index}, "
                                          "which is not a v2 leaf it carries")
            self.body(index, entry)


def check_body(index: int, envelope: bytes, body: bytes, origin: str) -> None:
    """Raise unless ``body`` is the one leaf ``index``'s envelope commits to: its digest,
    then its kind, time and tenant tag (``open_leaf``), each failure naming the leaf."""
    if parse_envelope(envelope)["body"] != body_digest(body):
        raise MalformedProofError(f"the body of leaf {index} in the window bundle does not "
                                  "hash to its envelope's body digest")
    try:  # the very bytes the envelope commits to, as verify demands (decision 0050)
        open_leaf(envelope, body, origin, strict=True)
    except VerificationError as exc:
        raise MalformedProofError(f"the body of leaf {index} in the window bundle does not "
                                  f"match its envelope: {exc}") from exc


def check_bundle(bundle: WindowBundle, checkpoint: Checkpoint,
                 keep: Callable[[int, bytes], bool] = lambda index, entry: True,
                 reader: BundleReader | None = None) -> WindowAnswer:
    """Prove the bundle's window complete against ``checkpoint`` (already verified: the
    pinned key, and witnesses as the caller's policy asks), then check every extra leaf
    and body it holds (through ``reader``, the one ``keep`` reads bodies with, if any)."""
    if bundle.max_lag != MAX_LAG:
        raise WindowError(f"the bundle assumes a max lag of {bundle.max_lag}; this "
                          f"verifier's rule is {MAX_LAG}")
    for expected, (index, _) in enumerate(bundle.entries, start=bundle.start):
        if index != expected:
            raise WindowError(f"leaf {expected} is missing from the window bundle (the "
                              f"next leaf given is {index})")
    given = bundle.start + len(bundle.entries)
    if given < bundle.end:
        raise WindowError(f"leaf {given} is missing from the window bundle (it names the "
                          f"leaves [{bundle.start}, {bundle.end}))")
    if given > bundle.end:
        raise WindowError(f"the window bundle holds leaves beyond its range "
                          f"[{bundle.start}, {bundle.end})")
    reader = reader or BundleReader(bundle, checkpoint)
    answer = check_window(checkpoint, bundle.since, bundle.until, bundle.start,
                          [e for _, e in bundle.entries], reader.node, keep, bundle.max_lag)
    reader.check_all()
    return answer
