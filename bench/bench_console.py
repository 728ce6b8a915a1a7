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
"""

from __future__ import annotations

import argparse
import tempfile
import time
from datetime import datetime
from pathlib import Path

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
        rows, cursor = ledger.query(since=SINCE, until=UNTIL, limit=CSV_PAGE, cursor=cursor)
        total += len(rows)
        if cursor is None:
            return total


def _csv_all(ledger: SqlLedger) -> int:
    cursor, total, first = None, 0, True
    while True:
        rows, cursor = ledger.query(since=SINCE, until=UNTIL, limit=CSV_PAGE, cursor=cursor)
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
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
