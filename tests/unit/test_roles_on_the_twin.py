"""Floors above the store take a role, not the SQL ledger (decision 0042): the same code
runs on the in-memory twin. The cases here are the ones the SQL suites also run."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from inference_wrapper.server.journal import WatchedJournal
from inference_wrapper.server.replica import last_seal
from ledger import merkle, tiles
from ledger.anchor.local import LocalAnchor
from ledger.anchor.worker import AnchorWorker
from ledger.checkpoint import Checkpoint, NoteSigner
from ledger.client.database import DatabaseSource
from ledger.cosignature import Cosigner
from ledger.errors import DuplicateRecordError, LogIdentityError
from ledger.publish.directory import DirectorySink
from ledger.publish.worker import publish_latest
from ledger.record import AuditRecord
from ledger.store.fsck import fsck
from ledger.store.keys import KEY_PATH_SETTING, load_or_create_signer, open_log_identity
from ledger.store.memory import MemoryLog
from ledger.witness.cosignatures import cosigned_note
from tests.records import make_record

ORIGIN = "twin.example/log"


def test_a_foreign_key_is_refused_by_the_identity_check_on_the_twin(tmp_path: Path) -> None:
    log = MemoryLog()
    foreign = tmp_path / "foreign.key"
    load_or_create_signer(foreign, "someone.else/log")
    identity = open_log_identity(log, key_path=tmp_path / "log.key",
                                 log_name="acme.example/log")
    stored = log.log_meta()
    assert identity.created and stored is not None and stored.origin == identity.origin
    log.append(make_record(0))
    log.seal_checkpoint(identity.signer, identity.origin, sealed_by="r1")
    with pytest.raises(LogIdentityError) as refused:
        open_log_identity(log, key_path=foreign)
    assert refused.value.field == KEY_PATH_SETTING and "does not sign" in str(refused.value)
    age, sealed_by = last_seal(log)
    assert sealed_by == "r1" and age is not None and age >= 0


def test_the_watched_journal_marks_a_failed_batch_on_the_twin() -> None:
    log = MemoryLog()
    journal = WatchedJournal(log, clock=lambda: 100.0)
    first = make_record(1)
    impostor = AuditRecord.from_body({**make_record(2, tenant="bank-b").body,
                                      "record_id": first.record_id})
    outcomes = asyncio.run(journal.append_many_async([first]))
    assert journal.appending() and not isinstance(outcomes[0], BaseException)
    outcomes = asyncio.run(journal.append_many_async([impostor]))
    assert isinstance(outcomes[0], DuplicateRecordError)
    assert not journal.appending() and journal.failures == 1


def _sealed_twin(count: int) -> tuple[MemoryLog, NoteSigner, list[str]]:
    """A twin log of ``count`` records sealed in one checkpoint, its signer and ids."""
    log = MemoryLog()
    signer = NoteSigner(ORIGIN, Ed25519PrivateKey.generate())
    ids = [log.append(make_record(index)).record_id for index in range(count)]
    log.seal_checkpoint(signer, ORIGIN)
    return log, signer, ids


def test_anchoring_evidence_and_fsck_run_on_the_twin() -> None:
    log, signer, ids = _sealed_twin(3)
    verifier = signer.verifier()
    worker = AnchorWorker(log, LocalAnchor(log, verifier, ORIGIN))
    assert worker.status().backlog == 1 and worker.run_once()
    assert not worker.run_once()  # the newest checkpoint is anchored already
    status = worker.status()
    assert (status.anchored_size, status.backlog) == (3, 0)
    source = DatabaseSource(log)
    anchored = log.anchors.get(3)
    assert anchored is not None and source.anchored() == (anchored.note, "local:3")
    evidence = source.record(ids[1])
    assert evidence.anchor_ref == "local:3" and evidence.leaf_index == 1
    report = fsck(log, verifier)
    assert report.ok and (report.records_checked, report.anchors_checked) == (3, 1)


def test_fsck_on_the_twin_reports_a_foreign_anchor_and_stray_cosignatures() -> None:
    log, signer, _ = _sealed_twin(2)
    stranger = NoteSigner(ORIGIN, Ed25519PrivateKey.generate())
    log.anchors.record(2, stranger.sign_checkpoint(Checkpoint(ORIGIN, 2, log.root(2))),
                       "local", "local:2")
    witness = Cosigner("w-a", Ed25519PrivateKey.generate())
    log.cosignatures.store(5, "w-a", witness.cosign(b"body\n", 1), 1)  # no checkpoint 5
    log.cosignatures.store(2, "w-b", "not a signature line", 1)
    found = {(f.kind, f.where) for f in fsck(log, signer.verifier()).findings}
    assert found == {("anchor_signature", "anchor 2 (local:2)"),
                     ("cosignature_orphan", "cosignature of checkpoint 5 by w-a"),
                     ("cosignature_malformed", "cosignature of checkpoint 2 by w-b")}


def test_the_served_note_carries_well_formed_cosignatures_on_the_twin() -> None:
    log, _, _ = _sealed_twin(2)
    latest = log.latest_checkpoint()
    assert latest is not None
    assert cosigned_note(log, latest.size, latest.note) == latest.note  # none stored yet
    log.cosignatures.store(latest.size, "w-b", "not a signature line", 1)
    line = Cosigner("w-a", Ed25519PrivateKey.generate()).cosign(latest.note, 7)
    log.cosignatures.store(latest.size, "w-a", line, 7)
    assert cosigned_note(log, latest.size, latest.note) == latest.note + line.encode()


def test_the_publisher_publishes_the_twin_as_tiles(tmp_path: Path) -> None:
    log, _, _ = _sealed_twin(300)  # one full tile of 256 and a partial one of 44
    sink = DirectorySink(tmp_path)
    assert publish_latest(log, sink) == 300
    latest = log.latest_checkpoint()
    assert latest is not None and sink.get(tiles.CHECKPOINT_PATH) == latest.note
    hashes = tiles.split_tile(sink.get("tile/0/000") or b"", 256)
    hashes += tiles.split_tile(sink.get("tile/0/001.p/44") or b"", 44)

    def nothing_outside(lo: int, hi: int) -> bytes:
        raise AssertionError(f"every leaf was given, yet [{lo}, {hi}) was asked for")

    tiles.check_leaves(300, latest.root, 0, 300, hashes, nothing_outside)  # raises if not
    entries = tiles.decode_bundle(sink.get("tile/entries/000") or b"", 256)
    assert [merkle.hash_leaf(e) for e in entries] == hashes[:256]
