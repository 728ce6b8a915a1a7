"""The storage suite, run on SQLite and on PostgreSQL alike."""

from __future__ import annotations

import asyncio
import stat
import time
from datetime import datetime
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, delete, text, update

from ledger import merkle
from ledger.checkpoint import Checkpoint, NoteSigner
from ledger.errors import DuplicateRecordError, InvalidInputError, RootMismatchError
from ledger.store.fsck import fsck
from ledger.store.integrator import Integrator
from ledger.store.keys import load_or_create_signer
from ledger.store.lease import Lease, lease_for
from ledger.store.migrate import upgrade
from ledger.store.schema import checkpoints, metadata, records
from ledger.store.sql import SqlLedger
from tests.integration.conftest import ORIGIN
from tests.records import make_record


def test_migrations_build_exactly_the_models(empty_url: str) -> None:
    upgrade(empty_url)
    engine = create_engine(empty_url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), metadata)
        size, root = conn.execute(text("SELECT size, root FROM tree_state")).one()
    engine.dispose()
    assert diff == []
    assert (size, bytes(root)) == (0, merkle.EMPTY_ROOT)


def test_upgrade_twice_is_harmless(ledger_url: str) -> None:
    upgrade(ledger_url)


def test_append_prove_and_verify(ledger_url: str, signer: NoteSigner) -> None:
    with SqlLedger(ledger_url) as ledger:
        receipts = [ledger.append(make_record(i)) for i in range(13)]
        assert [r.leaf_index for r in receipts] == list(range(13))
        sealed = ledger.seal_checkpoint(signer, ORIGIN)
        assert sealed is not None and sealed.size == 13
        checkpoint = signer.verifier().open_checkpoint(sealed.note, ORIGIN)
        for receipt in receipts:
            proof = ledger.inclusion_proof(receipt.leaf_index, checkpoint.size)
            merkle.verify_inclusion(receipt.leaf_hash, receipt.leaf_index, checkpoint.size,
                                    proof, checkpoint.root)
        assert ledger.seal_checkpoint(signer, ORIGIN) is None  # nothing new to seal
        row = ledger.get_record(receipts[4].record_id)
        assert row is not None and row.checkpoint_size == 13
        assert merkle.hash_leaf(row.canonical) == receipts[4].leaf_hash


def test_1000_concurrent_appends_from_50_tasks_are_gap_free(ledger_url: str) -> None:
    async def scenario(ledger: SqlLedger) -> list[int]:
        async def task(t: int) -> list[int]:
            return [(await ledger.append_async(make_record(t * 20 + i))).leaf_index
                    for i in range(20)]
        return [i for chunk in await asyncio.gather(*(task(t) for t in range(50)))
                for i in chunk]

    with SqlLedger(ledger_url) as ledger:
        indices = asyncio.run(scenario(ledger))
        assert sorted(indices) == list(range(1000))
        assert ledger.groups_committed < 1000  # appends shared transactions
        leaves = ledger.read_nodes([(0, i) for i in range(1000)])
        size, root = ledger.tree_head()
        assert size == 1000
        assert root == merkle.root_of(leaves[(0, i)] for i in range(1000))


def test_same_record_twice_returns_first_receipt(ledger_url: str) -> None:
    record = make_record(1)
    with SqlLedger(ledger_url) as ledger:
        first = ledger.append(record)
        ledger.append(make_record(2))
        again = ledger.append(record)
        assert again == first
        assert ledger.tree_head()[0] == 2


def test_other_record_under_a_used_id_refused(ledger_url: str) -> None:
    record = make_record(1)
    with SqlLedger(ledger_url) as ledger:
        ledger.append(record)
        impostor = make_record(1, tenant="bank-b")
        forged = type(record).from_body({**impostor.body, "record_id": record.record_id})
        with pytest.raises(DuplicateRecordError, match=record.record_id):
            ledger.append(forged)
        assert ledger.tree_head()[0] == 1


def test_a_batch_appended_together_gets_one_outcome_per_record(ledger_url: str) -> None:
    """One group, one transaction; an impostor inside the batch fails alone."""
    with SqlLedger(ledger_url) as ledger:
        first = make_record(1)
        impostor = type(first).from_body({**make_record(2, tenant="bank-b").body,
                                          "record_id": first.record_id})
        batch = [first, make_record(3), impostor, make_record(4)]
        groups_before = ledger.groups_committed
        outcomes = asyncio.run(ledger.append_many_async(batch))
        assert [o.leaf_index for o in outcomes if not isinstance(o, BaseException)] == [0, 1, 2]
        assert isinstance(outcomes[2], DuplicateRecordError)
        assert first.record_id in str(outcomes[2])
        assert ledger.groups_committed == groups_before + 1
        assert ledger.tree_head()[0] == 3


