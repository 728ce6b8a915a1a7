"""One contract for every driver of the log's roles (decision 0042): the SQL ledger on
SQLite and on PostgreSQL, and the in-memory twin, given the same leaves, answer the same.

Tree hashes and proofs are checked against the slow RFC 9162 reference
(``tests/merkle_reference``) and ``ledger.merkle``'s verifiers, never against each other.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from ledger import merkle
from ledger.checkpoint import NoteSigner
from ledger.errors import DuplicateRecordError, InvalidInputError
from ledger.leaves.commitments import row_commitments
from ledger.leaves.envelope import Leaf
from ledger.leaves.environment import build_environment
from ledger.leaves.record_v2 import EnvironmentRef, build_record_v2, row_data
from ledger.record import AuditRecord
from ledger.store.identity import IdentityStore
from ledger.store.log_api import (
    Appender,
    CheckpointSealer,
    EvidenceLog,
    LogLeaf,
    LogReader,
    TileNotFoundError,
)
from ledger.store.memory import MemoryLog
from ledger.store.migrate import upgrade
from ledger.store.sql import SqlLedger
from ledger.tiles import TileRef
from tests import merkle_reference
from tests.integration.conftest import ORIGIN
from tests.records import make_record


class Driver:
    """A log under test and a way to open a second reader over the same storage."""

    def __init__(self, log: Any, reopen: Callable[[], Any], close: Callable[[], None]):
        self.log = log
        self.reopen = reopen
        self._close = close

    @property
    def appender(self) -> Appender:
        return self.log  # type: ignore[no-any-return]

    @property
    def reader(self) -> LogReader:
        return self.log  # type: ignore[no-any-return]


@pytest.fixture(params=["sqlite", "postgresql", "memory"])
def driver(request: pytest.FixtureRequest, tmp_path: Path,
           make_pg_database: Callable[[], str]) -> Iterator[Driver]:
    if request.param == "memory":
        twin = MemoryLog()
        yield Driver(twin, lambda: twin, twin.close)
        return
    url = f"sqlite:///{tmp_path / 'ledger.db'}" if request.param == "sqlite" \
        else make_pg_database()
    upgrade(url)
    opened: list[SqlLedger] = []

    def reopen() -> SqlLedger:
        opened.append(SqlLedger(url))
        return opened[-1]

    ledger = SqlLedger(url).start()
    yield Driver(ledger, reopen, ledger.close)
    ledger.close()
    for other in opened:
        other.close()


def _environment() -> LogLeaf:
    return build_environment(
        engine="engine-0", model={"name": "tiny", "digest": "sha256:" + "cd" * 32,
                                  "pinned": True},
        hardware={"accelerator": "cuda", "accelerator_model": "NVIDIA H200",
                  "driver_version": "560.35.03"},
        software={"torch": {"version": "2.6.0", "git_version": "e" * 40},
                  "service": {"git_revision": "f" * 40, "dirty": False}},
        tokenization_contract={"tokenizer_digest": "sha256:" + "01" * 32},
        generation_config_digest="sha256:" + "02" * 32)


def _v2_record(environment_index: int, environment: LogLeaf, row: int) -> LogLeaf:
    salt = bytes(range(32))
    return build_record_v2(
        origin=ORIGIN, tenant="acme", engine="engine-0",
        environment=EnvironmentRef(environment_index, environment.leaf_hash),
        commitments=row_commitments(input_salt=salt, output_salt=salt, prompt=f"p{row}",
                                    input_ids=[1, 2], output="ok", output_ids=[3]),
        data=row_data(input_token_count=2, output_token_count=1, truncated=False,
                      finish_reason="stop", rows=2, padded_length=2, padding_side="left",
                      padding_count=0, generation={"max_new_tokens": 4, "temperature": 0.0}),
        batch={"id": "c" * 32, "size": 2, "row": row}, timings_ms={"forward": 3.0})


def _impostor(record: AuditRecord) -> AuditRecord:
    """Another record under ``record``'s id."""
    return AuditRecord.from_body({**make_record(9, tenant="bank-b").body,
                                  "record_id": record.record_id})


