"""What the console adds on top of reading the mirror, side by side.

    .venv/bin/python bench/bench_console.py [--records 10000] [--rounds 3]

A SQLite ledger in a temporary folder with synthetic ~1 KB records (two drivers). In
alternating rounds over the same rows it times:
(a) paging through every row with ``SqlLedger.query`` (what any reader pays);
(b) the console's CSV export of every row (the same pages plus CSV encoding);
(c) the plots page's work: the same pages, each record's bytes parsed for its timings
    and batch size, per-minute counts, p50/p99 per phase, the fingerprint timeline and
    the SVG text.
Prints rows/s for each and the ratios (b)/(a) and (c)/(a). No server, no browser.

    .venv/bin/python bench/bench_console.py --export [--records 40000]

A real service (`audit-ledger serve`, tiny model, SQLite, one torch thread) on a ledger
pre-filled with that many records; an auditor signed in to its console downloads the
evidence bundle of every record while clients call generate. Prints the server's peak
RSS growth during the export (sampled from /proc every 20 ms; target < 64 MB) and the
generate p50 with and without the export running, side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from inference_wrapper.server.console import CSV_PAGE, _plot_points, csv_lines
from inference_wrapper.server.console_plots import (
    bar_chart_svg,
    fingerprint_changes,
    line_chart_svg,
    mean_batch_size,
    per_minute,
    phase_percentiles,
    timeline_svg,
)
from ledger.record import build_record
from ledger.store.migrate import upgrade
from ledger.store.sql import SqlLedger

SINCE, UNTIL = datetime(2000, 1, 1), datetime(2100, 1, 1)


def _fill(ledger: SqlLedger, count: int) -> None:
    for i in range(count):
        ledger.submit(build_record(
            tenant=f"bank-{i % 3}", model={"name": "m", "digest": "sha256:" + "a" * 64},
            hardware={"accelerator": "cuda", "accelerator_model": "NVIDIA H200",
                      "driver_version": "550.54.15" if i < count // 2 else "560.35.03"},
            software={"torch": {"version": "2.13.0", "git_version": "c" * 40},
                      "service": {"git_revision": "x" * 40}},
            data={"input_commitment": f"sha256:{i:064x}",
                  "output_commitment": f"sha256:{i + 1:064x}", "batch": {"size": 1 + i % 8},
                  "note": "x" * 700},
            timings_ms={"parse": 0.1, "tokenize": 0.4, "forward": 5.0 + i % 7, "decode": 0.2},
            created_at=f"2026-11-30T{9 + i // 3600 % 10:02d}:{i // 60 % 60:02d}:"
                       f"{i % 60:02d}.000Z"))
    ledger.append(build_record(  # the last one: waits until every earlier one committed
        tenant="bank-0", model={"name": "m", "digest": "sha256:" + "a" * 64},
        hardware={}, software={}, data={}, timings_ms={}))


def _read_all(ledger: SqlLedger) -> int:
    cursor: str | None = None
    total = 0
    while True:
        rows, cursor = ledger.mirror.query(since=SINCE, until=UNTIL, limit=CSV_PAGE, cursor=cursor)
        total += len(rows)
        if cursor is None:
            return total


def _csv_all(ledger: SqlLedger) -> int:
    cursor, total, first = None, 0, True
    while True:
        rows, cursor = ledger.mirror.query(since=SINCE, until=UNTIL, limit=CSV_PAGE, cursor=cursor)
        total += len(csv_lines(rows, header=first))
        first = False
        if cursor is None:
            return total


def _plots(ledger: SqlLedger) -> int:
    points = _plot_points(ledger, SINCE, UNTIL)
    changes = fingerprint_changes(points)
    svg = (bar_chart_svg(per_minute(points), title="rpm")
           + line_chart_svg(phase_percentiles(points), title="latency", unit="ms")
           + line_chart_svg({"batch": mean_batch_size(points)}, title="batch", unit="")
           + timeline_svg(points, changes))
    return len(svg)


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc (Linux only)")


async def _sign_in(session: Any, base: str, token: str) -> None:
    form = await (await session.get(f"{base}/console/login")).text()
    csrf = re.search(r'name="csrf" value="([^"]+)"', form)
    assert csrf is not None
    answer = await session.post(f"{base}/console/login", allow_redirects=False,
                                data={"api_key": token, "csrf": csrf.group(1)})
    assert answer.status == 303, await answer.text()


async def _export_run(base: str, client: str, auditor: str, pid: int,
                      requests: int) -> None:
    import aiohttp
    from bench_endpoint import load, summary, wait_ready

    await wait_ready(base)
    quiet, elapsed = await load(base, client, 2, requests, 4)
    jar = aiohttp.CookieJar(unsafe=True)
    async with aiohttp.ClientSession(cookie_jar=jar) as session:
        await _sign_in(session, base, auditor)
        baseline = _rss_bytes(pid)
        peak = baseline
        done = asyncio.Event()

        async def sample() -> None:
            nonlocal peak
            while not done.is_set():
                peak = max(peak, _rss_bytes(pid))
                await asyncio.sleep(0.02)

        async def export() -> tuple[int, float]:
            started = time.perf_counter()
            size = 0
            async with session.get(f"{base}/console/records.bundle") as answer:
                assert answer.status == 200, await answer.text()
                async for chunk in answer.content.iter_chunked(1 << 16):
                    size += len(chunk)
            done.set()
            return size, time.perf_counter() - started

        sampler = asyncio.create_task(sample())
        exporting = asyncio.create_task(export())
        during: list[float] = []
        while not done.is_set():  # generate calls for as long as the export runs
            latencies, _ = await load(base, client, 2, 8, 4)
            during.extend(latencies)
        size, seconds = await exporting
        await sampler
    p50_quiet = summary(quiet, elapsed)[1]
    p50_during = statistics.median(during) * 1000
    print(f"bundle export: {size / 1e6:.1f} MB in {seconds:.1f} s")
    print(f"server RSS growth during the export: {(peak - baseline) / 2**20:.1f} MB "
          f"(peak {peak / 2**20:.0f} MB, before {baseline / 2**20:.0f} MB; target < 64 MB)")
    print(f"generate p50 without export {p50_quiet:.1f} ms, during export {p50_during:.1f} "
          f"ms ({len(during)} requests): ratio {p50_during / p50_quiet:.2f}")


def export_bench(records: int, requests: int) -> None:
    from bench_endpoint import free_port, start_service

    from inference_wrapper.engine.tiny import build_tiny_model
    from ledger.store.apikeys import ApiKeyStore

    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/ledger.db"
        upgrade(url)
        with SqlLedger(url, sqlite_synchronous="NORMAL") as ledger:
            _fill(ledger, records)
            keys = ApiKeyStore(ledger.engine)
            client, _ = keys.create("bank-0", "client")
            auditor, _ = keys.create("audit-firm", "auditor")
        build_tiny_model(Path(tmp) / "tiny")
        port = free_port()
        env = dict(os.environ, AUDIT_LEDGER_HOME=tmp, PYTHONUNBUFFERED="1")
        proc, _ = start_service([sys.executable, "-m", "audit_cli.main", "serve", "--port",
                                 str(port), "--db", url, "--model-dir", f"{tmp}/tiny",
                                 "--model-manifest", f"{tmp}/tiny.manifest.json"], env)
        try:
            asyncio.run(_export_run(f"http://127.0.0.1:{port}", client, auditor, proc.pid,
                                    requests))
        finally:
            proc.terminate()
            proc.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=None,
                        help="default 10,000 (40,000 with --export)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--export", action="store_true",
                        help="the bundle export against a running service (see above)")
    parser.add_argument("--requests", type=int, default=40,
                        help="generate calls timed without the export (--export)")
    args = parser.parse_args()
    if args.export:
        export_bench(args.records or 40_000, args.requests)
        return
    args.records = args.records or 10_000
    with tempfile.TemporaryDirectory() as folder:
        url = f"sqlite:///{Path(folder) / 'bench.db'}"
        upgrade(url)
        with SqlLedger(url, sqlite_synchronous="NORMAL") as ledger:
            _fill(ledger, args.records)
            best = {"read": float("inf"), "csv": float("inf"), "plots": float("inf")}
            for _ in range(args.rounds):
                for name, work in (("read", _read_all), ("csv", _csv_all),
                                   ("plots", _plots)):
                    started = time.perf_counter()
                    work(ledger)
                    best[name] = min(best[name], time.perf_counter() - started)
    rows = args.records + 1
    for name, label in (("read", "(a) query every row"), ("csv", "(b) CSV export"),
                        ("plots", "(c) plots page work")):
        print(f"{label:24s} {rows / best[name]:10.0f} rows/s  ({best[name]:.3f} s best of "
              f"{args.rounds})")
    print(f"ratio (b)/(a): {best['csv'] / best['read']:.2f}   "
          f"ratio (c)/(a): {best['plots'] / best['read']:.2f}")


if __name__ == "__main__":
    main()
