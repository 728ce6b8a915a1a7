"""Crash isolation, shown: the engine process SIGKILLed 5 times under load.

    .venv/bin/python bench/kill_engine.py [--kills 5] [--clients 32] [--serve-s 2]

Serves the tiny model with ``audit-ledger serve`` (one engine process), runs
``--clients`` closed-loop clients on /v1/generate and a /healthz poller every 50 ms, and
kills the engine (SIGKILL, found as the server's child) each time it has served
``--serve-s`` seconds again. Then it stops the server and opens its ledger: every answer
that carried output must name a committed record. Prints the answers by status, the
answers with output and no committed record (must be 0), the /healthz polls that failed
(must be 0) and, per kill, the seconds until the engine served again (the supervisor's
backoff grows while the engine keeps dying young: decision 30).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_endpoint import ROOT, child_pids, free_port, start_service, wait_ready  # noqa: E402


def engine_pid(server_pid: int) -> int | None:
    for pid in child_pids(server_pid):
        try:
            if b"inference_wrapper.engine.worker" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        except OSError:
            continue
    return None


async def run(base: str, token: str, server_pid: int, kills: int, clients: int,
              serve_s: float) -> tuple[Counter[int], list[str], int, int, list[float]]:
    statuses: Counter[int] = Counter()
    with_output: list[str] = []  # record ids of answers that carried output
    health = {"polls": 0, "failed": 0}
    served_after: list[float] = []  # completion times of 200 answers sent after a kill
    last_kill = [0.0]
    restart_s: list[float] = []
    stop = asyncio.Event()
    headers = {"Authorization": f"Bearer {token}"}

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients + 2)) as s:
        async def client(c: int) -> None:
            i = 0
            while not stop.is_set():
                i += 1
                sent = time.monotonic()
                async with s.post(f"{base}/v1/generate", headers=headers, json={
                        "prompt": f"kill test {c}.{i}", "max_new_tokens": 32}) as r:
                    body = await r.json()
                    statuses[r.status] += 1
                    if r.status == 200 and body.get("output") is not None:
                        with_output.append(body["record_id"])
                        if sent > last_kill[0] > 0:
                            served_after.append(time.monotonic())
                    elif r.status == 503:
                        await asyncio.sleep(0.05)  # the engine is down: do not spin

        async def healthz() -> None:
            while not stop.is_set():
                health["polls"] += 1
                try:
                    async with s.get(f"{base}/healthz",
                                     timeout=aiohttp.ClientTimeout(total=5)) as r:
                        if r.status != 200:
                            health["failed"] += 1
                except (aiohttp.ClientError, TimeoutError):
                    health["failed"] += 1
                await asyncio.sleep(0.05)

        tasks = [asyncio.ensure_future(client(c)) for c in range(clients)]
        tasks.append(asyncio.ensure_future(healthz()))
        try:
            for _ in range(kills):
                await asyncio.sleep(serve_s)  # serving under load
                pid = engine_pid(server_pid)
                assert pid is not None, "no engine process found"
                served_after.clear()
                last_kill[0] = time.monotonic()
                os.kill(pid, signal.SIGKILL)
                while not served_after:  # until an answer sent after the kill is served
                    await asyncio.sleep(0.01)
                restart_s.append(served_after[0] - last_kill[0])
                print(f"  kill {len(restart_s)}: engine pid {pid}; serving again after "
                      f"{restart_s[-1]:.2f} s", file=sys.stderr, flush=True)
            await asyncio.sleep(serve_s)
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
    return statuses, with_output, health["polls"], health["failed"], restart_s


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--serve-s", type=float, default=2.0)
    args = parser.parse_args()
    from inference_wrapper.engine.tiny import build_tiny_model
    from ledger.store.sql import SqlLedger

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "tiny"
        build_tiny_model(model_dir)
        port, database_url = free_port(), f"sqlite:///{tmp}/ledger.db"
        env = dict(os.environ, AUDIT_LEDGER_HOME=tmp, PYTHONUNBUFFERED="1")
        proc, token = start_service(
            [sys.executable, "-m", "audit_cli.main", "serve", "--port", str(port), "--db",
             database_url, "--model-dir", str(model_dir), "--model-manifest",
             str(Path(tmp) / "tiny.manifest.json")], env)
        base = f"http://127.0.0.1:{port}"
        try:
            asyncio.run(wait_ready(base))
            statuses, with_output, polls, failed, restart_s = asyncio.run(
                run(base, token, proc.pid, args.kills, args.clients, args.serve_s))
        finally:
            proc.terminate()
            proc.wait(timeout=120)
        with SqlLedger(database_url) as ledger:
            missing = [r for r in with_output if ledger.get_record(r) is None]
    print(f"engine SIGKILLed {len(restart_s)} times under load, {args.clients} clients "
          f"(cwd {ROOT.name})")
    print("answers by status: " + ", ".join(f"{k}: {v}" for k, v in sorted(statuses.items())))
    print(f"answers with output: {len(with_output)}; with output and no committed record: "
          f"{len(missing)}")
    print(f"/healthz polls: {polls}, failed: {failed}")
    print("seconds until the engine served again, per kill: "
          + ", ".join(f"{s:.2f}" for s in restart_s)
          + f" (median {statistics.median(restart_s):.2f})")


if __name__ == "__main__":
    main()
