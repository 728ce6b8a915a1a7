"""The SQL writer on SQLite and PostgreSQL refuses, before it has an index, a leaf its
tiles could never publish (decision 0061) or one the lag rule refuses: the tree, the
mirror and fsck stay as if it had never been sent, and its batch's others go on."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from ledger.checkpoint import NoteSigner
from ledger.errors import InvalidInputError, LeafTooLargeError
from ledger.leaf_base import new_record_id
from ledger.leaves.envelope import Leaf
from ledger.record import AuditRecord, build_record
from ledger.store.fsck import fsck
from ledger.store.sql import SqlLedger
from tests.integration.conftest import ORIGIN
from tests.unit.test_append_size_guard import small_erasure, unpublishable_erasure


def _record(created_at: str) -> AuditRecord:
    return build_record(tenant="bank-a", model={"name": "tiny"}, hardware={}, software={},
                        data={"input_commitment": "sha256:" + "0" * 64,
                              "output_commitment": "sha256:" + "1" * 64},
                        timings_ms={"forward": 1.0}, created_at=created_at,
                        record_id=new_record_id())


def _rows(ledger: SqlLedger) -> int:
    return sum(1 for _ in ledger.iter_records())


def _refused_leaves_leave_no_trace(ledger: SqlLedger, signer: NoteSigner,
                                   refused: Leaf | AuditRecord, good: Leaf | AuditRecord,
                                   error: type[Exception]) -> None:
    size, root = ledger.tree_head()
    with pytest.raises(error):
        ledger.append(refused)
    assert ledger.tree_head() == (size, root) and ledger.get_record(refused.record_id) is None
    # Refused inside a batch (one writer group): the other leaf takes the next index.
    outcomes = asyncio.run(ledger.append_many_async([refused, good]))
    assert isinstance(outcomes[0], error)
    assert not isinstance(outcomes[1], BaseException) and outcomes[1].leaf_index == size
    assert ledger.tree_head()[0] == size + 1 == _rows(ledger)
    assert ledger.leaf_hash(size) == good.leaf_hash
    ledger.seal_checkpoint(signer, ORIGIN)
    report = fsck(ledger, signer.verifier())
    assert report.ok, report


def test_a_leaf_tiles_cannot_publish_is_refused_before_it_is_written(
        ledger_url: str, signer: NoteSigner) -> None:
    with SqlLedger(ledger_url).start() as ledger:
        ledger.append(small_erasure(ORIGIN))
        _refused_leaves_leave_no_trace(ledger, signer, unpublishable_erasure(ORIGIN),
                                       small_erasure(ORIGIN),
                                       LeafTooLargeError)


def test_a_leaf_the_lag_rule_refuses_leaves_no_leaf_in_the_tree(
        ledger_url: str, signer: NoteSigner) -> None:
    with SqlLedger(ledger_url, max_created_lag=timedelta(seconds=60)).start() as ledger:
        ledger.append(_record("2026-12-06T09:00:00.000Z"))
        _refused_leaves_leave_no_trace(ledger, signer, _record("2026-12-06T08:00:00.000Z"),
                                       _record("2026-12-06T09:00:01.000Z"), InvalidInputError)
