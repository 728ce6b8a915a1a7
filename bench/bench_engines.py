"""Two engine processes against one, side by side in one run (CPU, tiny model).

    .venv/bin/python bench/bench_engines.py [--requests 1024] [--rounds 8] [--levels 32,64]

Two audited services (``audit-ledger serve --engines 1`` and ``--engines 2``), each with
its own SQLite ledger, both up at once; the load alternates between them in slices so
that machine noise falls on both alike. Prints each one's requests/s, p50/p99 latency,
the ratio two/one (totals and the median of neighbouring slice pairs) and the CPU per
request of each process. On a CPU the engines share the machine's cores: the gain is
bounded by the cores the engines can have (a GPU machine gives each its own GPU).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_endpoint import (  # noqa: E402
    free_port,
    load,
    process_cpu,
    start_service,
    summary,
    wait_ready,
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--levels", default="32,64")
    parser.add_argument("--new-tokens", type=int, default=32)
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    from inference_wrapper.engine.tiny import build_tiny_model

    names = {1: "one engine", 2: "two engines"}
    results: dict[tuple[int, int], tuple[float, float, float]] = {}
    slices: dict[tuple[int, int], list[float]] = {}
    cpu: dict[tuple[int, int], dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "tiny"
        build_tiny_model(model_dir)
        env = dict(os.environ, AUDIT_LEDGER_HOME=tmp, PYTHONUNBUFFERED="1")
        servers: dict[int, tuple[subprocess.Popen[str], str, str]] = {}
        try:
            for engines in names:
                port = free_port()
                proc, token = start_service(
                    [sys.executable, "-m", "audit_cli.main", "serve", "--port", str(port),
                     "--db", f"sqlite:///{tmp}/{port}.db", "--model-dir", str(model_dir),
                     "--model-manifest", str(Path(tmp) / "tiny.manifest.json"),
                     "--engines", str(engines), "--max-batch", "32"], env)
                servers[engines] = (proc, f"http://127.0.0.1:{port}", token)
                asyncio.run(wait_ready(servers[engines][1]))
            for level in levels:
                samples: dict[int, tuple[list[float], float]] = {n: ([], 0.0) for n in names}
                for round_ in range(args.rounds):
                    for engines in (list(names) if round_ % 2 == 0 else list(names)[::-1]):
                        proc, base, token = servers[engines]
                        before: list[dict[str, float]] = []
                        latencies, elapsed = asyncio.run(load(
                            base, token, level, max(level, args.requests // args.rounds),
                            args.new_tokens, lambda p=proc.pid, b=before: b.append(
                                process_cpu(p))))
                        per = cpu.setdefault((engines, level), {})
                        for process, seconds in process_cpu(proc.pid).items():
                            per[process] = per.get(process, 0.0) + (
                                seconds - before[0].get(process, 0.0)) / len(latencies)
                        kept, total = samples[engines]
                        samples[engines] = (kept + latencies, total + elapsed)
                        slices.setdefault((engines, level), []).append(len(latencies) / elapsed)
                for engines, (latencies, elapsed) in samples.items():
                    results[(engines, level)] = summary(latencies, elapsed)
                    rps, p50, p99 = results[(engines, level)]
                    print(f"  {names[engines]} c={level}: {rps:.1f} req/s", file=sys.stderr,
                          flush=True)
        finally:
            for proc, _, _ in servers.values():
                proc.terminate()
                proc.wait(timeout=60)
    print(f"tiny model, {args.new_tokens} new tokens, {args.requests} requests per level and "
          f"service in {args.rounds} alternating slices, 1 torch thread per engine, "
          f"{os.cpu_count()} CPUs")
    for level in levels:
        one, two = results[(1, level)], results[(2, level)]
        pairs = sorted(x / y for x, y in zip(slices[(2, level)], slices[(1, level)],
                                             strict=True))
        print(f"c={level}: one engine {one[0]:.1f} req/s (p50 {one[1]:.0f} ms, p99 "
              f"{one[2]:.0f} ms) | two engines {two[0]:.1f} req/s (p50 {two[1]:.0f} ms, p99 "
              f"{two[2]:.0f} ms) | two/one {two[0] / one[0]:.2f}, median of "
              f"{len(pairs)} slice pairs {statistics.median(pairs):.2f}")
        for engines in names:
            cells = ", ".join(f"{process} {seconds / args.rounds * 1e3:.2f}"
                              for process, seconds in cpu[(engines, level)].items())
            print(f"c={level}: {names[engines]} CPU per request (ms): {cells}")


if __name__ == "__main__":
    main()
