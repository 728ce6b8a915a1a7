"""What auditing every mirror column costs, side by side with the root rebuild alone.

    .venv/bin/python bench/bench_audit.py [--records 20000] [--rounds 3]

Pure, in memory (no database: fetching rows costs the same either way). For synthetic
~1 KB records it times, in alternating rounds over the same rows:
(a) ``ledger.audit.audit_range`` as ``audit`` runs it: root rebuild, time range from the
    bytes, and every typed column recomputed from the bytes and compared;
(b) the root rebuild and time range alone (what ``audit`` did before it checked columns).
Prints rows/s for each and the ratio (a)/(b).
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import datetime

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger import merkle
from ledger.audit import MirrorRow, audit_range, naive_utc
from ledger.checkpoint import Checkpoint, NoteSigner
from ledger.record import build_record, mirror_columns

ORIGIN = "bench.audit-ledger/log"
SINCE, UNTIL = datetime(2000, 1, 1), datetime(2100, 1, 1)


def _rows(count: int) -> list[MirrorRow]:
    rows = []
    for i in range(count):
        record = build_record(
            tenant="bank-a", model={"name": "m", "digest": "sha256:" + "a" * 64},
            hardware={"accelerator": "cuda", "accelerator_model": "NVIDIA H200",
                      "driver_version": "550.54.15"},
            software={"torch": {"version": "2.13.0", "git_version": "c" * 40},
                      "service": {"git_revision": "x" * 40}},
            data={"input_commitment": f"sha256:{i:064x}", "output_commitment":
                  f"sha256:{i + 1:064x}", "pad": "p" * 600},
            timings_ms={"forward": 1.0})
        columns = mirror_columns(record)
        created = naive_utc(columns.pop("created_at"))
        rows.append(MirrorRow(i, columns.pop("record_id"), created, record.canonical, columns))
    return rows


def _root_and_range_only(rows: list[MirrorRow], checkpoint: Checkpoint) -> int:
    compact, in_range = merkle.CompactRange(), 0
    for row in rows:
        compact.append(merkle.hash_leaf(row.canonical))
        moment = naive_utc(json.loads(row.canonical)["created_at"])
        in_range += SINCE <= moment < UNTIL
    assert compact.root() == checkpoint.root
    return in_range


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rows = _rows(args.records)
    signer = NoteSigner(ORIGIN, Ed25519PrivateKey.generate())
    root = merkle.root_of(merkle.hash_leaf(r.canonical) for r in rows)
    checkpoint = signer.verifier().open_checkpoint(
        signer.sign_checkpoint(Checkpoint(ORIGIN, len(rows), root)))
    full, bare = [], []
    for _ in range(args.rounds):
        start = time.perf_counter()
        report = audit_range(rows, checkpoint, SINCE, UNTIL, log_size=len(rows))
        full.append(time.perf_counter() - start)
        assert report.ok and report.in_range == len(rows), report.findings[:3]
        start = time.perf_counter()
        assert _root_and_range_only(rows, checkpoint) == len(rows)
        bare.append(time.perf_counter() - start)
    a, b = min(full), min(bare)
    print(f"{len(rows)} rows, best of {args.rounds} rounds")
    print(f"(a) audit, every column: {len(rows) / a:10,.0f} rows/s ({a * 1e6 / len(rows):.1f} "
          "us per row)")
    print(f"(b) root + range only:   {len(rows) / b:10,.0f} rows/s ({b * 1e6 / len(rows):.1f} "
          "us per row)")
    print(f"(a)/(b) time ratio: {a / b:.2f}")


if __name__ == "__main__":
    main()
