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

The byte comparison is made without parsing the body at all where it can be: each
layout is also kept as a pattern, its shared bytes literal and each row leaf a slot that
matches only the spellings ``encode_leaf`` writes verbatim (a plain ASCII string, a
decimal integer of at most 15 digits, ``true``, ``false``, or a number whose float
spells back to the same bytes). A body matching it is therefore the layout filled with
the values read from its slots, the same bytes the JSON route compares. A body the
pattern does not match (another spelling of a slot, another batch) takes the JSON route.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ledger.canonical import MAX_JSON_DEPTH, Layout, LayoutError, encode_leaf
from ledger.errors import CanonicalFormError
from ledger.leaves.record_v2 import OPTIONAL_LEAVES, ROW_LEAVES, validate_row_leaves

# Layouts kept at once: rows of concurrent batches interleave, but only a few at a time.
_KEPT = 512
# Each optional row leaf: its path, the member holding it and its own name.
_OPTIONAL = tuple((path, *path.split(".")) for path in OPTIONAL_LEAVES)
_DECODER = json.JSONDecoder()  # no hooks: the layout's byte comparison is the strict rule
# Every body starts so (its members sorted); the batch id follows, up to its quote.
_BATCH_PREFIX = b'{"batch":{"id":"'
# A slot, by the type of the template's leaf there: the spellings ``encode_leaf`` writes
# verbatim for a plain string (its text captured), a safe integer, a boolean, or a
# number to be spelled back (``_number``). A row whose leaf has another type there takes
# the JSON route.
_STRING_SLOT = rb'"([ !#-\[\]-~]*)"'
_INTEGER_SLOT = rb"(0|-?[1-9][0-9]{0,14})"
_BOOLEAN_SLOT = rb"(true|false)"
_NUMBER_SLOT = rb"(-?(?:0|[1-9][0-9]{0,14})(?:\.[0-9]+)?)"
_MARK = "slot-mark-{}-in-a-batch-layout"  # printable ASCII: encoded verbatim

_Key = tuple[str, tuple[str, ...]]


class _NotVerbatim(ValueError):
    """A slot's number is not written as ``encode_leaf`` writes its value."""


@dataclass(frozen=True)
class _Pattern:
    """A layout as literal pieces and slots, over its template body (``template``: the
    content of the body it was compiled from). ``regex`` matches any bytes of the
    layout's shape (each piece as that many bytes, each slot by its pattern), capturing
    pieces and slots in turn; ``pieces`` are the layout's own. ``copies``: the objects on
    the slots' way, copied for each row, outer first, each as (its holder's place in
    that list, 0 being the body; its name); ``slots``: each slot's holder place, name and
    decoder, in byte order."""

    regex: re.Pattern[bytes]
    pieces: tuple[bytes, ...]
    template: dict[str, Any]
    copies: tuple[tuple[int, str], ...]
    slots: tuple[tuple[int, str, Callable[[bytes], Any]], ...]

    def read(self, body: bytes) -> dict[str, Any] | None:
        """The content of ``body`` if it is this layout filled with plain slots (not yet
        checked against the row rules); None for any other bytes."""
        found = self.regex.fullmatch(body)
        if found is None:
            return None
        parts = found.groups()
        if parts[0::2] != self.pieces:  # the shape's pieces must be this layout's bytes
            return None
        content = dict(self.template)
        holders = [content]
        for above, name in self.copies:  # the row's own objects, as a parse makes them
            holder = holders[above]
            holder[name] = copy = dict(holder[name])
            holders.append(copy)
        try:
            for (above, name, decode), text in zip(self.slots, parts[1::2], strict=True):
                holders[above][name] = decode(text)
        except _NotVerbatim:
            return None
        return content


class BatchLayouts:
    """The layouts of the batches seen so far, for ``open_leaf``'s bulk readers
    (``log fsck`` and ``audit``). One per scan; not shared between threads."""

    def __init__(self) -> None:
        self._layouts: dict[_Key, Layout] = {}
        self._firsts: dict[_Key, tuple[dict[str, Any], bytes]] = {}
        self._patterns: dict[_Key, tuple[bytes, _Pattern]] = {}  # with its batch id
        self._by_batch: dict[bytes, list[_Key]] = {}  # a batch id's bytes: its patterns

    def read(self, body: bytes) -> dict[str, Any] | None:
        """``body``'s content if a layout of its batch proves it canonical and valid
        (every rule of ``validate_record_v2``); None when none decides."""
        content = self._read_by_pattern(body)
        if content is None:
            content = self._read_by_json(body)
        if content is None:
            return None
        try:
            validate_row_leaves(content)
        except (ValueError, LookupError, TypeError):  # CanonicalFormError is a ValueError
            return None
        return content

    def _read_by_pattern(self, body: bytes) -> dict[str, Any] | None:
        if not body.startswith(_BATCH_PREFIX):
            return None
        batch = body[len(_BATCH_PREFIX):body.find(b'"', len(_BATCH_PREFIX))]
        for key in self._by_batch.get(batch, ()):
            kept = self._patterns.get(key)
            content = kept[1].read(body) if kept is not None else None
            if content is not None:
                return content
        return None

    def _read_by_json(self, body: bytes) -> dict[str, Any] | None:
        if body.count(b"{") + body.count(b"[") > MAX_JSON_DEPTH:
            return None  # never nested that deep; the full path says why
        try:
            content = _DECODER.decode(body.decode("utf-8"))
            if type(content) is not dict:
                return None
            layout = self._layouts.get(_key(content))
            if layout is None or layout.fill(content) != body:
                return None
        except (ValueError, LookupError, TypeError):  # CanonicalFormError is a ValueError
            return None
        return content

    def learn(self, content: dict[str, Any], body: bytes) -> None:
        """A body that has just passed the full rules (``body``: the bytes it was read
        from). Its batch's layout is compiled from it when the body says its batch has
        other rows (``batch.size`` above 1), else at the second such body, as the writer
        does, so a batch of one costs nothing."""
        try:
            key = _key(content)
            many = type(content["batch"]["size"]) is int and content["batch"]["size"] > 1
        except (LookupError, TypeError):
            return
        if key in self._layouts:
            return
        first = self._firsts.pop(key, None)
        if first is None and not many:
            _keep(self._firsts, key, (content, body))
            return
        template, template_body = first or (content, body)
        paths = [*ROW_LEAVES, *key[1]]
        try:
            layout = Layout(template, paths)
            if layout.fill(template) != template_body:  # only canonical bytes make one
                return
        except (LayoutError, CanonicalFormError, LookupError, TypeError):
            return
        _keep(self._layouts, key, layout)
        pattern = _compile(layout, template, paths)
        if pattern is not None and template_body.startswith(_BATCH_PREFIX):
            batch = template_body[len(_BATCH_PREFIX):
                                  template_body.find(b'"', len(_BATCH_PREFIX))]
            if len(self._patterns) >= _KEPT:  # the oldest: its batch has most likely ended
                old_batch, _ = self._patterns.pop(next(iter(self._patterns)))
                self._by_batch.pop(old_batch, None)
            self._patterns[key] = (batch, pattern)
            self._by_batch.setdefault(batch, []).append(key)


