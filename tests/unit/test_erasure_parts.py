"""How a large erasure is cut into leaves (decision 0061): every part's body fits a tile
bundle entry even with every member at its limit, and an erasure that fits in one leaf
keeps the exact leaf it always had."""

from __future__ import annotations

from ledger.content_records import MAX_LEGAL_BASIS_CHARS
from ledger.leaf_base import new_record_ids
from ledger.leaves.content_leaves import (
    RECORDS_PER_ERASURE_LEAF,
    build_erasure,
    erasure_parts,
)
from ledger.tiles import MAX_ENTRY_BYTES

WIDE = "\U0001F600"  # printable, and 4 UTF-8 bytes: the most a character costs a body
CREATED = "2026-12-06T09:00:00.000Z"


def test_parts_are_sorted_unique_and_at_most_the_per_leaf_count() -> None:
    ids = new_record_ids(2 * RECORDS_PER_ERASURE_LEAF + 1)
    parts = erasure_parts([*reversed(ids), ids[0]])
    assert [len(p) for p in parts] == [RECORDS_PER_ERASURE_LEAF, RECORDS_PER_ERASURE_LEAF, 1]
    assert sum(parts, []) == sorted(ids)
    assert erasure_parts([]) == []


def test_an_erasure_that_fits_one_leaf_keeps_its_exact_leaf() -> None:
    ids = new_record_ids(RECORDS_PER_ERASURE_LEAF)
    (part,) = erasure_parts(reversed(ids))
    common = {"origin": "o", "tenant": "bank-a", "reason": "expiry", "selector": "expiry",
              "requested_by": "retention-expiry", "leaf_id": ids[0], "created_at": CREATED}
    assert build_erasure(records=part, **common) == build_erasure(records=ids, **common)


def test_the_largest_body_a_part_can_make_fits_a_bundle_entry_with_margin() -> None:
    # Every record id and every text at its limit, every character 4 bytes long.
    ids = [chr(0x1F300 + i) + WIDE * 63 for i in range(RECORDS_PER_ERASURE_LEAF)]
    (part,) = erasure_parts(ids)
    leaf = build_erasure(origin="o" * 300, tenant=WIDE * 128, records=part,
                         reason="cancelled", selector="records", requested_by=WIDE * 128,
                         leaf_id=WIDE * 64, created_at=CREATED,
                         legal_basis=WIDE * MAX_LEGAL_BASIS_CHARS, cancels=WIDE * 64)
    assert len(leaf.body) == 55_547  # the figure decision 0061 gives
    assert len(leaf.body) <= MAX_ENTRY_BYTES * 0.85 and len(leaf.envelope) < 1_000
