"""``BatchLayouts``: a record opened through its batch's layout (``log fsck`` and
``audit``) comes out exactly as the full rules open it: the same leaf, or the same error.

Each body below is a later row of a batch whose layout is already compiled, changed in
one way and given an envelope that names it (so the change is the body's only fault),
then opened with and without the layouts, strict (fsck) and not (audit).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ledger.leaves import commitments
from ledger.leaves.batch_layouts import BatchLayouts
from ledger.leaves.envelope import Leaf, envelope_bytes, tenant_tag
from ledger.leaves.kinds import open_leaf
from ledger.leaves.record_v2 import RECORD_KIND, EnvironmentRef, RowFacts, build_records_v2

ORIGIN = "audit-ledger.test/log"
ROWS = 8
TARGET = 6  # the row changed below: its batch's layout is compiled by then


def _facts(row: int) -> RowFacts:
    salt = bytes([row]) * 32
    return RowFacts(
        tenant=f"tenant-{row % 2}", commitments=commitments.row_commitments(
            input_salt=salt, output_salt=salt, prompt=f"p{row}", input_ids=[row] * (row + 1),
            output="o", output_ids=[1], stop=("x",) if row == 3 else ()),
        input_token_count=row + 1, output_token_count=1, truncated=False,
        finish_reason="length", padding_count=ROWS - row - 1, parse_ms=0.047 + row,
        stream_start_record_id="s-1" if row == 5 else None)


def _batch(batch_id: str = "d" * 32) -> list[Leaf]:
    return build_records_v2(
        origin=ORIGIN, engine="engine-0", environment=EnvironmentRef(0, bytes(32)),
        batch_id=batch_id, padded_length=ROWS, padding_side="left",
        generation={"max_new_tokens": 24, "temperature": 0}, timings_ms={"forward": 12.25},
        rows=[_facts(row) for row in range(ROWS)], created_at="2026-12-02T01:02:03.456Z")


def _outcome(opener: Callable[[], Leaf]) -> tuple[Any, ...]:
    try:
        leaf = opener()
    except Exception as exc:  # noqa: BLE001 - the error itself is what is compared
        return ("refused", type(exc).__name__, str(exc), getattr(exc, "field", None))
    return ("opened", leaf.envelope, leaf.body, leaf.leaf_hash, leaf.kind, dict(leaf.content))


def _warm(leaves: list[Leaf], strict: bool) -> BatchLayouts:
    layouts = BatchLayouts()
    for leaf in leaves[:TARGET]:
        open_leaf(leaf.envelope, leaf.body, ORIGIN, strict=strict, layouts=layouts)
    return layouts


def test_a_batch_opens_through_its_layout_as_through_the_full_rules() -> None:
    leaves = _batch()
    layouts = BatchLayouts()
    decided = 0
    for leaf in leaves:
        decided += layouts.read(leaf.body) is not None
        for strict in (True, False):
            assert _outcome(lambda leaf=leaf, strict=strict: open_leaf(  # type: ignore[misc]
                leaf.envelope, leaf.body, ORIGIN, strict=strict, layouts=layouts)) == \
                _outcome(lambda leaf=leaf, strict=strict: open_leaf(  # type: ignore[misc]
                    leaf.envelope, leaf.body, ORIGIN, strict=strict))
    # The first two rows (and the one with a stream, the only one of its kind) take the
    # full path; every other row is decided by the layout.
    assert decided == ROWS - 3


def _swap(old: bytes, new: bytes) -> Callable[[bytes], bytes]:
    def change(body: bytes) -> bytes:
        assert body.count(old) == 1, (old, body)
        return body.replace(old, new)
    return change


# Each: a change to row TARGET's body (tenant "tenant-0", 7 input tokens, 1 padding).
CHANGES: dict[str, Callable[[bytes], bytes]] = {
    "padding no longer fills the row": _swap(b'"count":1', b'"count":2'),
    "row beyond the batch": _swap(b'"row":6', b'"row":8'),
    "empty tenant": _swap(b'"tenant":"tenant-0"', b'"tenant":""'),
    "malformed commitment": lambda b: b.replace(b'"input":"hmac-sha256:',
                                                b'"input":"hmac-sha256:Z', 1),
    "a count written as a float": _swap(b'"input_token_count":7', b'"input_token_count":7.0'),
    "a parse time with a trailing zero": _swap(b'"parse":6.047', b'"parse":6.0470'),
    "a parse time with an exponent": _swap(b'"parse":6.047', b'"parse":6.047e0'),
    "a count beyond the safe integers": _swap(b'"output_token_count":1',
                                              b'"output_token_count":9007199254740993'),
    "a boolean leaf as a number": _swap(b'"truncated":false', b'"truncated":0'),
    "trailing whitespace": lambda b: b + b" ",
    "a negative parse time": _swap(b'"parse":6.047', b'"parse":-6.047'),
    "an unknown finish reason": _swap(b'"finish_reason":"length"', b'"finish_reason":"eos"'),
    "a space after a colon": _swap(b'"engine":"engine-0"', b'"engine": "engine-0"'),
    "members out of order": lambda b: b'{"engine":"engine-0",' + _swap(
        b',"engine":"engine-0"', b"")(b)[1:],
    "a duplicate member": lambda b: b'{"tenant":"tenant-1",' + b[1:],
    "an escaped letter": _swap(b'"tenant":"tenant-0"', b'"tenant":"tenant\\u002d0"'),
    "an extra member": lambda b: b[:-1] + b',"zzz":1}',
    "another shared leaf, still valid": _swap(b'"max_new_tokens":24', b'"max_new_tokens":25'),
    "a shared leaf broken": _swap(b'"side":"left"', b'"side":"middle"'),
    "another schema": _swap(b'"schema":"audit-record/v2"', b'"schema":"audit-record/v3"'),
    "not UTF-8": _swap(b'"tenant":"tenant-0"', b'"tenant":"tenant-\xff"'),
    "a list, not an object": lambda b: b"[" + b + b"]",
    "nested too deep": lambda b: b[:-1] + b',"zzz":' + b"[" * 70 + b"]" * 70 + b"}",
}


@pytest.mark.parametrize("strict", [True, False], ids=["fsck", "audit"])
@pytest.mark.parametrize("change", list(CHANGES), ids=list(CHANGES))
def test_a_changed_body_gets_the_full_rules_answer(change: str, strict: bool) -> None:
    leaves = _batch()
    target = leaves[TARGET]
    layouts = _warm(leaves, strict)
    assert layouts.read(target.body) is not None  # the unchanged row is the layout's
    body = CHANGES[change](target.body)
    envelope = envelope_bytes(RECORD_KIND, "2026-12-02T01:02:03.456Z",
                              tenant_tag(ORIGIN, "tenant-0"), body)
    with_layouts = _outcome(lambda: open_leaf(envelope, body, ORIGIN, strict=strict,
                                              layouts=layouts))
    assert with_layouts == _outcome(lambda: open_leaf(envelope, body, ORIGIN, strict=strict))
    if change != "another shared leaf, still valid":
        assert layouts.read(body) is None  # never decided by the layout
        if strict:
            assert with_layouts[0] == "refused"


@pytest.mark.parametrize("strict", [True, False], ids=["fsck", "audit"])
def test_an_envelope_that_does_not_name_its_body_is_refused_as_before(strict: bool) -> None:
    leaves = _batch()
    target = leaves[TARGET]
    layouts = _warm(leaves, strict)
    for envelope in (
            envelope_bytes(RECORD_KIND, "2026-12-02T01:02:03.456Z",
                           tenant_tag(ORIGIN, "tenant-1"), target.body),  # another tenant
            envelope_bytes(RECORD_KIND, "2026-12-02T01:02:03.457Z",
                           tenant_tag(ORIGIN, "tenant-0"), target.body),  # another time
            envelope_bytes("audit-report/v2", "2026-12-02T01:02:03.456Z",
                           tenant_tag(ORIGIN, "tenant-0"), target.body),  # another kind
            leaves[TARGET + 1].envelope,  # another body's
            target.envelope.replace(b'","kind"', b'", "kind"')):  # not canonical
        with_layouts = _outcome(lambda e=envelope: open_leaf(  # type: ignore[misc]
            e, target.body, ORIGIN, strict=strict, layouts=layouts))
        assert with_layouts[0] == "refused" or not strict
        assert with_layouts == _outcome(lambda e=envelope: open_leaf(  # type: ignore[misc]
            e, target.body, ORIGIN, strict=strict))


def test_another_batch_is_never_read_through_this_ones_layout() -> None:
    first, second = _batch("d" * 32), _batch("e" * 32)
    layouts = _warm(first, strict=True)
    assert layouts.read(second[TARGET].body) is None
    # and a body of the first batch relabelled as the second's is not the layout's either
    forged = first[TARGET].body.replace(b"d" * 32, b"e" * 32)
    assert layouts.read(forged) is None
