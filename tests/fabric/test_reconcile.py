"""The two lost-anchor bugs seen on a real network, reproduced on the peer double, and a
crash after anchoring, before the anchor row is stored:

(a) the commit status is lost after a real commit -> after reconciliation no mirror row
    is without an anchor reference and the recorded tx id and block are the chain's;
(b) resubmitting an anchored checkpoint orders nothing and records the ORIGINAL transaction;
(c) a failure before the anchor row is stored leaves no row covered, and the next
    attempt records the chain's anchor.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from ledger.anchor.fabric import FabricAnchor
from ledger.anchor.local import LocalAnchor
from ledger.anchor.worker import AnchorWorker
from ledger.errors import BackendUnavailableError
from ledger.store.keys import load_or_create_signer
from ledger.store.migrate import upgrade
from ledger.store.sql import SqlLedger
from tests.fabric.anchored_log import AnchoredLog, anchored_log
from tests.fabric.conftest import CHANNEL, gateway_for
from tests.fabric.peer_double import PeerDouble
from tests.records import make_record

ORIGIN = "reconcile-test.audit-ledger/log"


@pytest.fixture()
def setup(peer: PeerDouble, client_identity: Any, tmp_path: Path) -> Iterator[AnchoredLog]:
    with anchored_log(peer, client_identity, tmp_path, ORIGIN) as log:
        yield log


def test_a_commit_status_lost_then_peer_down_is_reconciled_by_the_next_anchor(
        setup: AnchoredLog) -> None:
    """The bug: the peer died while the worker waited on CommitStatus for a checkpoint
    that DID commit; the next anchor used the chain's size as its start, so the rows in
    between kept no reference for good."""
    first = setup.grow(3)
    setup.anchor.anchor(first.note)
    lost = setup.grow(2)  # rows 3 and 4
    setup.double.drop_commit_status, setup.double.down_after_drop = 1, True
    with pytest.raises(BackendUnavailableError):
        setup.anchor.anchor(lost.note)
    committed = setup.double.ledger.blocks[-1]  # it committed all the same ...
    assert [code for _, _, code in committed] == [0]  # VALID
    assert setup.store.get(lost.size) is None  # ... and the service does not know
    assert setup.store.unreferenced_below(lost.size) == 2

    latest = setup.grow(3)  # rows 5..7, while the peer is still down
    setup.double.down = False  # the peer is back
    worker = AnchorWorker(setup.ledger, setup.anchor, store=setup.store)
    worker.prepared = True  # registered above
    assert worker.run_once()

    chain_tx = setup.chain(lost.size)["txId"]
    recorded = setup.store.get(lost.size)
    assert recorded is not None
    assert recorded.ref == f"fabric:{CHANNEL}:{chain_tx}:{setup.block_on_chain(chain_tx)}"
    for index in (3, 4):
        row = setup.ledger.record_at(index)
        assert row is not None and row.anchor_ref == recorded.ref
    newest = setup.store.get(latest.size)
    assert newest is not None and setup.chain(latest.size)["txId"] in newest.ref
    assert setup.store.unreferenced_below(latest.size) == 0
    assert [c["size"] for c in json.loads(setup.gateway.evaluate(
        "GetHistory", ORIGIN, "10", ""))["checkpoints"]] == [3, 5, 8]


def test_a_commit_status_lost_while_the_peer_stays_up_is_recorded_at_once(
        setup: AnchoredLog) -> None:
    setup.anchor.anchor(setup.grow(2).note)
    sealed = setup.grow(4)
    setup.double.drop_commit_status = 1
    recorded = setup.anchor.anchor(sealed.note)  # reconciles within the same call
    assert setup.double.drop_commit_status == 0  # the status really was dropped
    chain_tx = setup.chain(sealed.size)["txId"]
    assert recorded.size == sealed.size
    assert recorded.ref == f"fabric:{CHANNEL}:{chain_tx}:{setup.block_on_chain(chain_tx)}"
    assert setup.store.unreferenced_below(sealed.size) == 0


def test_b_resubmitting_an_anchored_checkpoint_records_the_original_transaction(
        setup: AnchoredLog) -> None:
    """The bug: the chaincode accepted the same checkpoint idempotently, and the service
    recorded the NEW transaction's id (one that stored nothing). Now the chaincode refuses
    it at endorsement (ALREADY_ANCHORED: no transaction is ordered, no block used) and the
    service records the chain's original transaction."""
    first = setup.grow(3)
    setup.anchor.anchor(first.note)
    second = setup.grow(2)
    proof = json.dumps([h.hex() for h in setup.ledger.consistency_proof(3, 5)])
    original, original_block, _ = setup.gateway.submit("AnchorCheckpoint",
                                                       second.note.decode(), proof)
    assert setup.store.get(second.size) is None  # e.g. its commit status was lost
    blocks = len(setup.double.ledger.blocks)

    recorded = setup.anchor.submit(second.note, since=3)  # submitted again, no reconcile

    assert len(setup.double.ledger.blocks) == blocks  # nothing ordered
    assert recorded.ref == f"fabric:{CHANNEL}:{original}:{original_block}"
    assert setup.chain(second.size)["txId"] == original
    row = setup.ledger.record_at(4)
    assert row is not None and row.anchor_ref == recorded.ref


