"""``log fsck`` and ``audit`` over a large SQLite log, through the CLI as an auditor runs them.

    .venv/bin/python bench/bench_fsck_audit.py [--records 1000000] [--db PATH] [--reuse]

Builds the log as the service writes it (issue 20's target is on v2 records), unless
``--reuse`` finds one at ``--db``: the tiny model's ``environment/v1`` leaf, then
``audit-record/v2`` leaves sealed by the serving code (``AuditedGenerator.seal``, batches
of 32 over a few generated batches, fresh ids and salts each time) and appended through
the real writer (``SqlLedger``, groups of 4096, synchronous=NORMAL: the build is not the
measurement), one checkpoint sealed at the end and anchored locally. Then it runs
``audit-ledger log fsck`` and ``audit-ledger audit`` over the whole log in child
processes and prints the wall time of each, rows/s, and the command to repeat it.
Wall times on a shared machine are noisy: run it under ``nice``, and compare code side by
side with ``--against OTHER_CHECKOUT`` (both run alternately on the same log; medians).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from inference_wrapper.audit.generator import AuditedGenerator, LogBinding
from inference_wrapper.engine.model import load_model
from inference_wrapper.engine.params import GenerationParams
from inference_wrapper.engine.tiny import build_tiny_model
from ledger.anchor.local import LocalAnchor
from ledger.checkpoint import NoteSigner
from ledger.leaves.record_v2 import EnvironmentRef
from ledger.store.keys import encode_signer_key
from ledger.store.migrate import upgrade
from ledger.store.sql import SqlLedger

ORIGIN = "bench.audit-ledger/log"
ROOT = Path(__file__).resolve().parent.parent
CHUNK = 4096
BATCH = 32
PROMPTS = ("Summarise the credit exposure of the retail portfolio:",
           "List three risks of the proposed loan:", "Translate to French: good morning",
           "Is this transaction suspicious? Amount 9,900 EUR, new payee, 03:12 UTC.")


def build(url: str, count: int, key_path: Path) -> None:
    upgrade(url)
    private = Ed25519PrivateKey.generate()
    signer = NoteSigner(ORIGIN, private)
    key_path.write_text(encode_signer_key(ORIGIN, private))
    torch.set_num_threads(1)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, \
            SqlLedger(url, sqlite_synchronous="NORMAL") as ledger:
        manifest = build_tiny_model(Path(tmp) / "tiny")
        generator = AuditedGenerator(load_model(Path(tmp) / "tiny", manifest=manifest))
        params = GenerationParams(max_new_tokens=24)
        results = [generator.run_batch([
            generator.prepare(f"{PROMPTS[(b + i) % len(PROMPTS)]} ({b}.{i})", params,
                              f"tenant-{i % 4}") for i in range(BATCH)]) for b in range(8)]
        ledger.create_log_meta(ORIGIN, signer.verifier().encode())
        environment = generator.environment_leaf()
        receipt = ledger.append(environment)
        log = LogBinding(ORIGIN)
        log.bind(generator.environment(),
                 EnvironmentRef(receipt.leaf_index, environment.leaf_hash))
        wanted = count - 1  # the environment leaf is the first entry

        async def fill() -> None:
            written, turn = 0, 0
            while written < wanted:
                leaves = []
                while len(leaves) < min(CHUNK, wanted - written):
                    leaves.extend(o.record for o in generator.seal(results[turn % 8], log))
                    turn += 1
                leaves = leaves[:wanted - written]
                outcomes = await ledger.append_many_async(leaves)
                failed = [o for o in outcomes if isinstance(o, BaseException)]
                assert not failed, failed[:1]
                written += len(leaves)
                if written % (CHUNK * 25) < len(leaves):
                    print(f"  built {written + 1:,} entries", file=sys.stderr)

        asyncio.run(fill())
        sealed = ledger.seal_checkpoint(signer, ORIGIN)
        assert sealed is not None and sealed.size == count
        LocalAnchor(ledger, signer.verifier(), ORIGIN).anchor(sealed.note)
    print(f"built {count:,} entries in {time.perf_counter() - started:.0f} s", file=sys.stderr)


def timed_cpu(command: list[str], code: Path = ROOT) -> tuple[float, float, str]:
    """Wall time, CPU time (user + system: less swayed by other work on the machine)
    and output of ``command`` run with the code of the checkout ``code``."""
    env = dict(os.environ, PYTHONPATH=str(code))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, cwd=code, env=env, capture_output=True, text=True,
                          check=False)
    elapsed = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n"
                         f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return elapsed, cpu, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--db", type=Path, default=Path("/tmp/bench_fsck_audit.db"))
    parser.add_argument("--reuse", action="store_true",
                        help="use the database at --db if it is there")
    parser.add_argument("--build-only", action="store_true", help="build the log and stop")
    parser.add_argument("--against", type=Path,
                        help="another checkout (the code before a change): both are timed "
                             "on the same log, alternately, and compared")
    parser.add_argument("--rounds", type=int, default=3,
                        help="with --against: runs of each, the median is compared")
    args = parser.parse_args()
    url = f"sqlite:///{args.db}"
    key_path = args.db.with_suffix(".key")
    if not (args.reuse and args.db.exists()):
        for stale in (args.db, Path(f"{args.db}-wal"), Path(f"{args.db}-shm")):
            stale.unlink(missing_ok=True)
        build(url, args.records, key_path)
    if args.build_only:
        return
    with SqlLedger(url) as ledger:
        size, _ = ledger.tree_head()
    from ledger.store.keys import decode_signer_key

    verifier_key = decode_signer_key(key_path.read_text()).verifier().encode()
    cli = [sys.executable, "-m", "audit_cli.main"]
    fsck_command = [*cli, "log", "--db", url, "--log-key", verifier_key, "fsck"]
    audit_command = [*cli, "audit", "--db", url, "--from", "2000-01-01", "--to",
                     "2100-01-01", "--log-key", verifier_key]
    stored = args.db.stat().st_size
    print(f"SQLite log of {size:,} records ({stored / size:,.0f} bytes per record on disk); "
          f"load {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    if args.against is not None:
        compare(args.against, size, fsck_command, audit_command, args.rounds)
    else:
        fsck_s, fsck_cpu, _ = timed_cpu(fsck_command)
        audit_s, audit_cpu, said = timed_cpu(audit_command)
        assert said.startswith("COMPLETE"), said[:300]
        print(f"log fsck: {fsck_s:6.1f} s ({size / fsck_s:,.0f} rows/s), CPU {fsck_cpu:.1f} s "
              f"({size / fsck_cpu:,.0f} rows/s)")
        print(f"audit:    {audit_s:6.1f} s ({size / audit_s:,.0f} rows/s), CPU {audit_cpu:.1f} s "
              f"({size / audit_cpu:,.0f} rows/s); load {os.getloadavg()[0]:.1f}")
    print("repeat with: PYTHONPATH=. .venv/bin/python bench/bench_fsck_audit.py "
          f"--records {size} --db {args.db} --reuse"
          + (f" --against {args.against} --rounds {args.rounds}" if args.against else ""))


def compare(other: Path, size: int, fsck_command: list[str], audit_command: list[str],
            rounds: int) -> None:
    """Each command with the other checkout's code and this one's, alternately (so both
    see the same load), ``rounds`` times; the medians and their ratio."""
    for name, command in (("log fsck", fsck_command), ("audit", audit_command)):
        walls: dict[Path, list[float]] = {other: [], ROOT: []}
        cpus: dict[Path, list[float]] = {other: [], ROOT: []}
        for _ in range(rounds):
            for code in (other, ROOT):
                elapsed, cpu, said = timed_cpu(command, code)
                assert name != "audit" or said.startswith("COMPLETE"), said[:300]
                walls[code].append(elapsed)
                cpus[code].append(cpu)
        for what, times in (("wall", walls), ("CPU", cpus)):
            before, after = (statistics.median(times[code]) for code in (other, ROOT))
            print(f"{name:9s} {what:4s} before {before:6.1f} s ({size / before:,.0f} rows/s), "
                  f"after {after:6.1f} s ({size / after:,.0f} rows/s): {before / after:.2f}x "
                  f"(median of {rounds}; load {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