def test_groups_stay_within_max_group_and_never_split_a_batch(
        ledger_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from concurrent.futures import Future

    from ledger.store import sql

    monkeypatch.setattr(sql, "MAX_GROUP", 5)
    ledger = SqlLedger(ledger_url)
    batches = [[sql._Pending(make_record(10 * b + i)) for i in range(3)] for b in range(3)]
    for batch in batches:  # queued before the writer starts: it finds them all at once
        ledger._queue.put(batch)
    with ledger:
        receipts = [[p.future.result(timeout=60) for p in batch if isinstance(p.future, Future)]
                    for batch in batches]
        assert ledger.groups_committed == 3  # 3 + 3 > 5: each batch opened its own group
    assert [[r.leaf_index for r in batch] for batch in receipts] == \
        [[0, 1, 2], [3, 4, 5], [6, 7, 8]]


def test_restart_continues_the_tree(ledger_url: str, signer: NoteSigner) -> None:
    with SqlLedger(ledger_url) as ledger:
        for i in range(7):
            ledger.append(make_record(i))
        old = ledger.seal_checkpoint(signer, ORIGIN)
    with SqlLedger(ledger_url) as ledger:
        receipts = [ledger.append(make_record(100 + i)) for i in range(6)]
        assert [r.leaf_index for r in receipts] == list(range(7, 13))
        new = ledger.seal_checkpoint(signer, ORIGIN)
        assert old is not None and new is not None
        merkle.verify_consistency(old.size, new.size, ledger.consistency_proof(old.size, new.size),
                                  old.root, new.root)
        assert fsck(ledger, signer.verifier()).ok


def test_log_key_created_0600_and_reloaded(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "log.key"
    first = load_or_create_signer(path, ORIGIN)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = load_or_create_signer(path, ORIGIN)
    assert again.public_key == first.public_key
    with pytest.raises(ValueError, match="expected"):
        load_or_create_signer(path, "another.log")


def _filled(url: str, signer: NoteSigner, n: int = 40) -> None:
    with SqlLedger(url) as ledger:
        for i in range(n):
            ledger.append(make_record(i))
            if i in (9, 24):
                ledger.seal_checkpoint(signer, ORIGIN)
        ledger.seal_checkpoint(signer, ORIGIN)


def _execute(url: str, statement: object) -> None:
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(statement)  # type: ignore[call-overload]
    engine.dispose()


def test_fsck_clean_log(ledger_url: str, signer: NoteSigner) -> None:
    _filled(ledger_url, signer)
    with SqlLedger(ledger_url) as ledger:
        report = fsck(ledger, signer.verifier())
    assert report.ok, report.findings
    assert (report.tree_size, report.records_checked, report.checkpoints_checked) == (40, 40, 3)


def test_edited_byte_in_stored_record_detected(ledger_url: str, signer: NoteSigner) -> None:
    _filled(ledger_url, signer)
    with SqlLedger(ledger_url) as ledger:
        row = ledger.record_at(17)
        assert row is not None
        edited = row.canonical.replace(b'"bank-a"', b'"bank-b"')
        _execute(ledger_url, update(records).where(records.c.leaf_index == 17)
                 .values(canonical=edited))
        report = fsck(ledger, signer.verifier())
        assert [(f.kind, f.where) for f in report.findings] == [
            ("record_altered", f"leaf 17 (record {row.record_id})")]
        checkpoint = signer.verifier().open_checkpoint(ledger.latest_checkpoint().note)  # type: ignore[union-attr]
        with pytest.raises(RootMismatchError):
            merkle.verify_inclusion(merkle.hash_leaf(edited), 17, checkpoint.size,
                                    ledger.inclusion_proof(17, checkpoint.size), checkpoint.root)


def test_mirror_column_edit_detected(ledger_url: str, signer: NoteSigner) -> None:
    _filled(ledger_url, signer)
    _execute(ledger_url, update(records).where(records.c.leaf_index == 3)
             .values(driver_version="999.99"))
    with SqlLedger(ledger_url) as ledger:
        report = fsck(ledger, signer.verifier())
    assert [f.kind for f in report.findings] == ["column_mismatch"]
    assert "driver_version is '999.99'" in report.findings[0].detail


def test_deleted_row_detected(ledger_url: str, signer: NoteSigner) -> None:
    _filled(ledger_url, signer)
    _execute(ledger_url, delete(records).where(records.c.leaf_index == 30))
    with SqlLedger(ledger_url) as ledger:
        report = fsck(ledger, signer.verifier())
    assert [(f.kind, f.where) for f in report.findings] == [("record_missing", "leaf 30")]


def test_replaced_checkpoint_detected(ledger_url: str, signer: NoteSigner) -> None:
    _filled(ledger_url, signer)
    forged = signer.sign_checkpoint(Checkpoint(ORIGIN, 25, bytes(32)))  # right key, wrong root
    _execute(ledger_url, update(checkpoints).where(checkpoints.c.size == 25)
             .values(note=forged, root=bytes(32)))
    with SqlLedger(ledger_url) as ledger:
        report = fsck(ledger, signer.verifier())
    assert [(f.kind, f.where) for f in report.findings] == [
        ("checkpoint_root_mismatch", "checkpoint 25")]


def test_checkpoint_replaced_under_another_key_detected(ledger_url: str,
                                                        signer: NoteSigner) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    _filled(ledger_url, signer)
    with SqlLedger(ledger_url) as ledger:
        stored = ledger.checkpoint(10)
        assert stored is not None
        other = NoteSigner(ORIGIN, Ed25519PrivateKey.generate())
        _execute(ledger_url, update(checkpoints).where(checkpoints.c.size == 10).values(
            note=other.sign_checkpoint(Checkpoint(ORIGIN, 10, stored.root))))
        report = fsck(ledger, signer.verifier())
    assert [(f.kind, f.where) for f in report.findings] == [
        ("checkpoint_signature", "checkpoint 10")]


def test_query_filters_and_cursor_pagination(ledger_url: str) -> None:
    with SqlLedger(ledger_url) as ledger:
        for i in range(30):
            ledger.append(make_record(i, tenant="bank-a" if i % 3 else "bank-b",
                                      driver="550.54.15" if i < 20 else "560.1",
                                      created_at=f"2026-11-{10 + i // 10:02d}T08:00:{i:02d}.000Z"))
        rows, cursor = ledger.mirror.query(tenant="bank-a", limit=7)
        seen = [r.leaf_index for r in rows]
        while cursor:
            rows, cursor = ledger.mirror.query(tenant="bank-a", limit=7, cursor=cursor)
            seen += [r.leaf_index for r in rows]
        assert seen == [i for i in range(30) if i % 3]
        rows, _ = ledger.mirror.query(driver_version="560.1", since=datetime(2026, 11, 12),
                               until=datetime(2026, 11, 13))
        assert [r.leaf_index for r in rows] == list(range(20, 30))
        rows, _ = ledger.mirror.query(since=datetime(2026, 11, 11), until=datetime(2026, 11, 12),
                               accelerator_model="NVIDIA H200", tenant="bank-b")
        assert [r.leaf_index for r in rows] == [12, 15, 18]
        with pytest.raises(InvalidInputError) as info:
            ledger.mirror.query(cursor="garbage")
        assert info.value.field == "cursor"
        with pytest.raises(InvalidInputError) as info:
            ledger.mirror.query(colour="blue")
        assert info.value.field == "colour"


def test_integrator_seals_on_interval(ledger_url: str, signer: NoteSigner) -> None:
    with SqlLedger(ledger_url) as ledger:
        integrator = Integrator(ledger, signer, ORIGIN, interval_s=0.05).start()
        ledger.append(make_record(1))
        deadline = time.monotonic() + 120  # an overall bound, not a speed assumption
        while time.monotonic() < deadline:
            latest = ledger.latest_checkpoint()
            if latest is not None and latest.size == 1:
                break
            time.sleep(0.02)
        integrator.stop()
        assert ledger.latest_checkpoint() is not None
        assert ledger.latest_checkpoint().size == 1  # type: ignore[union-attr]


def test_a_late_owner_of_a_taken_over_claim_neither_stores_nor_releases(
        ledger_url: str) -> None:
    from ledger.store.receipts import ReceiptStore
    from ledger.store.sql import make_engine

    engine = make_engine(ledger_url)
    store = ReceiptStore(engine)
    mark = b"m" * 32
    assert store.claim("bank-a", "k", mark, stale_after_s=600, owner="a") is None
    # Still fresh: B is handed A's claim to wait on, not the key.
    held = store.claim("bank-a", "k", mark, stale_after_s=600, owner="b")
    assert held is not None and held.owner == "a" and held.state == "pending"
    # Stale: any claim made before now + 1 s is stale, so B takes it over without any
    # waiting on the clock.
    assert store.claim("bank-a", "k", mark, stale_after_s=-1, owner="b") is None
    # A finishes late: neither its answer nor its failure touches B's claim.
    assert store.complete("bank-a", "k", "a", {"body": {"from": "a"}, "headers": {}}) is False
    assert store.release("bank-a", "k", "a") is False
    kept = store.get("bank-a", "k")
    assert kept is not None and (kept.owner, kept.state, kept.response) == ("b", "pending", None)
    assert store.complete("bank-a", "k", "b", {"body": {"from": "b"}, "headers": {}}) is True
    done = store.get("bank-a", "k")
    assert done is not None and done.state == "done" and done.response is not None
    assert done.response["body"] == {"from": "b"}
    # A done answer is kept: neither a late release nor a second completion replaces it.
    assert store.release("bank-a", "k", "a") is False
    assert store.release("bank-a", "k", "b") is False
    assert store.complete("bank-a", "k", "b", {"body": {"from": "b2"}, "headers": {}}) is False
    again = store.get("bank-a", "k")
    assert again is not None and again.response == done.response
    # The owner of a pending claim releases it: a retry may generate.
    assert store.claim("bank-a", "k2", mark, stale_after_s=600, owner="c") is None
    assert store.release("bank-a", "k2", "c") is True and store.get("bank-a", "k2") is None
    engine.dispose()


def test_an_idempotent_request_cancelled_from_outside_keeps_its_key(ledger_url: str) -> None:
    """Cancelled (the process going away), it cannot know whether its record will commit:
    the key stays claimed rather than letting a retry make a second record at once."""
    from inference_wrapper.server.idempotency import Idempotency
    from ledger.store.receipts import ReceiptStore
    from ledger.store.sql import make_engine

    engine = make_engine(ledger_url)
    store = ReceiptStore(engine)
    idempotency = Idempotency(store, timeout_s=60)

    async def scenario() -> None:
        assert store.claim("bank-a", "k", b"m" * 32, stale_after_s=600, owner="a") is None
        started = asyncio.Event()

        async def work() -> tuple[dict[str, object], dict[str, str]]:
            started.set()
            await asyncio.Event().wait()  # in the model, say, when the process stops
            raise AssertionError("unreachable")

        task = asyncio.get_running_loop().create_task(
            idempotency._run("bank-a", "k", "a", work))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    held = store.get("bank-a", "k")
    assert held is not None and held.state == "pending" and held.owner == "a"
    engine.dispose()


class _CountingLease:
    """The real lease, with each tick's call counted (the loop renews it every tick)."""

    def __init__(self, inner: Lease) -> None:
        self.inner, self.calls = inner, 0

    def try_acquire(self) -> bool:
        self.calls += 1
        return self.inner.try_acquire()

    def release(self) -> None:
        self.inner.release()

    @property
    def held(self) -> bool:
        return self.inner.held


def test_integrator_seals_first_one_interval_after_start(
        ledger_url: str, signer: NoteSigner, monkeypatch: pytest.MonkeyPatch) -> None:
    """An hour's interval means no seal in the first seconds, however long ago the
    machine booted (monotonic time is read as far past any interval here). Before, the
    first tick sealed on a machine up for over an interval and not on a younger one, so a
    test rolling back a checkpoint raced a seal only on freshly booted machines."""
    import types

    from ledger.store import integrator as module

    booted_long_ago = types.SimpleNamespace(monotonic=lambda: time.monotonic() + 10**6)
    monkeypatch.setattr(module, "time", booted_long_ago)
    with SqlLedger(ledger_url) as ledger:
        ledger.append(make_record(1))
        lease = _CountingLease(lease_for(ledger))
        integrator = Integrator(ledger, signer, ORIGIN, interval_s=3600, lease=lease)
        integrator._tick_s = 0.01
        integrator.start()
        deadline = time.monotonic() + 120  # an overall bound, not a speed assumption
        while lease.calls < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert lease.calls >= 3
        assert ledger.latest_checkpoint() is None  # ticks went by, no interval did
        integrator.stop()  # stopping seals what was appended
        assert ledger.latest_checkpoint().size == 1  # type: ignore[union-attr]
