"""The in-memory log refuses a leaf its tiles could never publish (decision 0061): an
erasure body over 65,535 bytes is refused before it has an index, and leaves nothing."""

from __future__ import annotations

import asyncio

import pytest

from ledger.errors import LeafTooLargeError
from ledger.leaf_base import new_record_id, new_record_ids
from ledger.leaves.content_leaves import build_erasure
from ledger.leaves.envelope import Leaf
from ledger.store.memory import MemoryLog
from ledger.tiles import MAX_ENTRY_BYTES, check_entry_sizes

CREATED = "2026-12-06T09:00:00.000Z"


def unpublishable_erasure(origin: str = "o") -> Leaf:
    """What the old vault logged for a busy tenant's day: 1,700 records in one body."""
    return build_erasure(origin=origin, tenant="busy-tenant", records=new_record_ids(1_700),
                         reason="expiry", selector="expiry", requested_by="retention-expiry",
                         leaf_id=new_record_id(), created_at=CREATED)


def small_erasure(origin: str = "o") -> Leaf:
    return build_erasure(origin=origin, tenant="busy-tenant", records=new_record_ids(2),
                         reason="expiry", selector="expiry", requested_by="retention-expiry",
                         leaf_id=new_record_id(), created_at=CREATED)


def test_the_limit_is_the_bundle_entry_length() -> None:
    check_entry_sizes(b"x" * MAX_ENTRY_BYTES, b"y" * MAX_ENTRY_BYTES)
    with pytest.raises(LeafTooLargeError) as caught:
        check_entry_sizes(b"x" * (MAX_ENTRY_BYTES + 1))
    assert (caught.value.part, caught.value.size) == ("entry", MAX_ENTRY_BYTES + 1)


def test_an_unpublishable_leaf_is_refused_and_nothing_is_written() -> None:
    log = MemoryLog()
    log.append(small_erasure())
    size, root = log.tree_head()
    big = unpublishable_erasure()
    assert len(big.body) > MAX_ENTRY_BYTES
    with pytest.raises(LeafTooLargeError) as caught:
        log.append(big)
    assert (caught.value.part, caught.value.size, caught.value.field) == (
        "body", len(big.body), "leaf")
    assert log.tree_head() == (size, root) and log.get_record(big.record_id) is None
    # In a batch, the others are appended as if it had never been there.
    small = small_erasure()
    outcomes = asyncio.run(log.append_many_async([big, small]))
    assert isinstance(outcomes[0], LeafTooLargeError)
    assert not isinstance(outcomes[1], BaseException) and outcomes[1].leaf_index == size
    assert log.tree_head()[0] == size + 1
