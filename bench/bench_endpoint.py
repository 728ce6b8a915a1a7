"""Endpoint throughput and latency at concurrency 1, 8 and 32, side by side in one run.

    .venv/bin/python bench/bench_endpoint.py [--requests 480] [--batch-one] [--default-model]

(a) the service, audited, dynamic batching (max batch 32), the model in an engine process;
(b) the service, audited, batch size 1 (only with --batch-one);
(c) a bare aiohttp handler defined here, the same engine layout (an engine process), same
    batcher, no records and no ledger (the service has no switch that turns auditing off);
(d) the old layout's bare handler: the same, with the model on a thread of the server
    process (decision 30: what the audited service was measured against before).
Each server (and each engine) runs with one torch thread and has its output drained by
a thread here (a server whose stdout is not read would stall on a full pipe); the load
comes from this process over loopback HTTP, ``--requests`` per level (enough for a p99
that is not just the slowest request). Both servers run at once and the levels
alternate between them, so machine noise hits both alike. Prints requests/s, p50 and
p99 latency per level, the audited/bare throughput ratio, and the p99 added by auditing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "Summarise the credit exposure of the retail portfolio in one sentence:"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve_bare(port: int, model_dir: str, manifest: str, layout: str) -> None:
    """Modes (c) and (d): the same model and batcher, no audit at all; the model in an
    engine process (``layout`` "process") or on a thread here ("in-process")."""
    from aiohttp import web

    from inference_wrapper.audit.batcher import Batcher
    from inference_wrapper.audit.generator import AuditedGenerator
    from inference_wrapper.engine.fingerprint.software import set_torch_threads
    from inference_wrapper.engine.model import load_model, load_served_model
    from inference_wrapper.engine.params import GenerationParams
    from inference_wrapper.engine.process import EngineSpec
    from inference_wrapper.engine.supervised import SupervisedEngine

    set_torch_threads(1)
    pinned = json.loads(Path(manifest).read_text())
    engine: SupervisedEngine | None = None
    if layout == "process":
        engine = SupervisedEngine(EngineSpec("engine-0", Path(model_dir),
                                             manifest=Path(manifest), device="cpu"))
        generator = AuditedGenerator(load_served_model(Path(model_dir), manifest=pinned),
                                     engines=[engine])
    else:
        generator = AuditedGenerator(load_model(Path(model_dir), manifest=pinned))

    class NoAudit:
        """run_batch is the real one; seal only hands the texts back."""

        def __getattr__(self, name: str) -> Any:
            return getattr(generator, name)

        def seal(self, batch: Any, log: Any = None) -> list[Any]:
            return [type("Out", (), {"text": t, "record": None})() for t in batch.result.texts]

    class NoJournal:
        async def append_many_async(self, records: Any) -> list[None]:
            return [None] * len(records)

    async def handle(request: web.Request) -> web.Response:
        body = await request.json()
        prepared = generator.prepare(body["prompt"],
                                     GenerationParams(max_new_tokens=body["max_new_tokens"]))
        answer = await request.app["batcher"].submit(prepared)
        return web.json_response({"output": answer.output.text})

    batches = {"count": 0.0, "sum": 0.0}  # generate calls and their rows, as /metrics has

    def observe(name: str, value: float) -> None:
        if name == "batch_size":
            batches["count"] += 1
            batches["sum"] += value

    async def start(app: web.Application) -> Any:
        if engine is not None:
            await engine.start()
        batcher = Batcher(NoAudit(), NoJournal(), max_batch=32, max_wait_ms=5.0,  # type: ignore[arg-type]
                          observe=observe)
        batcher.start()
        app["batcher"] = batcher
        yield
        await batcher.drain()
        if engine is not None:
            await engine.close()

    app = web.Application()
    app.cleanup_ctx.append(start)
    app.router.add_post("/v1/generate", handle)
    app.router.add_get("/readyz", lambda r: web.json_response({"ready": True}))
    app.router.add_get("/batches", lambda r: web.json_response(batches))
    print("ready", flush=True)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def start_service(args: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    token = ""
    assert proc.stdout is not None
    for line in proc.stdout:
        match = re.search(r"client\s+\(tenant default\): (\S+)", line)
        if match:
            token = match.group(1)
        if line.startswith("serving") or line.startswith("ready"):
            break
    stream = proc.stdout

    def drain() -> None:  # keep reading: one log line per request fills a pipe fast
        for _ in stream:
            pass

    threading.Thread(target=drain, daemon=True).start()
    return proc, token


async def wait_ready(base: str, timeout_s: float = 600.0) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(int(timeout_s * 10)):  # a loaded machine loads torch slowly
            try:
                async with session.get(f"{base}/readyz") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{base} never became ready")


async def load(base: str, token: str, concurrency: int, total: int, new_tokens: int,
               on_start: Callable[[], None] = lambda: None) -> tuple[list[float], float]:
    """(latencies in s, elapsed s) for ``total`` requests from ``concurrency`` clients,
    after a short warm-up; ``on_start`` is called when the timed part begins."""
    per_client = max(1, total // concurrency)
    latencies: list[float] = []
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        async def client(c: int, count: int = per_client) -> None:
            for i in range(count):
                start = time.perf_counter()
                async with session.post(f"{base}/v1/generate", headers=headers, json={
                        "prompt": f"{PROMPT} ({c}.{i})", "max_new_tokens": new_tokens}) as r:
                    assert r.status == 200, await r.text()
                    await r.read()
                latencies.append(time.perf_counter() - start)

        await client(-1, min(per_client, 4))  # warm-up: connections and caches
        latencies.clear()
        on_start()
        start = time.perf_counter()
        await asyncio.gather(*(client(c) for c in range(concurrency)))
        elapsed = time.perf_counter() - start
    return latencies, elapsed


def _stat_cpu(stat: Path) -> float:
    """User + system CPU seconds from a ``/proc`` ``stat`` file (Linux)."""
    fields = stat.read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process, all its threads."""
    return _stat_cpu(Path(f"/proc/{pid}/stat"))


