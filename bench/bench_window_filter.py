"""A proved window's filters over v2 records: this tree's code against an older one,
side by side in one run.

    .venv/bin/python bench/bench_window_filter.py [--records 20000] [--old REV] [--rounds 3]

Builds a log of v2 leaves through the real writer (two tenants, one leaf every 50 ms, an
environment of model A then, half-way, one of model B: ``tests.mixed_log``), seals one
checkpoint, has a witness cosign it and publishes it to a directory. Then, for each
filter, it runs the proved window behind ``audit-ledger query --prove``
(``prove_filtered_window`` over the directory, timed after the imports) in child
processes, in turn from this tree with ``--paths`` as they were at ``--old`` and from
this tree as it is, and prints the best time of each, their ratio, and that both gave
the same answer. Wall times on a shared machine are noisy: compare the ratio of runs
made in turn.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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
# The last revision before the v2 filter opened only the records that can match, and
# the files that change did.
OLD = "bfca9e1007ed1a8b66f43d6998fbbe86fca7d836"
PATHS = ("ledger/client/proved_window.py", "ledger/client/tiles.py")
CASES = (("tenant", {"tenant": "bank-a"}),
         ("model", {"model_digest": MODEL_B}),
         ("tenant + model", {"tenant": "bank-a", "model_digest": MODEL_B}))


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


# Run in a child from each revision's tree: the proved, filtered window through the
# library, timed after the imports (so each revision's CLI start-up is not measured).
DRIVER = """
import json, sys, time
from datetime import datetime
from ledger.checkpoint import NoteVerifier
from ledger.client.proved_window import prove_filtered_window
from ledger.client.tiles import TiledLog, open_tiles
tiles, key, since, until, filters = sys.argv[1:6]
source = open_tiles(tiles)
note = source.get("checkpoint")
checkpoint = NoteVerifier.decode(key).open_checkpoint(note)
started = time.perf_counter()
answer, _ = prove_filtered_window(TiledLog(source, checkpoint, note),
                                  datetime.fromisoformat(since),
                                  datetime.fromisoformat(until), json.loads(filters))
print(time.perf_counter() - started, answer.summary())
"""


def run_query(tree: Path, args: list[str], env: dict[str, str]) -> tuple[float, str]:
    """One proved window from ``tree``'s code: (seconds, its answer)."""
    done = subprocess.run([sys.executable, "-c", DRIVER, *args], cwd=tree,
                          env=dict(env, PYTHONPATH=str(tree)), capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the window from {tree} failed:\n{done.stderr[-2000:]}")
    seconds, answer = done.stdout.strip().split(" ", 1)
    return float(seconds), answer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--old", default=OLD, help="the revision to compare with")
    parser.add_argument("--paths", nargs="+", default=list(PATHS),
                        help="the files taken from --old (the rest is this tree's, so "
                             "other changes since do not blur the ratio)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each, in turn")
    args = parser.parse_args()
    if args.records < 12_100:  # the lag rule closes the window 6,020 leaves before the end
        parser.error("--records: at least 12,100, so that model B's half reaches the window")
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        old = tmp / "old"
        for package in ("ledger", "audit_cli", "inference_wrapper"):
            shutil.copytree(ROOT / package, old / package,
                            ignore=shutil.ignore_patterns("__pycache__"))
        for path in args.paths:  # only these files as they were at --old
            (old / path).write_bytes(subprocess.run(
                ["git", "-C", str(ROOT), "show", f"{args.old}:{path}"], check=True,
                capture_output=True).stdout)
        print(f"old: this tree with {', '.join(args.paths)} as at {args.old[:12]}")
        signer = NoteSigner(ORIGIN, Ed25519PrivateKey.generate())
        witness = Cosigner("witness.bench", Ed25519PrivateKey.generate())
        started = time.perf_counter()
        build(tmp, args.records, signer, witness)
        print(f"built and published {args.records:,} v2 leaves in "
              f"{time.perf_counter() - started:.1f} s (setup)")
        env = dict(os.environ, AUDIT_LEDGER_HOME=str(tmp / "home"))
        until = BASE + STEP * (args.records - 1) - timedelta(minutes=5, seconds=1)
        window = [str(tmp / "tlog"), signer.verifier().encode(), BASE.isoformat(),
                  until.isoformat()]
        print(f"{'filter':<16}{'old s':>8}{'new s':>8}{'old/new':>9}  answer")
        for what, filters in CASES:
            best = {"old": float("inf"), "new": float("inf")}
            answers = set()
            for _ in range(args.rounds):
                for label, tree in (("old", old), ("new", ROOT)):
                    seconds, answer = run_query(tree, [*window, json.dumps(filters)], env)
                    best[label] = min(best[label], seconds)
                    answers.add(answer)
            if len(answers) != 1:
                raise SystemExit(f"{what}: the two revisions answered differently: {answers}")
            print(f"{what:<16}{best['old']:>8.2f}{best['new']:>8.2f}"
                  f"{best['old'] / best['new']:>9.2f}  {answers.pop()}")
    print(f"load average after: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
