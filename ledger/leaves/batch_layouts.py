"""Reading many ``audit-record/v2`` bodies of one log quickly, by the rules of one.

The rows of a batch share every leaf of their bodies but the row's own (``ROW_LEAVES``),
which is why the writer encodes them through one ``Layout`` per batch. A reader can use
the same fact backwards: once one body of a batch has passed every rule (canonical bytes,
``validate_record_v2``), another body of that batch that is exactly that layout filled
with its own row leaves (compared byte for byte) is canonical too, holds the same leaves
elsewhere, and so passes the full rules exactly when its row leaves pass
``validate_row_leaves``. That replaces a full re-encoding and the full rules by a few
leaf encodings per row. Anything else (no layout yet, other bytes, a rule broken) is
left to the full path, which also says what is wrong.
"""

from __future__ import annotations

import json
from typing import Any

from ledger.canonical import MAX_JSON_DEPTH, Layout, LayoutError
from ledger.errors import CanonicalFormError
from ledger.leaves.record_v2 import OPTIONAL_LEAVES, ROW_LEAVES, validate_row_leaves

# Layouts kept at once: rows of concurrent batches interleave, but only a few at a time.
_KEPT = 512
# Each optional row leaf: its path, the member holding it and its own name.
_OPTIONAL = tuple((path, *path.split(".")) for path in OPTIONAL_LEAVES)
_DECODER = json.JSONDecoder()  # no hooks: the layout's byte comparison is the strict rule

_Key = tuple[str, tuple[str, ...]]


class BatchLayouts:
    """The layouts of the batches seen so far, for ``open_leaf``'s bulk readers
    (``log fsck`` and ``audit``). One per scan; not shared between threads."""

    def __init__(self) -> None:
        self._layouts: dict[_Key, Layout] = {}
        self._firsts: dict[_Key, tuple[dict[str, Any], bytes]] = {}

    def read(self, body: bytes) -> dict[str, Any] | None:
        """``body``'s content if a layout of its batch proves it canonical and valid
        (every rule of ``validate_record_v2``); None when none decides."""
        if body.count(b"{") + body.count(b"[") > MAX_JSON_DEPTH:
            return None  # never nested that deep; the full path says why
        try:
            content = _DECODER.decode(body.decode("utf-8"))
            if type(content) is not dict:
                return None
            layout = self._layouts.get(_key(content))
            if layout is None or layout.fill(content) != body:
                return None
            validate_row_leaves(content)
        except (ValueError, LookupError, TypeError):  # CanonicalFormError is a ValueError
            return None
        return content

    def learn(self, content: dict[str, Any], body: bytes) -> None:
        """A body that has just passed the full rules (``body``: the bytes it was read
        from). Its batch's layout is compiled at the second such body, as the writer
        does, so a batch of one costs nothing."""
        try:
            key = _key(content)
        except (LookupError, TypeError):
            return
        if key in self._layouts:
            return
        first = self._firsts.pop(key, None)
        if first is None:
            _keep(self._firsts, key, (content, body))
            return
        try:
            layout = Layout(first[0], [*ROW_LEAVES, *key[1]])
            if layout.fill(first[0]) != first[1]:  # only canonical bytes make a template
                return
        except (LayoutError, CanonicalFormError, LookupError, TypeError):
            return
        _keep(self._layouts, key, layout)


def _key(content: Any) -> _Key:
    """A body's batch and which optional row leaves it holds (a layout per combination)."""
    present = tuple(path for path, holder, name in _OPTIONAL
                    if name in content.get(holder, ()))
    return str(content["batch"]["id"]), present


def _keep(kept: dict[_Key, Any], key: _Key, value: Any) -> None:
    if len(kept) >= _KEPT:
        del kept[next(iter(kept))]  # the oldest: its batch has most likely ended
    kept[key] = value