def _mixed_leaves() -> list[LogLeaf]:
    """Five v1 records, an environment leaf (index 5), two v2 records naming it."""
    leaves: list[LogLeaf] = [make_record(i) for i in range(5)]
    environment = _environment()
    leaves.append(environment)
    leaves.extend(_v2_record(5, environment, row) for row in range(2))
    return leaves


def test_hashes_and_proofs_agree_with_the_rfc_reference(driver: Driver) -> None:
    leaves = _mixed_leaves()
    receipts = [driver.appender.append(leaf) for leaf in leaves]
    assert [r.leaf_index for r in receipts] == list(range(len(leaves)))
    entries = [leaf.canonical for leaf in leaves]
    reader = driver.reader
    assert reader.tree_head() == (len(leaves), merkle_reference.mth(entries))
    for size in range(1, len(leaves) + 1):
        root = reader.root(size)
        assert root == merkle_reference.mth(entries[:size])
        for index in range(size):
            proof = reader.inclusion_proof(index, size)
            assert proof == merkle_reference.path(index, entries[:size])
            merkle.verify_inclusion(reader.leaf_hash(index), index, size, proof, root)
        for older in range(1, size):
            proof = reader.consistency_proof(older, size)
            assert proof == merkle_reference.proof(older, entries[:size])
            merkle.verify_consistency(older, size, proof, reader.root(older), root)


def test_an_answered_append_is_seen_by_a_reader_opened_afterwards(driver: Driver) -> None:
    record = make_record(1)
    receipt = driver.appender.submit(record).result(timeout=60)
    fresh: LogReader = driver.reopen()
    assert fresh.tree_head()[0] == 1
    assert fresh.leaf_hash(0) == receipt.leaf_hash == merkle.hash_leaf(record.canonical)
    row = fresh.record_at(0)
    assert row is not None and row.record_id == receipt.record_id
    assert row.canonical == record.canonical


def test_a_retried_append_answers_its_first_receipt_and_a_clash_is_refused(
        driver: Driver) -> None:
    record = make_record(1)
    first = driver.appender.append(record)
    assert driver.appender.append(record) == first
    clash = _impostor(record)
    with pytest.raises(DuplicateRecordError, match=record.record_id):
        driver.appender.append(clash)
    assert driver.reader.tree_head()[0] == 1


def test_a_batch_gets_one_outcome_per_leaf(driver: Driver) -> None:
    first = make_record(3)
    outcomes = asyncio.run(driver.appender.append_many_async(
        [first, _impostor(first), make_record(4)]))
    assert isinstance(outcomes[1], DuplicateRecordError)
    indexes = [o.leaf_index for o in (outcomes[0], outcomes[2]) if not isinstance(o, Exception)]
    assert indexes == [0, 1]
    single = asyncio.run(driver.appender.append_async(make_record(5)))
    assert single.leaf_index == 2
    waited = driver.appender.append_many([make_record(6), _impostor(first), make_record(7)])
    assert isinstance(waited[1], DuplicateRecordError)
    assert [o.leaf_index for o in (waited[0], waited[2]) if not isinstance(o, Exception)] == [
        3, 4]


