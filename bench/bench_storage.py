"""Bytes stored per record, audit-record/v1 against v2, on SQLite and PostgreSQL, in one run
(issue 20: v2 at most 1.4 KB per record on SQLite, v2/v1 at most 0.4 on both).

    .venv/bin/python bench/bench_storage.py [--records 100000] [--pg URL]

The same tiny-model batches (32 rows, real tokenization, generate and decode) are sealed
by the serving code (``AuditedGenerator.seal``) as v1 records and as v2 leaves (after one
environment leaf), and appended through the ledger's durable writer into four fresh
databases. Counted per record: the ``records`` table with all its indexes, the tree
(``tree_nodes``) and, for v2, the ``environments`` table: SQLite's ``dbstat`` pages,
PostgreSQL's ``pg_total_relation_size`` (heap, indexes and TOAST). ``--pg`` is an admin
URL on which scratch databases are created and dropped (default: the test server).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

import torch
from sqlalchemy import create_engine, text

from inference_wrapper.audit.generator import AuditedGenerator, BatchResult, LogBinding
from inference_wrapper.engine.model import load_model
from inference_wrapper.engine.params import GenerationParams
from inference_wrapper.engine.tiny import build_tiny_model
from ledger.leaves.record_v2 import EnvironmentRef
from ledger.store.migrate import upgrade
from ledger.store.sql import PgSessionSettings, SqlLedger

PROMPTS = ["Summarise the credit exposure of the retail portfolio in one sentence:",
           "List three risks of the proposed loan:", "Translate to French: good morning",
           "Is this transaction suspicious? Amount 9,900 EUR, new payee, 03:12 UTC."]
TABLES = ("records", "tree_nodes", "environments")
ORIGIN = "bench.audit-ledger/log"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--batches", type=int, default=16, help="distinct generated batches")
    parser.add_argument("--pg", default=os.environ.get(
        "AUDIT_LEDGER_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        manifest = build_tiny_model(Path(tmp) / "tiny")
        generator = AuditedGenerator(load_model(Path(tmp) / "tiny", manifest=manifest))
        params = GenerationParams(max_new_tokens=24)
        results = [generator.run_batch([
            generator.prepare(f"{PROMPTS[(b + i) % len(PROMPTS)]} ({b}.{i})", params,
                              f"tenant-{i % 4}") for i in range(32)])
            for b in range(args.batches)]
        print(f"{args.records} tiny-model records (batches of 32), bytes per record "
              "(records table + indexes + tree [+ environments])")
        for backend in ("sqlite", "postgresql"):
            sizes = {}
            for version in ("v1", "v2"):
                url, drop = _database(backend, tmp, version, args.pg)
                try:
                    sizes[version] = _fill(url, generator, results, args.records, version)
                finally:
                    drop()
            print(f"{backend:10s}  v1 {sizes['v1']:8.1f} B   v2 {sizes['v2']:8.1f} B   "
                  f"v2/v1 {sizes['v2'] / sizes['v1']:.3f}", flush=True)


def _database(backend: str, tmp: str, version: str, admin_url: str
              ) -> tuple[str, Callable[[], None]]:
    if backend == "sqlite":
        path = Path(tmp) / f"{version}.db"
        return f"sqlite:///{path}", lambda: path.unlink(missing_ok=True)
    name = f"bench_storage_{uuid.uuid4().hex[:10]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))

    def drop() -> None:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    return admin_url.rsplit("/", 1)[0] + "/" + name, drop


def _fill(url: str, generator: AuditedGenerator, results: list[BatchResult], wanted: int,
          version: str) -> float:
    upgrade(url)
    # A shared, loaded machine can stall the writer between two statements for seconds:
    # bytes are measured here, so PostgreSQL's short production bounds are relaxed.
    relaxed = PgSessionSettings(lock_timeout_s=0, writer_idle_in_transaction_s=0,
                                idle_in_transaction_s=0, statement_timeout_s=0)
    with SqlLedger(url, pg=relaxed) as ledger:
        log = None
        if version == "v2":
            environment = generator.environment_leaf()
            receipt = ledger.append(environment)
            log = LogBinding(ORIGIN)
            log.bind(generator.environment(),
                     EnvironmentRef(receipt.leaf_index, environment.leaf_hash))
        written = 0
        while written < wanted:
            for result in results:
                records = [o.record for o in generator.seal(result, log)][: wanted - written]
                for future in [ledger.submit(r) for r in records]:
                    future.result()
                written += len(records)
                if written >= wanted:
                    break
        total = _bytes(ledger)
    return total / wanted


def _bytes(ledger: SqlLedger) -> int:
    with ledger.engine.connect() as conn:
        if ledger.is_postgres:
            return sum(int(conn.execute(text(f"SELECT pg_total_relation_size('{t}')"))
                           .scalar_one()) for t in TABLES)
        conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        names = [r[0] for r in conn.exec_driver_sql(
            "SELECT name FROM sqlite_master WHERE tbl_name IN "
            f"({', '.join(repr(t) for t in TABLES)})")]
        marks = ", ".join("?" * len(names))
        return int(conn.exec_driver_sql(
            f"SELECT SUM(pgsize) FROM dbstat WHERE name IN ({marks})", tuple(names)
        ).scalar_one())


if __name__ == "__main__":
    main()
