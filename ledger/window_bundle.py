"""The offline window bundle: every leaf of a window's range, the tiles' nodes around
it and the signed checkpoint, so ``verify`` can prove the window complete with no
network (pure). A leaf dropped from it is named by its index; one re-indexed to hide the
gap changes the root."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from ledger.checkpoint import Checkpoint
from ledger.errors import MalformedProofError
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

    def dumps(self) -> str:
        return json.dumps({
            "format": FORMAT, "checkpoint": self.checkpoint.decode(),
            "since": self.since.isoformat(), "until": self.until.isoformat(),
            "max_lag_s": self.max_lag.total_seconds(), "start": self.start, "end": self.end,
            "entries": [{"leaf_index": i, "leaf": base64.b64encode(e).decode()}
                        for i, e in self.entries],
            "nodes": [{"level": lv, "index": ix, "hash": h.hex()}
                      for (lv, ix), h in sorted(self.nodes.items())],
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
                       timedelta(seconds=float(raw["max_lag_s"])))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise MalformedProofError(f"window bundle: {exc}") from exc


def is_window_bundle(text: str) -> bool:
    return f'"format": "{FORMAT}"' in text[:200]


def check_bundle(bundle: WindowBundle, checkpoint: Checkpoint,
                 keep: Callable[[int, bytes], bool] = lambda index, entry: True
                 ) -> WindowAnswer:
    """Prove the bundle's window complete against ``checkpoint`` (already verified: the
    pinned key, and witnesses as the caller's policy asks)."""
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

    def outside(level: int, idx: int) -> bytes:
        found = bundle.nodes.get((level, idx))
        if found is None:
            raise MalformedProofError(f"the bundle lacks tree node ({level}, {idx})")
        return found

    return check_window(checkpoint, bundle.since, bundle.until, bundle.start,
                        [e for _, e in bundle.entries], outside, keep, bundle.max_lag)
