"""The witness service as its own process on loopback, fed a real SQL log's checkpoints,
and the log's witness client storing verified cosignatures."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger.checkpoint import Checkpoint, NoteSigner
from ledger.cosignature import WitnessKey, valid_cosigners
from ledger.errors import BackendUnavailableError
from ledger.store.log_api import StoredCheckpoint
from ledger.store.migrate import upgrade
from ledger.store.sql import SqlLedger
from ledger.witness.client import WitnessClient, WitnessEndpoint, WitnessRejected
from ledger.witness.cosignatures import cosigned_note
from ledger.witness.state import WitnessStore
from ledger.witness_policy import AddCheckpoint, WitnessedState
from tests.integration.conftest import ORIGIN
from tests.integration.witness_proc import ROOT, WitnessProcess, free_port, start_witness
from tests.records import make_record

SIZE_TYPE = "text/x.tlog.size"


class Log:
    """A real SQLite ledger that seals a checkpoint whenever asked to grow."""

    def __init__(self, url: str, signer: NoteSigner, tag: str = "") -> None:
        upgrade(url)
        self.ledger = SqlLedger(url).start()
        self.signer = signer
        self.tag = tag
        self.count = 0

    def grow_to(self, size: int) -> StoredCheckpoint:
        while self.count < size:
            self.ledger.append(make_record(self.count, tenant=f"t{self.tag}"))
            self.count += 1
        sealed = self.ledger.seal_checkpoint(self.signer, ORIGIN)
        assert sealed is not None and sealed.size == size
        return sealed

    def request(self, old: int, checkpoint: StoredCheckpoint) -> bytes:
        proof = self.ledger.consistency_proof(old, checkpoint.size) if old else []
        return AddCheckpoint(old, tuple(proof), checkpoint.note).encode()


@pytest.fixture()
def signer() -> NoteSigner:
    return NoteSigner(ORIGIN, Ed25519PrivateKey.generate())


@pytest.fixture()
def log(tmp_path: Path, signer: NoteSigner) -> Iterator[Log]:
    log = Log(f"sqlite:///{tmp_path / 'log.db'}", signer)
    yield log
    log.ledger.close()


@pytest.fixture()
def witness(tmp_path: Path, signer: NoteSigner) -> Iterator[WitnessProcess]:
    process = start_witness(tmp_path / "witness", [(ORIGIN, signer.verifier().encode())])
    yield process
    process.stop()


def _witness_key(witness: WitnessProcess) -> WitnessKey:
    return WitnessKey.decode(witness.vkey)


def test_cosigns_a_real_logs_checkpoints_and_keeps_its_state(
        log: Log, witness: WitnessProcess, signer: NoteSigner) -> None:
    first = log.grow_to(5)
    status, content_type, body = witness.post(log.request(0, first))
    assert status == 200, body
    assert content_type.startswith("text/plain")
    assert body.startswith("\u2014 witness.test/w ".encode()) and body.endswith(b"\n")
    assert body.count(b"\n") == 1
    assert set(valid_cosigners(first.note + body, [_witness_key(witness)])) == {
        "witness.test/w"}

    second = log.grow_to(9)
    status, _, body = witness.post(log.request(5, second))
    assert status == 200 and valid_cosigners(second.note + body, [_witness_key(witness)])

    # The key file is 0600 and `witness key` prints the same vkey.
    assert (witness.home / "witness.key").stat().st_mode & 0o777 == 0o600
    printed = subprocess.run([sys.executable, "-m", "audit_cli.main", "witness", "--home",
                              str(witness.home), "key"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.strip()
    assert printed == witness.vkey

    # A restarted witness remembers size 9: "old 5" is now a 409 naming 9.
    witness.stop()
    restarted = start_witness(witness.home, [(ORIGIN, signer.verifier().encode())])
    try:
        assert restarted.vkey == witness.vkey
        assert restarted.post(log.request(5, second)) == (409, SIZE_TYPE, b"9\n")
    finally:
        restarted.stop()


def test_refusals_over_http(tmp_path: Path, log: Log, witness: WitnessProcess,
                            signer: NoteSigner) -> None:
    assert witness.post(log.request(0, log.grow_to(8)))[0] == 200
    ten = log.grow_to(10)

    # Wrong old size: 409, body = its size and a newline, Content-Type text/x.tlog.size.
    assert witness.post(log.request(3, ten)) == (409, SIZE_TYPE, b"8\n")
    assert witness.post(log.request(0, ten)) == (409, SIZE_TYPE, b"8\n")

    # Rollback to an older checkpoint of the same log.
    old_note = signer.sign_checkpoint(Checkpoint(ORIGIN, 5, log.ledger.root(5)))
    assert witness.post(AddCheckpoint(8, (), old_note).encode())[0] == 400
    assert witness.post(AddCheckpoint(5, (), old_note).encode()) == (409, SIZE_TYPE, b"8\n")

    # A bad proof: one hash altered.
    proof = log.ledger.consistency_proof(8, 10)
    bad = (bytes([proof[0][0] ^ 0x80]) + proof[0][1:], *proof[1:])
    assert witness.post(AddCheckpoint(8, bad, ten.note).encode())[0] == 422

    # A fork: another log under the same key, at the witnessed size and beyond.
    forked = Log(f"sqlite:///{tmp_path / 'fork.db'}", signer, tag="fork")
    try:
        fork8 = forked.grow_to(8)
        assert fork8.root != log.ledger.root(8)
        status, content_type, _ = witness.post(AddCheckpoint(8, (), fork8.note).encode())
        assert status == 409 and not content_type.startswith(SIZE_TYPE)
        fork12 = forked.grow_to(12)
        assert witness.post(forked.request(8, fork12))[0] == 422
    finally:
        forked.ledger.close()

    # Unknown origin -> 404; a checkpoint signed by another key -> 403; garbage -> 400.
    stranger = NoteSigner("audit-ledger.test/elsewhere", Ed25519PrivateKey.generate())
    unknown = stranger.sign_checkpoint(Checkpoint(stranger.name, 10, ten.root))
    assert witness.post(AddCheckpoint(0, (), unknown).encode())[0] == 404
    impostor = NoteSigner(ORIGIN, Ed25519PrivateKey.generate())
    forged = impostor.sign_checkpoint(Checkpoint(ORIGIN, 10, ten.root))
    assert witness.post(AddCheckpoint(8, tuple(proof), forged).encode())[0] == 403
    assert witness.post(b"old 8\nnot a checkpoint")[0] == 400

    # None of that moved the witness: the honest extension still goes through.
    assert witness.post(log.request(8, ten))[0] == 200


def test_concurrent_add_checkpoint_never_moves_the_state_backwards(
        log: Log, witness: WitnessProcess) -> None:
    checkpoints = [log.grow_to(size) for size in range(1, 25)]
    assert witness.post(log.request(0, checkpoints[0]))[0] == 200
    database = witness.home / "witness.db"
    observed: list[int] = []
    done = threading.Event()

    def watch() -> None:  # the stored size, read straight from the witness's database
        with sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=30) as conn:
            while not done.is_set():
                row = conn.execute("SELECT size FROM witnessed_checkpoints").fetchone()
                observed.append(int(row[0]))

    barrier = threading.Barrier(len(checkpoints) - 1)
    cosigned: list[int] = []

    def submit(checkpoint: StoredCheckpoint) -> None:
        barrier.wait()
        old = 1
        for _ in range(200):  # follow the witness's size until ours is too small
            if old > checkpoint.size:
                return
            status, content_type, body = witness.post(log.request(old, checkpoint))
            if status == 200:
                cosigned.append(checkpoint.size)
                return
            assert (status, content_type) == (409, SIZE_TYPE), body
            old = int(body)
        raise AssertionError("never settled")

    watcher = threading.Thread(target=watch)
    watcher.start()
    threads = [threading.Thread(target=submit, args=(c,)) for c in checkpoints[1:]]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done.set()
    watcher.join()
    assert observed == sorted(observed), "the stored size went backwards"
    final = sqlite3.connect(database).execute("SELECT size FROM witnessed_checkpoints")
    assert final.fetchone()[0] == 24 and 24 in cosigned


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_store_compare_and_swap_has_one_winner(tmp_path: Path, kind: str,
                                               make_pg_database) -> None:  # type: ignore[no-untyped-def]
    url = (f"sqlite:///{tmp_path / 'w.db'}" if kind == "sqlite" else make_pg_database())
    store = WitnessStore(url)
    try:
        root = bytes(32)
        assert store.swap(None, Checkpoint(ORIGIN, 3, root), b"n3")
        assert not store.swap(None, Checkpoint(ORIGIN, 4, root), b"n4")  # row exists
        expected = WitnessedState(3, root)
        barrier = threading.Barrier(8)
        wins: list[int] = []

        def race(size: int) -> None:
            barrier.wait()
            if store.swap(expected, Checkpoint(ORIGIN, size, bytes([size]) * 32), b"n"):
                wins.append(size)

        threads = [threading.Thread(target=race, args=(s,)) for s in range(10, 18)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(wins) == 1
        assert store.get(ORIGIN) == WitnessedState(wins[0], bytes([wins[0]]) * 32)
    finally:
        store.close()


def test_client_handles_409_verifies_and_stores(log: Log, witness: WitnessProcess) -> None:
    endpoint = WitnessEndpoint(witness.url, _witness_key(witness))
    # Someone else (another replica) already brought the witness to size 4.
    assert witness.post(log.request(0, log.grow_to(4)))[0] == 200
    seven = log.grow_to(7)
    client = WitnessClient(log.ledger, [endpoint])
    assert client.run_once() == 1  # "old 0" -> 409 "4" -> retried from 4 -> 200
    lines = log.ledger.cosignatures.lines(7)
    assert len(lines) == 1 and lines[0].startswith("\u2014 witness.test/w ")
    note = cosigned_note(log.ledger, 7, seven.note)
    assert note == seven.note + lines[0].encode()
    assert set(valid_cosigners(note, [endpoint.key])) == {"witness.test/w"}
    assert client.run_once() == 0  # already cosigned: nothing sent

    # A witness whose pinned key differs: its line is not stored.
    wrong = WitnessKey("witness.test/w", Ed25519PrivateKey.generate().public_key()
                       .public_bytes_raw())
    log.grow_to(8)
    with pytest.raises(WitnessRejected, match="no line of the answer is a valid"):
        WitnessClient(log.ledger, [WitnessEndpoint(witness.url, wrong)]).submit(
            WitnessEndpoint(witness.url, wrong), log.ledger.latest_checkpoint())  # type: ignore[arg-type]
    assert log.ledger.cosignatures.lines(8) == []

    # A witness that is down: unreachable, and run_once backs off instead of raising.
    down = WitnessEndpoint(f"http://127.0.0.1:{free_port()}", endpoint.key)
    with pytest.raises(BackendUnavailableError):
        WitnessClient(log.ledger, [down]).submit(down, log.ledger.latest_checkpoint())  # type: ignore[arg-type]
    assert WitnessClient(log.ledger, [down]).run_once() == 0


def test_client_facing_a_witness_ahead_of_its_log_stores_nothing(
        tmp_path: Path, log: Log, witness: WitnessProcess, signer: NoteSigner) -> None:
    """The log's database was restored from a backup taken at size 7 while the witness
    had cosigned size 9: the client cannot get 7 cosigned and must not pretend it did."""
    log.grow_to(7)
    source = sqlite3.connect(tmp_path / "log.db")
    backup = sqlite3.connect(tmp_path / "restored.db")
    source.backup(backup)
    source.close()
    backup.close()
    assert witness.post(log.request(0, log.grow_to(9)))[0] == 200
    restored = SqlLedger(f"sqlite:///{tmp_path / 'restored.db'}").start()
    try:
        latest = restored.latest_checkpoint()
        assert latest is not None and latest.size == 7
        endpoint = WitnessEndpoint(witness.url, _witness_key(witness))
        client = WitnessClient(restored, [endpoint])
        assert client.submit(endpoint, latest) is None  # 409 "9": beyond our 7
        assert client.run_once() == 0
        assert restored.cosignatures.lines(7) == []
    finally:
        restored.close()
