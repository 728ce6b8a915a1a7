"""Offline verification of many records from one bundle: records/s and per-record latency.

    .venv/bin/python bench/bench_verify.py [--records 10000]

Builds a log of synthetic ~1 KB records in a temporary SQLite ledger, exports one bundle,
then verifies every entry with the same code path as ``audit-ledger verify --bundle``
(checks 1-4; no disclosure; check 4 on one witness cosignature on the bundle's checkpoint,
as a bundle served by a witnessed log carries it).
Targets: >= 10,000 records/s, median <= 1 ms per record.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger.anchor.local import LocalAnchor
from ledger.bundle import Bundle
from ledger.checkpoint import NoteSigner
from ledger.client.exporter import export_from_log
from ledger.cosignature import Cosigner, add_cosignatures
from ledger.record import build_record
from ledger.store.migrate import upgrade
from ledger.store.sql import SqlLedger
from ledger.verify import TrustPolicy, verify_record

ORIGIN = "bench.audit-ledger/log"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=10_000)
    args = parser.parse_args()
    signer = NoteSigner(ORIGIN, Ed25519PrivateKey.generate())
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        upgrade(url)
        with SqlLedger(url, sqlite_synchronous="NORMAL") as ledger:
            futures = [ledger.submit(build_record(
                tenant="bank-a", model={"name": "m", "digest": "sha256:" + "a" * 64},
                hardware={"accelerator": "none"}, software={"service": {"git_revision": "x"}},
                data={"input_commitment": f"sha256:{i:064x}", "pad": "p" * 700},
                timings_ms={"forward": 1.0})) for i in range(args.records)]
            for future in futures:
                future.result()
            sealed = ledger.seal_checkpoint(signer, ORIGIN)
            assert sealed is not None
            LocalAnchor(ledger, signer.verifier(), ORIGIN).anchor(sealed.note)
        bundle_path = Path(tmp) / "bundle.json"
        with SqlLedger(url) as ledger:
            exported = export_from_log(ledger, None, None, {})
        witness = Cosigner("bench-witness.example", Ed25519PrivateKey.generate())
        body = exported.checkpoint.split(b"\n\n")[0] + b"\n"
        exported = replace(exported, checkpoint=add_cosignatures(
            exported.checkpoint, [witness.cosign(body, int(time.time()))]))
        bundle_path.write_text(exported.dumps())
        size_mb = bundle_path.stat().st_size / 1e6

        start = time.perf_counter()
        bundle = Bundle.loads(bundle_path.read_bytes())
        load_s = time.perf_counter() - start
        verifier = signer.verifier()
        policy = TrustPolicy(witnesses=[witness.witness_key])
        per_record = []
        start = time.perf_counter()
        ok = 0
        for evidence in bundle.evidence():
            t0 = time.perf_counter()
            verdict = verify_record(evidence, verifier, ORIGIN, policy=policy)
            per_record.append(time.perf_counter() - t0)
            ok += verdict.ok
        total_s = time.perf_counter() - start
    assert ok == args.records, f"only {ok} verified"
    print(f"{args.records} records, bundle {size_mb:.1f} MB, parsed in {load_s:.2f} s")
    print(f"  verified {ok} records in {total_s:.2f} s = {ok / total_s:,.0f} records/s "
          f"(target >= 10,000/s)")
    print(f"  per record: median {statistics.median(per_record) * 1e3:.3f} ms, "
          f"p99 {sorted(per_record)[int(len(per_record) * 0.99)] * 1e3:.3f} ms "
          f"(target median <= 1 ms)")


if __name__ == "__main__":
    main()
