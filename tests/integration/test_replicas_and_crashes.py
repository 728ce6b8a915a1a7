"""Several writer processes on one log, and writers killed with SIGKILL under load."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ledger import merkle
from ledger.store.fsck import fsck
from ledger.store.integrator import Integrator
from ledger.store.keys import load_or_create_signer
from ledger.store.lease import PostgresLease
from ledger.store.migrate import upgrade
from ledger.store.sql import SqlLedger
from tests.integration.conftest import ORIGIN

ROOT = Path(__file__).resolve().parents[2]


def _writer(
    url: str, key: Path, count: int, tasks: int, forever: bool = False
) -> subprocess.Popen[str]:
    args = [sys.executable, "-m", "tests.integration.writer_proc", url, str(key), str(count),
            str(tasks)] + (["--forever"] if forever else [])
    return subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))


def _acks(output: str) -> dict[str, tuple[int, bytes]]:
    acks = {}
    for line in output.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0] == "ack":
            acks[parts[1]] = (int(parts[2]), bytes.fromhex(parts[3]))
    return acks


def test_two_processes_share_one_postgres_log(make_pg_database, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url = make_pg_database()
    upgrade(url)
    key = tmp_path / "log.key"
    load_or_create_signer(key, ORIGIN)
    procs = [_writer(url, key, 500, 25) for _ in range(2)]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outputs]
    acks = _acks(outputs[0][0]) | _acks(outputs[1][0])
    assert sorted(index for index, _ in acks.values()) == list(range(1000))
    signer = load_or_create_signer(key, ORIGIN)
    with SqlLedger(url) as ledger:
        # Both replicas serve proofs from the shared tree.
        latest = ledger.latest_checkpoint()
        assert latest is not None and latest.size == 1000
        for index, leaf in list(acks.values())[::97]:
            merkle.verify_inclusion(leaf, index, 1000, ledger.inclusion_proof(index, 1000),
                                    latest.root)
        assert fsck(ledger, signer.verifier()).ok


def test_exactly_one_postgres_replica_integrates(make_pg_database, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url = make_pg_database()
    upgrade(url)
    signer = load_or_create_signer(tmp_path / "log.key", ORIGIN)
    with SqlLedger(url) as a, SqlLedger(url) as b:
        first = Integrator(a, signer, ORIGIN, lease=PostgresLease(a))
        second = Integrator(b, signer, ORIGIN, lease=PostgresLease(b))
        assert [first.is_leader, second.is_leader] == [True, False]
        first.lease.release()
        assert second.is_leader and not first.is_leader
        second.lease.release()


def _crash_rounds(url: str, key: Path, rounds: int) -> None:
    rng = random.Random(7)
    signer = load_or_create_signer(key, ORIGIN)
    verifier = signer.verifier()
    acknowledged: dict[str, tuple[int, bytes]] = {}
    seen_checkpoints: list[tuple[int, bytes]] = []
    for _ in range(rounds):
        proc = _writer(url, key, 0, 20, forever=True)
        lines: list[str] = []
        reader = threading.Thread(target=lines.extend, args=(proc.stdout,), daemon=True)
        reader.start()
        deadline = time.monotonic() + 60
        while not lines and time.monotonic() < deadline:  # kill only once it is under load
            time.sleep(0.01)
        time.sleep(rng.uniform(0.1, 1.0))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        reader.join()
        round_acks = _acks("".join(lines))
        assert round_acks, proc.stderr.read()[-2000:] if proc.stderr else ""
        acknowledged |= round_acks
        with SqlLedger(url) as ledger:
            stored = {r.record_id: (r.leaf_index, merkle.hash_leaf(r.canonical))
                      for r in ledger.iter_records()}
            lost = {k: v for k, v in acknowledged.items() if stored.get(k) != v}
            assert not lost, f"{len(lost)} acknowledged appends lost or moved"
            report = fsck(ledger, verifier)
            assert report.ok, report.findings[:3]
            # The restarted service seals first (the writer may have died before its
            # integrator's first tick); every earlier checkpoint must be a prefix.
            ledger.seal_checkpoint(signer, ORIGIN)
            latest = ledger.latest_checkpoint()
            assert latest is not None
            for old_size, old_root in seen_checkpoints:
                merkle.verify_consistency(old_size, latest.size,
                                          ledger.consistency_proof(old_size, latest.size),
                                          old_root, latest.root)
            seen_checkpoints.extend((c.size, c.root) for c in ledger.iter_checkpoints())


def test_sigkill_under_load_loses_no_acknowledged_append_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'crash.db'}"
    upgrade(url)
    _crash_rounds(url, tmp_path / "log.key", rounds=10)


@pytest.mark.parametrize("rounds", [10])
def test_sigkill_under_load_loses_no_acknowledged_append_postgres(
    make_pg_database, tmp_path: Path, rounds: int  # type: ignore[no-untyped-def]
) -> None:
    url = make_pg_database()
    upgrade(url)
    _crash_rounds(url, tmp_path / "log.key", rounds=rounds)
