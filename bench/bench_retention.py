"""Retention on vs off: endpoint throughput at concurrency 32, and content read latency.

    .venv/bin/python bench/bench_retention.py [--seconds 20] [--concurrency 32] [--rounds 1]

(off) the service with the default policy: commitments only, nothing retained;
(on)  the same service with the tenant's policy set to content: every record's prompt,
      output and salts are encrypted and stored in the vault before the answer returns.
Each server runs in its own process on the tiny model with one torch thread and its own
SQLite ledger; the load comes from this process over loopback HTTP for a fixed time.
Rounds alternate off/on so a busy machine hurts both alike. Then, on the (on) server,
an auditor reads retained content (each read appends and commits an access leaf first)
at concurrency 1 and 8. Prints requests/s, p50/p99, the on/off ratio and read p50/p99.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

# Run as a script from bench/: the endpoint benchmark's service helpers are shared.
from bench_endpoint import free_port, start_service, wait_ready

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "Summarise the credit exposure of the retail portfolio in one sentence:"


def cli(env: dict[str, str], *args: str) -> str:
    return subprocess.run([sys.executable, "-m", "audit_cli.main", *args], cwd=ROOT, env=env,
                          check=True, capture_output=True, text=True, timeout=300).stdout


def start(home: Path, model_dir: Path, manifest: Path, retain: bool
          ) -> tuple[subprocess.Popen[str], str, str, str]:
    env = dict(os.environ, AUDIT_LEDGER_HOME=str(home), PYTHONUNBUFFERED="1")
    url = f"sqlite:///{home / 'ledger.db'}"
    if retain:
        cli(env, "retention", "--db", url, "set", "--tenant", "default", "--mode", "content")
    port = free_port()
    proc, token = start_service(
        [sys.executable, "-m", "audit_cli.main", "serve", "--port", str(port), "--db", url,
         "--model-dir", str(model_dir), "--model-manifest", str(manifest), "--max-batch", "32"],
        env)  # its output is drained, so the service never blocks on a full pipe
    auditor = json.loads(cli(env, "keys", "--db", url, "--json", "create", "--tenant",
                             "audit-firm", "--role", "auditor"))["token"]
    return proc, f"http://127.0.0.1:{port}", token, auditor


async def generate_load(base: str, token: str, concurrency: int, seconds: float,
                        new_tokens: int) -> tuple[float, float, float, list[str]]:
    latencies: list[float] = []
    ids: list[str] = []
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as s:
        async def one(tag: str) -> None:
            begin = time.perf_counter()
            async with s.post(f"{base}/v1/generate", headers=headers, json={
                    "prompt": f"{PROMPT} ({tag})", "max_new_tokens": new_tokens,
                    "subject": f"customer-{tag}"}) as r:
                assert r.status == 200, await r.text()
                ids.append((await r.json())["record_id"])
            latencies.append(time.perf_counter() - begin)

        await one("warm-up")
        latencies.clear()
        stop_at = time.perf_counter() + seconds

        async def client(c: int) -> None:
            i = 0
            while time.perf_counter() < stop_at:
                await one(f"{c}.{i}")
                i += 1

        begin = time.perf_counter()
        await asyncio.gather(*(client(c) for c in range(concurrency)))
        elapsed = time.perf_counter() - begin
    latencies.sort()
    return (len(latencies) / elapsed, statistics.median(latencies) * 1e3,
            latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] * 1e3, ids)


async def read_load(base: str, auditor: str, ids: list[str], concurrency: int,
                    seconds: float) -> tuple[int, float, float]:
    latencies: list[float] = []
    headers = {"Authorization": f"Bearer {auditor}"}
    stop_at = time.perf_counter() + seconds
    async with aiohttp.ClientSession() as s:
        async def client(c: int) -> None:
            i = c
            while time.perf_counter() < stop_at:
                begin = time.perf_counter()
                async with s.get(f"{base}/v1/records/{ids[i % len(ids)]}/content",
                                 params={"purpose": "bench sample review"},
                                 headers=headers) as r:
                    assert r.status == 200, await r.text()
                    await r.read()
                latencies.append(time.perf_counter() - begin)
                i += concurrency

        await asyncio.gather(*(client(c) for c in range(concurrency)))
    latencies.sort()
    return (len(latencies), statistics.median(latencies) * 1e3,
            latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] * 1e3)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--read-seconds", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    from inference_wrapper.engine.tiny import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "tiny"
        build_tiny_model(model_dir)
        manifest = Path(tmp) / "tiny.manifest.json"
        results: dict[str, list[tuple[float, float, float]]] = {"off": [], "on": []}
        reads: list[tuple[str, tuple[int, float, float]]] = []
        for round_ in range(args.rounds):
            for mode in ("off", "on"):
                home = Path(tmp) / f"{mode}-{round_}"
                home.mkdir()
                proc, base, token, auditor = start(home, model_dir, manifest, mode == "on")
                try:
                    asyncio.run(wait_ready(base))
                    rps, p50, p99, ids = asyncio.run(generate_load(
                        base, token, args.concurrency, args.seconds, args.new_tokens))
                    results[mode].append((rps, p50, p99))
                    if mode == "on" and round_ == args.rounds - 1:
                        for c in (1, 8):
                            reads.append((f"c={c}", asyncio.run(read_load(
                                base, auditor, ids, c, args.read_seconds))))
                finally:
                    proc.terminate()
                    proc.wait(timeout=60)
    print(f"tiny model, {args.new_tokens} new tokens, c={args.concurrency}, "
          f"{args.seconds:.0f} s per run, {args.rounds} round(s), 1 torch thread per server")
    for mode, runs in results.items():
        for rps, p50, p99 in runs:
            print(f"  retention {mode:3}: {rps:7.1f} req/s   p50 {p50:6.0f} ms   p99 {p99:6.0f} ms")
    off = statistics.mean(r[0] for r in results["off"])
    on = statistics.mean(r[0] for r in results["on"])
    print(f"throughput ratio on/off: {on / off:.3f}")
    for label, (count, p50, p99) in reads:
        print(f"content read {label}: {count} reads, p50 {p50:.1f} ms, p99 {p99:.1f} ms "
              "(each commits an access leaf first)")


if __name__ == "__main__":
    main()
