"""A proved window's filters over v2 records: this tree's code against an older one,
side by side in one run.

    .venv/bin/python bench/bench_window_filter.py [--records 20000] [--old REV] [--rounds 3]

Builds a log of v2 leaves through the real writer (two tenants, one leaf every 50 ms, an
environment of model A then, half-way, one of model B: ``tests.mixed_log``), seals one
checkpoint, has a witness cosign it and publishes it to a directory. Then it runs
``audit-ledger query --prove`` over the whole log, for each filter, in child processes
alternately from the older revision (``git archive REV``) and from this tree, and prints
the best wall time of each, their ratio, and that both gave the same answer. Wall times
on a shared machine are noisy: the ratio of runs made in turn is what to compare.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402

from ledger.checkpoint import Checkpoint, NoteSigner  # noqa: E402
from ledger.cosignature import Cosigner  # noqa: E402
from ledger.publish.directory import DirectorySink  # noqa: E402
from ledger.publish.worker import publish_latest  # noqa: E402
from ledger.store.sql import SqlLedger  # noqa: E402
from tests.mixed_log import MODEL_B, append_all, mixed_leaves  # noqa: E402

ORIGIN = "bench.audit-ledger/window-filter"
BASE = datetime(2026, 11, 3, 0, 0, 0)
STEP = timedelta(milliseconds=50)
# The last revision before the v2 filter opened only the records that can match.
OLD = "bfca9e1007ed1a8b66f43d6998fbbe86fca7d836"
CASES = (("tenant", ["--tenant", "bank-a"]),
         ("model", ["--model-digest", MODEL_B]),
         ("tenant + model", ["--tenant", "bank-a", "--model-digest", MODEL_B]))


def build(folder: Path, count: int, signer: NoteSigner, witness: Cosigner) -> None:
    url = f"sqlite:///{folder / 'log.db'}"
    append_all(url, mixed_leaves(ORIGIN, count, lambda i: BASE + STEP * i, v1=0,
                                 switch=count // 2))
    with SqlLedger(url) as ledger:
        ledger.create_log_meta(ORIGIN, signer.verifier().encode())
        sealed = ledger.seal_checkpoint(signer, ORIGIN)
        assert sealed is not None
        line = witness.cosign(Checkpoint.peek(sealed.note).body(), 1_790_000_000)
        ledger.cosignatures.store(count, witness.name, line, 1_790_000_000)
        publish_latest(ledger, DirectorySink(folder / "tlog"))


def run_query(tree: Path, args: list[str], env: dict[str, str], log: Path) -> tuple[float, str]:
    """One ``query --prove`` from ``tree``'s code: (seconds, its last line)."""
    started = time.perf_counter()
    with open(log, "w") as out:
        code = subprocess.call([sys.executable, "-m", "audit_cli.main", *args], cwd=tree,
                               env=dict(env, PYTHONPATH=str(tree)), stdout=out,
                               stderr=subprocess.STDOUT)
    elapsed = time.perf_counter() - started
    text = log.read_text()
    if code != 0:
        raise SystemExit(f"query --prove from {tree} failed ({code}):\n{text[-2000:]}")
    return elapsed, text.strip().splitlines()[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--old", default=OLD, help="the revision to compare with")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each, in turn")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        old = tmp / "old"
        old.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.old, "ledger",
                                  "audit_cli", "inference_wrapper"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
        signer = NoteSigner(ORIGIN, Ed25519PrivateKey.generate())
        witness = Cosigner("witness.bench", Ed25519PrivateKey.generate())
        started = time.perf_counter()
        build(tmp, args.records, signer, witness)
        print(f"built and published {args.records:,} v2 leaves in "
              f"{time.perf_counter() - started:.1f} s (setup)")
        env = dict(os.environ, AUDIT_LEDGER_HOME=str(tmp / "home"), PYTHONUNBUFFERED="1")
        until = BASE + STEP * (args.records - 1) - timedelta(minutes=5, seconds=1)
        query = ["query", "--prove", "--no-state", "--limit", "5", "--tiles",
                 str(tmp / "tlog"), "--since", BASE.isoformat(), "--until",
                 until.isoformat(), "--log-key", signer.verifier().encode(), "--witness",
                 witness.witness_key.encode()]
        print(f"{'filter':<16}{'old s':>8}{'new s':>8}{'old/new':>9}  answer")
        for what, filters in CASES:
            best = {"old": float("inf"), "new": float("inf")}
            answers = set()
            for _ in range(args.rounds):
                for label, tree in (("old", old), ("new", ROOT)):
                    seconds, line = run_query(tree, [*query, *filters], env,
                                              tmp / f"{label}.log")
                    best[label] = min(best[label], seconds)
                    answers.add(line.split(" (signed")[0])
            if len(answers) != 1:
                raise SystemExit(f"{what}: the two revisions answered differently: {answers}")
            print(f"{what:<16}{best['old']:>8.2f}{best['new']:>8.2f}"
                  f"{best['old'] / best['new']:>9.2f}  {answers.pop()}")
    print(f"load average after: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
