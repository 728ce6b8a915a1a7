"""Record ids are RFC 9562 UUIDv7 strings, time-ordered."""

from __future__ import annotations

import uuid

from ledger.record import new_record_id


def test_record_ids_are_uuid7_in_uuid_spelling() -> None:
    for now_ms in (0, 1, 1_764_000_000_000, (1 << 48) - 1):
        text = new_record_id(now_ms)
        parsed = uuid.UUID(text)
        assert str(parsed) == text  # the canonical 8-4-4-4-12 lower-case spelling
        assert parsed.version == 7 and parsed.variant == uuid.RFC_4122
        assert parsed.int >> 80 == now_ms


def test_record_ids_sort_by_time_and_differ_within_a_millisecond() -> None:
    ids = [new_record_id(1_764_000_000_000 + ms) for ms in range(50)]
    assert ids == sorted(ids)
    same = {new_record_id(1_764_000_000_000) for _ in range(1000)}
    assert len(same) == 1000


def test_a_batch_of_record_ids_is_uuid7_of_one_moment() -> None:
    from ledger.leaf_base import new_record_ids

    ids = new_record_ids(300, 1_764_000_000_000)
    assert len(set(ids)) == 300
    for text in ids:
        parsed = uuid.UUID(text)
        assert str(parsed) == text and parsed.version == 7
        assert parsed.variant == uuid.RFC_4122 and parsed.int >> 80 == 1_764_000_000_000
    assert new_record_ids(0) == []
