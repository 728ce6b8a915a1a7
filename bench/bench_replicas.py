"""1 vs 2 ``serve`` replicas on one PostgreSQL log: total throughput and p99, side by side.

    .venv/bin/python bench/bench_replicas.py [--seconds 20] [--clients 16] [--rounds 1]

Each configuration gets a fresh PostgreSQL database (AUDIT_LEDGER_TEST_PG, default the
local server), the tiny seeded model (1 new token per request) and one torch thread per
replica. The load comes from this process over loopback HTTP, spread round-robin over the
replicas (client-side balancing: no load balancer in the path). Prints requests/s, p50 and
p99 per configuration and the 2-replica / 1-replica ratios.

On a machine with few cores the replicas, PostgreSQL and this load generator share the
same CPUs: the figures show what the CPUs allow, not a limit of the shared log.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import aiohttp
from sqlalchemy import create_engine, text

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.replica_cluster import Replica, client_token, launch, wait_ready  # noqa: E402

PG_ADMIN_URL = os.environ.get("AUDIT_LEDGER_TEST_PG",
                              "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


def fresh_database() -> tuple[str, str]:
    name = f"audit_bench_{uuid.uuid4().hex[:12]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name, name


def drop_database(name: str) -> None:
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


async def drive(urls: list[str], token: str, clients: int, seconds: float
                ) -> tuple[int, int, list[float]]:
    latencies: list[float] = []
    failures = 0
    deadline = time.monotonic() + seconds

    async def client(i: int, session: aiohttp.ClientSession) -> None:
        nonlocal failures
        n = 0
        while time.monotonic() < deadline:
            url = urls[(i + n) % len(urls)]
            n += 1
            started = time.perf_counter()
            async with session.post(f"{url}/v1/generate", json={
                    "prompt": f"bench {i} {n}", "max_new_tokens": 1},
                    headers={"Authorization": f"Bearer {token}"}) as response:
                await response.read()
                if response.status == 200:
                    latencies.append(time.perf_counter() - started)
                else:
                    failures += 1

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        await asyncio.gather(*(client(i, session) for i in range(clients)))
    return len(latencies), failures, latencies


def run_config(replica_count: int, workdir: Path, model_dir: Path, seconds: float,
               clients: int) -> dict[str, float]:
    url, name = fresh_database()
    env = {"AUDIT_LEDGER_LOG_KEY_PATH": str(workdir / f"log-{replica_count}.key"),
           "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    replicas: list[Replica] = []
    try:
        for i in range(replica_count):
            replica = launch(f"r{replica_count}-{i}", workdir, model_dir, url, env)
            wait_ready(replica)  # one at a time: the first creates the log and the keys
            replicas.append(replica)
        token = client_token(replicas[0])
        asyncio.run(drive([r.base_url for r in replicas], token, clients, 2.0))  # warm-up
        started = time.monotonic()
        done, failures, latencies = asyncio.run(
            drive([r.base_url for r in replicas], token, clients, seconds))
        elapsed = time.monotonic() - started
    finally:
        for replica in replicas:
            replica.stop()
        drop_database(name)
    latencies.sort()
    return {"rps": done / elapsed, "p50_ms": statistics.median(latencies) * 1000,
            "p99_ms": latencies[int(0.99 * (len(latencies) - 1))] * 1000,
            "failures": float(failures), "requests": float(done)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--configs", type=int, nargs="+", default=[1, 2],
                        help="replica counts to run (default: 1 2)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="repeat both configurations, alternating their order")
    args = parser.parse_args()
    from inference_wrapper.engine.tiny import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        model_dir = workdir / "tiny" / "tiny-llama"
        build_tiny_model(model_dir)
        rounds = []
        for round_no in range(args.rounds):
            # Alternate the order: on a shared machine the load drifts between runs.
            order = tuple(args.configs) if round_no % 2 == 0 else tuple(reversed(args.configs))
            rounds.append({n: run_config(n, workdir, model_dir, args.seconds, args.clients)
                           for n in order})
    print(f"\n{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; {args.clients} "
          f"clients, {args.seconds:.0f} s per configuration, tiny model, 1 new token, "
          "one PostgreSQL log")
    print(f"{'round':>5} {'replicas':>8} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'failed':>7}")
    for round_no, results in enumerate(rounds, 1):
        for n in sorted(results):
            r = results[n]
            print(f"{round_no:>5} {n:>8} {r['rps']:>9.1f} {r['p50_ms']:>8.1f} "
                  f"{r['p99_ms']:>8.1f} {int(r['failures']):>7}")
        if 1 not in results or 2 not in results:
            continue
        one, two = results[1], results[2]
        print(f"{round_no:>5} 2 / 1 replicas: throughput x{two['rps'] / one['rps']:.2f}, "
              f"p99 x{two['p99_ms'] / one['p99_ms']:.2f}")
    if (os.cpu_count() or 1) <= 4:
        print("note: replicas, PostgreSQL and the load generator share these few cores; "
              "the CPUs bound both figures, not the shared log")


if __name__ == "__main__":
    main()