def test_checkpoints_seal_growth_and_cover_leaves(driver: Driver, signer: NoteSigner) -> None:
    sealer: CheckpointSealer = driver.log
    for leaf in _mixed_leaves()[:5]:
        driver.appender.append(leaf)
    first = sealer.seal_checkpoint(signer, ORIGIN, sealed_by="replica-a")
    assert first is not None and first.size == 5 and first.sealed_by == "replica-a"
    assert sealer.seal_checkpoint(signer, ORIGIN) is None  # nothing new
    for leaf in _mixed_leaves()[5:]:
        driver.appender.append(leaf)
    second = sealer.seal_checkpoint(signer, ORIGIN)
    assert second is not None and second.size == 8
    driver.appender.append(make_record(40))
    reader = driver.reader
    opened = signer.verifier().open_checkpoint(second.note, ORIGIN)
    assert (opened.size, opened.root) == (8, reader.root(8))
    assert reader.latest_checkpoint() == second
    assert reader.checkpoint(5) == first and reader.checkpoint(6) is None
    assert [c.size for c in reader.iter_checkpoints()] == [5, 8]
    covered = [(r.leaf_index, r.checkpoint_size) for r in reader.iter_records()]
    assert covered == [(i, 5) for i in range(5)] + [(i, 8) for i in range(5, 8)] + [(8, None)]


def test_leaf_rows_name_their_environment_and_ranges_are_half_open(driver: Driver) -> None:
    leaves = _mixed_leaves()
    for leaf in leaves:
        driver.appender.append(leaf)
    reader = driver.reader
    v2 = reader.get_record(leaves[6].record_id)
    assert v2 is not None and v2.leaf_index == 6 and v2.environment_index == 5
    assert v2.columns["accelerator_model"] == "NVIDIA H200"  # from its environment
    assert v2.leaf_body != v2.canonical  # a v2 leaf's body, not its envelope
    v1 = reader.record_at(2)
    assert v1 is not None and v1.leaf_body == v1.canonical == leaves[2].canonical
    assert reader.record_at(len(leaves)) is None and reader.get_record("absent") is None
    assert [r.leaf_index for r in reader.iter_records(2, 6, batch=3)] == [2, 3, 4, 5]


def test_sizes_beyond_the_tree_are_refused(driver: Driver) -> None:
    driver.appender.append(make_record(1))
    reader = driver.reader
    for call in (lambda: reader.root(2), lambda: reader.inclusion_proof(0, 2),
                 lambda: reader.consistency_proof(1, 2)):
        with pytest.raises(InvalidInputError) as refused:
            call()
        assert refused.value.field == "tree_size"
    with pytest.raises(InvalidInputError) as refused:
        reader.leaf_hash(1)
    assert refused.value.field == "leaf_index"


def test_the_first_identity_stands(driver: Driver) -> None:
    identity: IdentityStore = driver.log
    assert identity.log_meta() is None
    first = identity.create_log_meta("first.example/log", "key-a")
    again = identity.create_log_meta("second.example/log", "key-b")
    assert again == first and (first.origin, first.verifier_key) == ("first.example/log",
                                                                     "key-a")


def test_anchors_cover_leaves_and_record_once(driver: Driver, signer: NoteSigner) -> None:
    log: EvidenceLog = driver.log
    for leaf in _mixed_leaves()[:6]:
        driver.appender.append(leaf)
    assert log.anchors.latest() is None and log.anchors.unreferenced_below(6) == 6
    first = log.anchors.record(2, b"note-2", "local", "local:2")
    assert log.anchors.record(2, b"other", "fabric", "fabric:x").ref == "local:2"  # stands
    log.anchors.record(5, b"note-5", "local", "local:5")
    assert [(a.size, a.note, a.ref) for a in log.anchors.iter_anchors()] == [
        (2, b"note-2", "local:2"), (5, b"note-5", "local:5")]
    assert log.anchors.get(2) == first and log.anchors.get(3) is None
    latest = log.anchors.latest()
    assert latest is not None and latest.size == 5
    assert log.anchors.unreferenced_below(6) == 1 and log.anchors.unreferenced_below(5) == 0
    # Which anchor covers a leaf follows from the sizes: the first one larger than it.
    assert [r.anchor_ref for r in log.iter_records()] == (
        ["local:2"] * 2 + ["local:5"] * 3 + [None])
    row = log.record_at(4)
    assert row is not None and row.anchor_ref == "local:5"