def thread_cpu(pid: int, base: str, named: bool) -> dict[str, float]:
    """CPU seconds per thread: by name from the audited service's ``/metrics``
    (``named``), else by thread id from ``/proc`` (the bare server has no names)."""
    if named:
        from urllib.request import urlopen

        with urlopen(f"{base}/metrics", timeout=30) as response:
            text = response.read().decode()
        found = re.findall(r'^audit_thread_cpu_seconds_total\{thread="([^"]*)"\} (\S+)$',
                           text, re.MULTILINE)
        return {name: float(value) for name, value in found}
    by_id = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            by_id[task.name] = _stat_cpu(task / "stat")
        except OSError:  # the thread has just ended
            continue
    return by_id


def batch_counts(base: str, named: bool) -> tuple[float, float]:
    """(generate calls, rows in them) so far: the audited service's ``audit_batch_size``
    histogram on ``/metrics``, the bare server's own count on ``/batches``."""
    from urllib.request import urlopen

    if not named:
        with urlopen(f"{base}/batches", timeout=30) as response:
            counts = json.loads(response.read())
        return float(counts["count"]), float(counts["sum"])
    with urlopen(f"{base}/metrics", timeout=30) as response:
        text = response.read().decode()
    count = re.search(r"^audit_batch_size_count(?:\{[^}]*\})? (\S+)$", text, re.MULTILINE)
    rows = re.search(r"^audit_batch_size_sum(?:\{[^}]*\})? (\S+)$", text, re.MULTILINE)
    if count is None or rows is None:
        raise RuntimeError("no audit_batch_size histogram on /metrics")
    return float(count.group(1)), float(rows.group(1))


def child_pids(pid: int) -> list[int]:
    """A process's children (its engine processes), from ``/proc`` (Linux)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found += [int(x) for x in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def process_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of a server process and of each of its children (engine processes and
    their idle warm reserves)."""
    cpu = {"api": cpu_seconds(pid)}
    for index, child in enumerate(sorted(child_pids(pid))):
        try:
            cpu[f"child {index}"] = cpu_seconds(child)
        except OSError:  # it has just exited
            continue
    return cpu


def summary(latencies: list[float], elapsed: float) -> tuple[float, float, float]:
    """(requests/s, p50 ms, p99 ms)."""
    ordered = sorted(latencies)
    return (len(ordered) / elapsed, statistics.median(ordered) * 1e3,
            ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1e3)