class _CrashOnRecordingTheAnchor:
    """Fail the insert of the anchor row after the anchor was made, as a crash would."""

    def __init__(self, ledger: SqlLedger) -> None:
        self.engine, self.armed, self.fired = ledger.engine, True, 0
        event.listen(self.engine, "before_cursor_execute", self)

    def __call__(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if self.armed and statement.lstrip().upper().startswith("INSERT INTO ANCHORS"):
            self.armed = False
            self.fired += 1
            raise RuntimeError("crash before the anchor row was stored")

    def remove(self) -> None:
        event.remove(self.engine, "before_cursor_execute", self)


def test_c_crash_before_the_fabric_anchor_row_is_stored(setup: AnchoredLog) -> None:
    setup.anchor.anchor(setup.grow(3).note)
    sealed = setup.grow(3)
    crash = _CrashOnRecordingTheAnchor(setup.ledger)
    try:
        with pytest.raises(RuntimeError, match="crash"):
            setup.anchor.anchor(sealed.note)
    finally:
        crash.remove()
    assert crash.fired == 1
    assert setup.chain(sealed.size)["size"] == 6  # on the chain ...
    assert setup.store.get(sealed.size) is None  # ... but neither the anchor row ...
    assert setup.store.unreferenced_below(sealed.size) == 3  # ... so no row is covered
    setup.anchor.anchor(sealed.note)  # the next attempt reconciles: no new transaction
    chain_tx = setup.chain(sealed.size)["txId"]
    recorded = setup.store.get(sealed.size)
    assert recorded is not None and chain_tx in recorded.ref
    assert setup.store.unreferenced_below(sealed.size) == 0


def test_c_crash_before_the_local_anchor_row_is_stored(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'local.db'}"
    upgrade(url)
    signer = load_or_create_signer(tmp_path / "log.key", ORIGIN)
    with SqlLedger(url) as ledger:
        for i in range(4):
            ledger.append(make_record(i))
        sealed = ledger.seal_checkpoint(signer, ORIGIN)
        assert sealed is not None
        anchor = LocalAnchor(ledger, signer.verifier(), ORIGIN)
        crash = _CrashOnRecordingTheAnchor(ledger)
        try:
            with pytest.raises(RuntimeError, match="crash"):
                anchor.anchor(sealed.note)
        finally:
            crash.remove()
        assert anchor.latest() is None and anchor.store.unreferenced_below(4) == 4
        assert anchor.anchor(sealed.note).ref == "local:4"
        assert anchor.store.unreferenced_below(4) == 0


def test_an_mvcc_conflict_with_another_writer_is_reconciled(setup: AnchoredLog) -> None:
    """Another replica's anchor wins the block: ours comes back MVCC_READ_CONFLICT (a
    result code, not an error) and the chain's newer anchor is recorded instead."""
    import threading

    from fabric_protos.gateway import gateway_pb2

    setup.anchor.anchor(setup.grow(2).note)
    ours = setup.grow(3)  # size 5
    theirs = setup.grow(3)  # size 8, sealed by "another replica" of the same log
    proof = json.dumps([h.hex() for h in setup.ledger.consistency_proof(2, 8)])
    tx_id, signed = setup.gateway._proposal("AnchorCheckpoint", [theirs.note.decode(), proof])
    endorsed = setup.gateway._stub.Endorse(gateway_pb2.EndorseRequest(
        transaction_id=tx_id, channel_id=CHANNEL, proposed_transaction=signed))
    envelope = endorsed.prepared_transaction
    envelope.signature = setup.gateway.identity.sign(envelope.payload)
    setup.double.hold()  # both go into one block, theirs first
    setup.gateway._stub.Submit(gateway_pb2.SubmitRequest(
        transaction_id=tx_id, channel_id=CHANNEL, prepared_transaction=envelope))
    outcome: list[object] = []
    thread = threading.Thread(target=lambda: outcome.append(setup.anchor.anchor(ours.note)))
    thread.start()
    deadline = time.monotonic() + 120
    while len(setup.double.pending) < 2:  # our transaction is queued behind theirs
        assert time.monotonic() < deadline and thread.is_alive()
        time.sleep(0.01)
    setup.double.release()
    thread.join(timeout=120)
    block = setup.double.ledger.blocks[-1]
    assert [code for _, _, code in block] == [0, 11]  # VALID, MVCC_READ_CONFLICT
    recorded = outcome[0]
    assert recorded == setup.store.latest() and setup.store.get(ours.size) is None
    assert setup.store.latest().ref == (  # type: ignore[union-attr]
        f"fabric:{CHANNEL}:{tx_id}:{setup.block_on_chain(tx_id)}")
    assert setup.store.unreferenced_below(8) == 0


def test_a_chain_anchor_that_is_not_this_databases_checkpoint_is_not_recorded(
        setup: AnchoredLog, tmp_path: Path) -> None:
    """Signed by the log's key, but this database has another root at that size (a
    restored backup, a fork): reconciliation refuses to record it."""
    from ledger import merkle
    from ledger.checkpoint import Checkpoint
    from ledger.errors import VerificationError

    setup.grow(3)
    signer = load_or_create_signer(tmp_path / "log.key", ORIGIN)
    foreign = signer.sign_checkpoint(Checkpoint(ORIGIN, 3, merkle.hash_leaf(b"elsewhere")))
    setup.gateway.submit("AnchorCheckpoint", foreign.decode(), "[]")
    with pytest.raises(VerificationError, match="not a checkpoint of this log"):
        setup.anchor.reconcile()
    assert setup.store.latest() is None and setup.store.unreferenced_below(3) == 3


def test_two_replicas_registering_at_once_both_succeed(peer: PeerDouble, client_identity: Any,
                                                      tmp_path: Path) -> None:
    """Both InitLogs write the same new key: one is MVCC_READ_CONFLICT in the shared block,
    and its replica submits again (reading the registration, storing nothing)."""
    import threading

    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    upgrade(url)
    signer = load_or_create_signer(tmp_path / "log.key", ORIGIN)
    assert peer.gateway is not None
    with SqlLedger(url) as ledger:
        anchors = [FabricAnchor(ledger, gateway_for(peer, client_identity), signer.verifier(),
                                ORIGIN) for _ in range(2)]
        peer.gateway.hold()
        errors: list[BaseException] = []

        def register(anchor: FabricAnchor) -> None:
            try:
                anchor.register()
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=register, args=(a,)) for a in anchors]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 120
        while len(peer.gateway.pending) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        peer.gateway.release()
        for thread in threads:
            thread.join(timeout=120)
        assert errors == []
        codes = [code for _, _, code in peer.gateway.ledger.blocks[1]]
        assert codes == [0, 11]  # VALID, MVCC_READ_CONFLICT: the retry really happened
        assert len(peer.gateway.ledger.blocks) == 3  # the loser's second InitLog
        for anchor in anchors:
            anchor.gateway.close()


def test_rollback_because_another_replica_anchored_newer_is_reconciled(setup: AnchoredLog) -> None:
    """Between our GetLatest and our submit another replica anchored a NEWER checkpoint:
    the chaincode answers ROLLBACK, and the newer anchor is recorded instead."""
    setup.anchor.anchor(setup.grow(2).note)
    ours = setup.grow(2)  # size 4
    theirs = setup.grow(2)  # size 6
    proof = json.dumps([h.hex() for h in setup.ledger.consistency_proof(2, 6)])
    their_tx, _, _ = setup.gateway.submit("AnchorCheckpoint", theirs.note.decode(), proof)
    reconcile = setup.anchor.reconcile
    calls: list[int] = []

    def stale_first(*args: Any) -> Any:  # our first look predates their anchor
        calls.append(1)
        if len(calls) == 1:
            return 2, setup.store.latest()
        return reconcile(*args)

    setup.anchor.reconcile = stale_first  # type: ignore[method-assign]
    recorded = setup.anchor.anchor(ours.note)
    assert len(calls) == 2  # the ROLLBACK led to a second, real reconciliation
    assert recorded.size == 6 and their_tx in recorded.ref
    assert setup.store.unreferenced_below(6) == 0