def _compile(layout: Layout, template: dict[str, Any], paths: Sequence[str]
             ) -> _Pattern | None:
    """``layout`` as a pattern: filled with a mark in every slot, cut at the marks."""
    marked: dict[str, Any] = dict(template)
    places: dict[tuple[str, ...], int] = {(): 0}  # an object on a slot's way: its place
    copies: list[tuple[int, str]] = []
    slot_of: dict[bytes, tuple[bytes, tuple[int, str, Callable[[bytes], Any]]]] = {}
    for number, path in enumerate(paths):
        *parents, name = path.split(".")
        holder, original = marked, template
        for depth, parent in enumerate(parents):
            if tuple(parents[:depth + 1]) not in places:  # the template's stays unmarked
                places[tuple(parents[:depth + 1])] = len(copies) + 1
                copies.append((places[tuple(parents[:depth])], parent))
                holder[parent] = dict(holder[parent])
            holder, original = holder[parent], original[parent]
        kind = type(original[name])
        if kind not in _SLOTS:
            return None
        mark = _MARK.format(number)
        holder[name] = mark
        slot_of[b'"' + mark.encode("ascii") + b'"'] = (
            _SLOTS[kind][0], (places[tuple(parents)], name, _SLOTS[kind][1]))
    filled = layout.fill(marked)
    cuts = sorted((filled.find(quoted), quoted) for quoted in slot_of)
    if any(at < 0 or filled.count(quoted) != 1 for at, quoted in cuts):
        return None
    starts = [0] + [at + len(quoted) for at, quoted in cuts]
    pieces = tuple(filled[start:end] for start, end
                   in zip(starts, [at for at, _ in cuts] + [len(filled)], strict=True))
    kinds = tuple(slot_of[quoted][0] for _, quoted in cuts)
    return _Pattern(_shape(tuple(len(piece) for piece in pieces), kinds), pieces, template,
                    tuple(copies), tuple(slot_of[quoted][1] for _, quoted in cuts))


@functools.lru_cache(maxsize=256)  # batches of one kind share a shape, mostly
def _shape(lengths: tuple[int, ...], kinds: tuple[bytes, ...]) -> re.Pattern[bytes]:
    """Any bytes of this shape: pieces of these lengths (captured, to be compared) with a
    slot of each kind between them."""
    parts = [b"(.{%d})" % lengths[0]]
    for length, kind in zip(lengths[1:], kinds, strict=True):
        parts += [kind, b"(.{%d})" % length]
    return re.compile(b"".join(parts), re.DOTALL)


def _number(text: bytes) -> Any:
    """The number a float slot spells: an integer as ``int``, else a float whose one
    spelling (``encode_leaf``) it must be, as JSON reads them."""
    if b"." not in text:
        return int(text)
    number = float(text)
    if encode_leaf(number) != text:  # not the one spelling of that float
        raise _NotVerbatim(text)
    return number


_SLOTS: dict[type, tuple[bytes, Callable[[bytes], Any]]] = {
    str: (_STRING_SLOT, bytes.decode),  # the captured text is ASCII
    int: (_INTEGER_SLOT, int),
    bool: (_BOOLEAN_SLOT, b"true".__eq__),
    float: (_NUMBER_SLOT, _number),
}


def _key(content: Any) -> _Key:
    """A body's batch and which optional row leaves it holds (a layout per combination)."""
    present = tuple(path for path, holder, name in _OPTIONAL
                    if name in content.get(holder, ()))
    return str(content["batch"]["id"]), present


def _keep(kept: dict[_Key, Any], key: _Key, value: Any) -> None:
    if len(kept) >= _KEPT:
        del kept[next(iter(kept))]  # the oldest: its batch has most likely ended
    kept[key] = value