def test_cosignatures_are_kept_once_per_witness(driver: Driver) -> None:
    log: EvidenceLog = driver.log
    store = log.cosignatures
    assert store.store(7, "w-b", "— w-b AAAA\n", 1) and store.store(7, "w-a", "— w-a BBBB", 2)
    assert not store.store(7, "w-a", "— w-a CCCC", 3)  # the first line stands
    assert store.store(9, "w-a", "— w-a DDDD", 4)
    assert store.lines(7) == ["— w-a BBBB\n", "— w-b AAAA\n"] and store.lines(8) == []
    assert store.cosigners(7) == {"w-a", "w-b"} and store.cosigners(8) == set()
    assert store.latest_size("w-a") == 9 and store.latest_size("w-c") is None
    assert [(c.checkpoint_size, c.witness, c.line) for c in store.iter_cosignatures()] == [
        (7, "w-a", "— w-a BBBB"), (7, "w-b", "— w-b AAAA"), (9, "w-a", "— w-a DDDD")]


def test_tiles_read_the_stored_tree_and_leaves(driver: Driver) -> None:
    leaves = _mixed_leaves()
    for leaf in leaves:
        driver.appender.append(leaf)
    reads = driver.log.tiles
    hashes = reads.hash_tile(TileRef(0, 0, len(leaves)))
    assert hashes == b"".join(merkle.hash_leaf(leaf.canonical) for leaf in leaves)
    assert reads.hash_tile(TileRef(0, 0, 2)) == hashes[:64]
    assert reads.entries(2, 7) == [leaf.canonical for leaf in leaves[2:7]]
    bodies = [body for _, body in reads.leaves(4, 8)]
    assert bodies == [None] + [leaf.body for leaf in leaves[5:8] if isinstance(leaf, Leaf)]
    for call in (lambda: reads.hash_tile(TileRef(0, 0, len(leaves) + 1)),
                 lambda: reads.entries(0, len(leaves) + 1),
                 lambda: reads.leaves(6, len(leaves) + 2)):
        with pytest.raises(TileNotFoundError):
            call()


def test_checkpoints_after_a_size_count_the_anchoring_outbox(driver: Driver,
                                                            signer: NoteSigner) -> None:
    assert driver.log.checkpoints_after(0) == (0, None, 0)
    sealed = []
    for index in range(3):
        driver.appender.append(make_record(index))
        sealed.append(driver.log.seal_checkpoint(signer, ORIGIN))
    count, oldest, newest = driver.log.checkpoints_after(1)
    assert (count, newest) == (2, 3) and oldest == sealed[1].sealed_at
    assert driver.log.checkpoints_after(3) == (0, None, 3)


def test_pg_append_stays_unanswered_while_the_sequencer_is_held(
        make_pg_database: Callable[[], str]) -> None:
    """The future resolves only after the commit: while another session holds the
    sequencer row, the writer waits on it (polled in pg_stat_activity) and the future
    stays pending; it resolves once the row is released."""
    url = make_pg_database()
    upgrade(url)
    blocker = create_engine(url)
    # Polled on its own autocommit session: a transaction sees one snapshot of the view.
    watcher = create_engine(url, isolation_level="AUTOCOMMIT")
    with SqlLedger(url) as ledger, blocker.connect() as conn, watcher.connect() as watch:
        conn.execute(text("SELECT size FROM tree_state WHERE id = 1 FOR UPDATE"))
        future = ledger.submit(make_record(1))
        waiting = 0
        while waiting == 0:  # until the writer is blocked on the row lock
            waiting = watch.execute(text(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND application_name LIKE 'audit-ledger/writer/%'")).scalar_one()
            assert not future.done()
        assert not future.done()
        conn.rollback()  # release the row: the writer commits, then answers
        receipt = future.result(timeout=60)
        assert receipt.leaf_index == 0
    blocker.dispose()
    watcher.dispose()
