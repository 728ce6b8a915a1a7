"""What the SLO collector adds to a /metrics scrape: generate_latest of one registry with
and without it, side by side (a full hour of snapshots, three routes with traffic).

    .venv/bin/python bench/bench_slo.py
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta

from prometheus_client import generate_latest

from inference_wrapper.server.metrics import Metrics
from inference_wrapper.server.slo import SloTracker
from ledger import slo

ROUTES = ("/v1/generate", "/v1/completions", "/v1/chat/completions")


class MemoryHistory:
    """A readiness history without a table: one span per minute over the hour."""

    def __init__(self) -> None:
        start = datetime(2026, 11, 30, 9, 0, 0)
        self.spans = [slo.ReadinessSpan("r1", i % 10 != 0, start + timedelta(minutes=i),
                                        start + timedelta(minutes=i + 1)) for i in range(60)]

    def as_of(self, at: datetime) -> list[slo.ReadinessSpan]:
        return self.spans

    def observe(self, ready: bool, at: datetime) -> None:
        pass

    def refresh_others(self, since: datetime) -> None:
        pass


def best_of(fn: object, runs: int = 200) -> float:
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(runs):
            fn()  # type: ignore[operator]
        best = min(best, (time.perf_counter() - started) / runs)
    return best


def main() -> None:
    plain, with_slo = Metrics(), Metrics()
    for metrics in (plain, with_slo):
        for i in range(3000):
            metrics.request_latency.labels(ROUTES[i % 3], "POST").observe((i % 97) / 50)
    tracker = SloTracker(with_slo, MemoryHistory(),  # type: ignore[arg-type]
                         targets={r: slo.LatencyTarget(r, 2.5, 2.0) for r in ROUTES},
                         downtime_min_per_month=43.2, max_outage_s=300, anchor_lag_s=10,
                         anchor_lag_budget=0.01, interval_s=5.0)
    for _ in range(720):  # an hour of 5 s samples
        tracker.sample(True, 1.0)
    with_slo.registry.register(tracker)
    base = best_of(lambda: generate_latest(plain.registry))
    slo_s = best_of(lambda: generate_latest(with_slo.registry))
    print(f"scrape without SLO collector: {base * 1e3:.2f} ms")
    print(f"scrape with SLO collector:    {slo_s * 1e3:.2f} ms ({slo_s / base:.2f}x)")


if __name__ == "__main__":
    main()
