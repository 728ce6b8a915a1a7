"""A writer process for multi-process and crash tests.

    python -m tests.integration.writer_proc URL KEYFILE COUNT TASKS [--forever]

Appends COUNT records (or until killed) from TASKS concurrent asyncio tasks, integrates
checkpoints every 50 ms when it holds the lease, and prints one line per acknowledged
append: ``ack <record_id> <leaf_index> <leaf hash hex>``.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from ledger.store.integrator import Integrator
from ledger.store.keys import load_or_create_signer
from ledger.store.sql import SqlLedger
from tests.records import make_record

ORIGIN = "audit-ledger.test/log"


async def run(url: str, key: Path, count: int, tasks: int, forever: bool) -> None:
    ledger = SqlLedger(url).start()
    integrator = Integrator(ledger, load_or_create_signer(key, ORIGIN), ORIGIN,
                            interval_s=0.05).start()
    pid = os.getpid()
    counter = iter(range(10**9))

    async def worker() -> None:
        while True:
            n = next(counter)
            if not forever and n >= count:
                return
            record = make_record(n, tenant=f"p{pid}", padding=200)
            receipt = await ledger.append_async(record)
            sys.stdout.write(f"ack {receipt.record_id} {receipt.leaf_index} "
                             f"{receipt.leaf_hash.hex()}\n")
            sys.stdout.flush()

    await asyncio.gather(*(worker() for _ in range(tasks)))
    integrator.stop()
    ledger.close()


if __name__ == "__main__":
    url, key, count, tasks = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    asyncio.run(run(url, key, count, tasks, "--forever" in sys.argv))
