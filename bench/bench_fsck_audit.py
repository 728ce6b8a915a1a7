"""``log fsck`` and ``audit`` over a large SQLite log, through the CLI as an auditor runs them.

    .venv/bin/python bench/bench_fsck_audit.py [--records 1000000] [--db PATH] [--reuse]

Builds the log through the real append path (``SqlLedger``, group commit, one checkpoint
sealed at the end and anchored locally), unless ``--reuse`` finds one at ``--db``; then
runs ``audit-ledger log fsck`` and ``audit-ledger audit`` over the whole log in child
processes and prints the wall time of each, rows/s, and the command to repeat it.
Records are v1 ``audit-record/v1`` of the tiny-model shape (about 1 KB of environment
each), as the issue measured them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger.anchor.local import LocalAnchor
from ledger.checkpoint import NoteSigner
from ledger.store.keys import encode_signer_key
from ledger.store.migrate import upgrade
from ledger.store.sql import SqlLedger
from tests.records import make_record

ORIGIN = "bench.audit-ledger/log"
ROOT = Path(__file__).resolve().parent.parent
CHUNK = 4096


def build(url: str, count: int, key_path: Path) -> None:
    upgrade(url)
    private = Ed25519PrivateKey.generate()
    signer = NoteSigner(ORIGIN, private)
    key_path.write_text(encode_signer_key(ORIGIN, private))
    started = time.perf_counter()
    with SqlLedger(url, sqlite_synchronous="NORMAL") as ledger:
        ledger.create_log_meta(ORIGIN, signer.verifier().encode())

        async def fill() -> None:
            for start in range(0, count, CHUNK):
                records = [make_record(i, padding=100) for i in
                           range(start, min(count, start + CHUNK))]
                outcomes = await ledger.append_many_async(records)
                failed = [o for o in outcomes if isinstance(o, BaseException)]
                assert not failed, failed[:1]
                if start % (CHUNK * 25) == 0:
                    print(f"  built {start + len(records):,} records", file=sys.stderr)

        asyncio.run(fill())
        sealed = ledger.seal_checkpoint(signer, ORIGIN)
        assert sealed is not None and sealed.size == count
        LocalAnchor(ledger, signer.verifier(), ORIGIN).anchor(sealed.note)
    print(f"built {count:,} records in {time.perf_counter() - started:.0f} s", file=sys.stderr)


def timed(command: list[str]) -> tuple[float, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                          check=False)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n"
                         f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return elapsed, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--db", type=Path, default=Path("/tmp/bench_fsck_audit.db"))
    parser.add_argument("--reuse", action="store_true",
                        help="use the database at --db if it is there")
    args = parser.parse_args()
    url = f"sqlite:///{args.db}"
    key_path = args.db.with_suffix(".key")
    if not (args.reuse and args.db.exists()):
        for stale in (args.db, Path(f"{args.db}-wal"), Path(f"{args.db}-shm")):
            stale.unlink(missing_ok=True)
        build(url, args.records, key_path)
    with SqlLedger(url) as ledger:
        size, _ = ledger.tree_head()
    from ledger.store.keys import decode_signer_key

    verifier_key = decode_signer_key(key_path.read_text()).verifier().encode()
    cli = [sys.executable, "-m", "audit_cli.main"]
    fsck_command = [*cli, "log", "--db", url, "--log-key", verifier_key, "fsck"]
    audit_command = [*cli, "audit", "--db", url, "--from", "2000-01-01", "--to",
                     "2100-01-01", "--log-key", verifier_key]
    fsck_s, _ = timed(fsck_command)
    audit_s, said = timed(audit_command)
    assert said.startswith("COMPLETE"), said[:300]
    stored = args.db.stat().st_size
    print(f"SQLite log of {size:,} records ({stored / size:,.0f} bytes per record on disk)")
    print(f"log fsck: {fsck_s:6.1f} s ({size / fsck_s:,.0f} rows/s)")
    print(f"audit:    {audit_s:6.1f} s ({size / audit_s:,.0f} rows/s)")
    print("repeat with: PYTHONPATH=. .venv/bin/python bench/bench_fsck_audit.py "
          f"--records {size} --db {args.db} --reuse")


if __name__ == "__main__":
    main()