AUDITED, BARE, OLD_BARE = ("(a) audited, batching", "(c) bare, batching",
                           "(d) old bare, in-process")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=480,
                        help="requests per concurrency level and server (after warm-up)")
    parser.add_argument("--rounds", type=int, default=4,
                        help="split each level into this many alternating slices per server "
                             "(machine noise then falls on both alike)")
    parser.add_argument("--batch-one", action="store_true",
                        help="also run the audited service with batch size 1")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--levels", default="1,8,32")
    parser.add_argument("--default-model", action="store_true",
                        help="use the shipped SmolLM2-135M instead of the tiny model")
    parser.add_argument("--serve-bare", nargs=4,
                        metavar=("PORT", "MODEL", "MANIFEST", "LAYOUT"))
    args = parser.parse_args()
    if args.serve_bare:
        serve_bare(int(args.serve_bare[0]), args.serve_bare[1], args.serve_bare[2],
                   args.serve_bare[3])
        return
    levels = [int(x) for x in args.levels.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        from inference_wrapper.defaults import DEFAULT_MODEL_DIR, PINNED_MANIFEST
        from inference_wrapper.engine.tiny import build_tiny_model

        if args.default_model:
            model_dir, manifest = DEFAULT_MODEL_DIR, PINNED_MANIFEST
        else:
            model_dir = Path(tmp) / "tiny"
            build_tiny_model(model_dir)
            manifest = Path(tmp) / "tiny.manifest.json"
        env = dict(os.environ, AUDIT_LEDGER_HOME=tmp, PYTHONUNBUFFERED="1")
        results: dict[str, dict[int, tuple[float, float, float]]] = {}
        cpu: dict[str, dict[int, dict[str, float]]] = {}  # CPU s per request, per process
        by_thread: dict[tuple[str, int], dict[str, float]] = {}  # CPU s per request
        slices: dict[tuple[str, int], list[float]] = {}  # requests/s of each slice
        batched: dict[tuple[str, int], list[float]] = {}  # [generate calls, rows]
        configs: dict[str, list[str]] = {
            AUDITED: ["serve", "--max-batch", "32"],
            BARE: ["bare", "process"],
            OLD_BARE: ["bare", "in-process"],
        }
        if args.batch_one:
            configs["(b) audited, batch 1"] = ["serve", "--max-batch", "1"]
        servers: dict[str, tuple[subprocess.Popen[str], str, str]] = {}
        try:
            for name, (kind, *extra) in configs.items():
                port = free_port()
                if kind == "bare":
                    cmd = [sys.executable, __file__, "--serve-bare", str(port),
                           str(model_dir), str(manifest), *extra]
                else:
                    cmd = [sys.executable, "-m", "audit_cli.main", "serve", "--port",
                           str(port), "--db", f"sqlite:///{tmp}/{port}.db", "--model-dir",
                           str(model_dir), "--model-manifest", str(manifest), *extra]
                proc, token = start_service(cmd, env)
                base = f"http://127.0.0.1:{port}"
                servers[name] = (proc, base, token)
                cpu[name] = {}
                asyncio.run(wait_ready(base))
            for level in levels:
                # Alternate slices (a, c, d, d, c, a, ...): all see the same machine.
                samples: dict[str, tuple[list[float], float]] = {n: ([], 0.0) for n in servers}
                names = list(servers)
                for round_ in range(args.rounds):
                    for name in (names if round_ % 2 == 0 else names[::-1]):
                        proc, base, token = servers[name]
                        cpu_start: list[dict[str, float]] = []
                        named = token != ""  # the audited services, with /metrics
                        threads_start: list[dict[str, float]] = []
                        batches_start: list[tuple[float, float]] = []

                        def started(p: int = proc.pid, c: list[dict[str, float]] = cpu_start,
                                    t: list[dict[str, float]] = threads_start,
                                    b: str = base, n: bool = named,
                                    k: list[tuple[float, float]] = batches_start) -> None:
                            k.append(batch_counts(b, n))
                            t.append(thread_cpu(p, b, n))
                            c.append(process_cpu(p))

                        latencies, elapsed = asyncio.run(load(
                            base, token, level, max(level, args.requests // args.rounds),
                            args.new_tokens, started))
                        per_process = cpu[name].setdefault(level, {})
                        for process, seconds in process_cpu(proc.pid).items():
                            per_process[process] = per_process.get(process, 0.0) + (
                                seconds - cpu_start[0].get(process, 0.0)) / len(latencies)
                        per = by_thread.setdefault((name, level), {})
                        for thread, seconds in thread_cpu(proc.pid, base, named).items():
                            per[thread] = per.get(thread, 0.0) + (
                                seconds - threads_start[0].get(thread, 0.0)) / len(latencies)
                        calls, rows = batch_counts(base, named)  # after: not in the CPU
                        tally = batched.setdefault((name, level), [0.0, 0.0])
                        tally[0] += calls - batches_start[0][0]
                        tally[1] += rows - batches_start[0][1]
                        kept, total = samples[name]
                        samples[name] = (kept + latencies, total + elapsed)
                        slices.setdefault((name, level), []).append(len(latencies) / elapsed)
                for name, (latencies, elapsed) in samples.items():
                    results.setdefault(name, {})[level] = summary(latencies, elapsed)
                    rps, p50, p99 = results[name][level]
                    print(f"  {name} c={level}: {rps:.1f} req/s, p50 {p50:.0f} ms, "
                          f"p99 {p99:.0f} ms", file=sys.stderr, flush=True)
        finally:
            for proc, _, _ in servers.values():
                proc.terminate()
                proc.wait(timeout=60)
    model = "SmolLM2-135M" if args.default_model else "tiny model"
    print(f"{model}, {args.new_tokens} new tokens, {args.requests} requests per level and "
          f"server in {args.rounds} alternating slices, 1 torch thread per engine")
    print(f"{'':26}" + "".join(f"{'c=' + str(c):>28}" for c in levels))
    for name, per_level in results.items():
        cells = "".join(f"{rps:8.1f} req/s {p50:6.0f}/{p99:6.0f} ms"
                        for rps, p50, p99 in per_level.values())
        print(f"{name:26}{cells}")
    a, c, d = results[AUDITED], results[BARE], results[OLD_BARE]
    for level in levels:
        line = (f"c={level}: audited/bare throughput = {a[level][0] / c[level][0]:.3f}; "
                f"audited/old bare = {a[level][0] / d[level][0]:.3f}; "
                f"p99 added by auditing = {a[level][2] - c[level][2]:+.1f} ms "
                f"(p50 {a[level][1] - c[level][1]:+.1f} ms)")
        if args.batch_one:
            b = results["(b) audited, batch 1"]
            line += f"; batching gain (a)/(b) = {a[level][0] / b[level][0]:.2f}x"
        print(line)
    # Neighbouring slices see nearly the same machine: the median of their ratios shrugs
    # off the drifts (other work, frequency) that move the totals above.
    for level in levels:
        for against, label in ((BARE, "bare"), (OLD_BARE, "old bare (in-process)")):
            pairs = sorted(x / y for x, y in zip(slices[(AUDITED, level)],
                                                 slices[(against, level)], strict=True))
            quarter = len(pairs) // 4
            print(f"c={level}: audited/{label} throughput, median of {len(pairs)} "
                  f"neighbouring slice pairs = {statistics.median(pairs):.3f} (middle half "
                  f"{pairs[quarter]:.3f}-{pairs[len(pairs) - 1 - quarter]:.3f})")
    # CPU time per request served, per process (the API server, each engine): what each
    # layout spends whatever the machine's noise.
    for level in levels:
        cells = "; ".join(
            f"{name[:3]} " + ", ".join(f"{process} {seconds / args.rounds * 1e3:.3f}"
                                       for process, seconds in cpu[name][level].items())
            for name in servers)
        print(f"c={level}: CPU per request (ms) by process: {cells}")
    # How full the batches were: an engine's CPU goes per decoding step of a batch far
    # more than per row, so fewer, fuller batches cost it less per request.
    for level in levels:
        cells = "; ".join(
            f"{name[:3]} {calls:.0f} batches, {rows / calls if calls else 0:.1f} rows each"
            for name in servers for calls, rows in [batched.get((name, level), [0.0, 0.0])])
        print(f"c={level}: generate calls in the timed slices: {cells}")
    # Which thread of the API process spends it (clock-tick resolution): the audited
    # service names its threads on /metrics; the bare ones' are only ranked.
    for level in levels:
        for name in servers:
            per = sorted(by_thread.get((name, level), {}).items(), key=lambda kv: -kv[1])
            cells = ", ".join(f"{thread if name.startswith('(a)') else f'#{rank}'} "
                              f"{seconds / args.rounds * 1e6:.0f}"
                              for rank, (thread, seconds) in enumerate(per, 1)
                              if seconds / args.rounds >= 1e-6)
            print(f"c={level}: {name} API process CPU per request by thread (us): {cells}")


if __name__ == "__main__":
    main()
