"""Ledger throughput and proof latency, side by side in one run.

    .venv/bin/python bench/bench_ledger.py [--records 20000] [--writers 256]
                                           [--proof-entries 1000000]

Prints:
1. durable appends/s of ~1 KB records from many concurrent writers, each awaiting its
   own commit, into SQLite and PostgreSQL (group commit);
2. pymerkle's SqliteTree on the same records: one committed append per record, and one
   bulk append with no per-record durability (the two baselines);
3. median and p99 time to produce and to verify an inclusion proof at --proof-entries,
   with pymerkle's verifier on the same tree size for comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from sqlalchemy import create_engine, insert, text, update

from ledger import merkle
from ledger.record import AuditRecord, build_record
from ledger.store.migrate import upgrade
from ledger.store.schema import tree_nodes, tree_state
from ledger.store.sql import SqlLedger

PG_ADMIN = os.environ.get("AUDIT_LEDGER_TEST_PG",
                          "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


def records(n: int) -> list[AuditRecord]:
    return [build_record(tenant="bank-a", model={"name": "m", "digest": "sha256:" + "a" * 64},
                         hardware={"accelerator": "none"},
                         software={"service": {"git_revision": "x"}},
                         data={"input_commitment": f"sha256:{i:064x}", "pad": "p" * 720},
                         timings_ms={"forward": 1.0}) for i in range(n)]


async def _drive(ledger: SqlLedger, batch: list[AuditRecord], writers: int) -> float:
    queue = iter(batch)

    async def writer() -> None:
        for record in queue:
            await ledger.append_async(record)

    start = time.perf_counter()
    await asyncio.gather(*(writer() for _ in range(writers)))
    return time.perf_counter() - start


def bench_appends(url: str, batch: list[AuditRecord], writers: int,
                  synchronous: str = "FULL") -> tuple[float, int]:
    upgrade(url)
    with SqlLedger(url, sqlite_synchronous=synchronous) as ledger:
        asyncio.run(_drive(ledger, batch[:500], writers))  # warm-up, not counted
        elapsed = asyncio.run(_drive(ledger, batch[500:], writers))
        return (len(batch) - 500) / elapsed, ledger.groups_committed


def pg_database() -> tuple[str, object]:
    name = f"audit_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))

    def drop() -> None:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))

    return PG_ADMIN.rsplit("/", 1)[0] + "/" + name, drop


def bench_pymerkle(tmp: Path, batch: list[AuditRecord], per_record: int) -> tuple[float, float]:
    from pymerkle import SqliteTree

    tree = SqliteTree(str(tmp / "pym1.db"))
    start = time.perf_counter()
    for record in batch[:per_record]:
        tree.append_entry(record.canonical)
    one_by_one = per_record / (time.perf_counter() - start)
    tree.close()
    bulk_tree = SqliteTree(str(tmp / "pym2.db"))
    start = time.perf_counter()
    bulk_tree.append_entries([r.canonical for r in batch])
    bulk = len(batch) / (time.perf_counter() - start)
    bulk_tree.close()
    return one_by_one, bulk


def fill_tree(url: str, n: int) -> None:
    """Write the tree nodes of an n-leaf log directly (proof timing needs no records)."""
    upgrade(url)
    compact = merkle.CompactRange()
    engine = create_engine(url)
    rows: list[dict[str, object]] = []
    with engine.begin() as conn:
        for i in range(n):
            leaf = merkle.hash_leaf(i.to_bytes(8, "big"))
            rows.extend({"level": lv, "idx": ix, "hash": h}
                        for (lv, ix), h in compact.append(leaf))
            if len(rows) > 50_000:
                conn.execute(insert(tree_nodes), rows)
                rows = []
        if rows:
            conn.execute(insert(tree_nodes), rows)
        conn.execute(update(tree_state).values(size=n, root=compact.root()))
    engine.dispose()


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def bench_proofs(url: str, n: int, samples: int = 2000) -> dict[str, float]:
    from pymerkle import InmemoryTree, verify_inclusion

    rng = random.Random(1)
    produce, verify, pym_verify = [], [], []
    with SqlLedger(url) as ledger:
        size, root = ledger.tree_head()
        indices = [rng.randrange(size) for _ in range(samples)]
        proofs = []
        for index in indices:
            start = time.perf_counter()
            proof = ledger.inclusion_proof(index, size)
            produce.append(time.perf_counter() - start)
            proofs.append((index, ledger.leaf_hash(index), proof))
    for index, leaf, proof in proofs:
        start = time.perf_counter()
        merkle.verify_inclusion(leaf, index, size, proof, root)
        verify.append(time.perf_counter() - start)
    # pymerkle's verifier on a proof from a pymerkle tree of the same depth class.
    small = min(n, 1 << 16)
    tree = InmemoryTree(algorithm="sha256")
    for i in range(small):
        tree.append_entry(i.to_bytes(8, "big"))
    pym_root = tree.get_root(small) if hasattr(tree, "get_root") else tree.get_state(small)
    for _ in range(samples // 4):
        i = rng.randrange(1, small + 1)
        pym_proof = tree.prove_inclusion(i, small)
        leaf = tree.get_leaf(i)
        start = time.perf_counter()
        verify_inclusion(leaf, pym_root, pym_proof)
        pym_verify.append(time.perf_counter() - start)
    ms = 1000.0
    return {
        "produce_median_ms": statistics.median(produce) * ms,
        "produce_p99_ms": percentile(produce, 99) * ms,
        "verify_median_ms": statistics.median(verify) * ms,
        "verify_p99_ms": percentile(verify, 99) * ms,
        "pymerkle_verify_median_ms": statistics.median(pym_verify) * ms,
        "pymerkle_tree_size": float(small),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--writers", type=int, default=1024)
    parser.add_argument("--per-record-baseline", type=int, default=2_000)
    parser.add_argument("--proof-entries", type=int, default=1_000_000)
    args = parser.parse_args()
    batch = records(args.records)
    print(f"{args.records} records of {len(batch[0].canonical)} bytes, "
          f"{args.writers} concurrent writers each awaiting its own commit")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        sqlite_rate, sqlite_groups = bench_appends(f"sqlite:///{tmp / 'bench.db'}", batch,
                                                   args.writers)
        normal_rate, normal_groups = bench_appends(f"sqlite:///{tmp / 'normal.db'}", batch,
                                                   args.writers, synchronous="NORMAL")
        pg_url, drop = pg_database()
        try:
            pg_rate, pg_groups = bench_appends(pg_url, batch, args.writers)
        finally:
            drop()  # type: ignore[operator]
        one, bulk = bench_pymerkle(tmp, batch, args.per_record_baseline)
        print(f"  audit-ledger SQLite  (synchronous=FULL) {sqlite_rate:10.0f} appends/s "
              f"({sqlite_groups} group commits)")
        print(f"  audit-ledger SQLite  (synchronous=NORMAL) {normal_rate:8.0f} appends/s "
              f"({normal_groups} group commits)")
        print(f"  audit-ledger PostgreSQL                {pg_rate:10.0f} appends/s "
              f"({pg_groups} group commits)")
        print(f"  pymerkle SqliteTree, commit per record {one:10.0f} appends/s")
        print(f"  pymerkle SqliteTree, bulk, no per-record durability {bulk:10.0f} appends/s")
        print(f"  ratios: SQLite/pymerkle-per-record {sqlite_rate / one:.1f}x, "
              f"SQLite/pymerkle-bulk {sqlite_rate / bulk:.2f}x, PostgreSQL/SQLite "
              f"{pg_rate / sqlite_rate:.2f}x")
        proof_url = f"sqlite:///{tmp / 'proofs.db'}"
        start = time.perf_counter()
        fill_tree(proof_url, args.proof_entries)
        print(f"inclusion proofs at {args.proof_entries} entries (SQLite, tree filled in "
              f"{time.perf_counter() - start:.0f} s):")
        for key, value in bench_proofs(proof_url, args.proof_entries).items():
            print(f"  {key:28} {value:.4f}")


if __name__ == "__main__":
    main()
