"""SLO burn rates on /metrics, and the readiness history that availability is measured on.

A sampler task, every ``slo_sample_interval_s``: evaluates the same checks as /readyz,
extends this replica's current span in ``readiness_history`` (a new row when the state
changes), notes whether anchoring lag is over its target, and snapshots the cumulative
request-latency histogram. At scrape, the collector compares the histogram now with the
snapshot one window ago (5 m, 1 h) and turns the difference into burn rates with the
pure arithmetic of ``ledger.slo``. Nothing here queries the database at scrape time.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta

from aiohttp import web
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import insert, select, update
from sqlalchemy.engine import Engine

from inference_wrapper.server.appkeys import ANCHOR_WORKER, INTEGRATOR, LEDGER, METRICS, SETTINGS
from inference_wrapper.server.metrics import Metrics
from inference_wrapper.server.settings import Settings
from ledger import slo
from ledger.errors import InvalidInputError
from ledger.store.schema import readiness_history

log = logging.getLogger("audit_ledger.slo")

WINDOWS = (("5m", 300.0), ("1h", 3600.0))
# The availability history the replica keeps in memory (older spans stay in the table).
MEMORY_S = 3600.0
# How often other replicas' spans are re-read (one indexed query).
OTHERS_REFRESH_S = 30.0
SLO_TRACKER: web.AppKey[SloTracker] = web.AppKey("slo_tracker")

Buckets = list[tuple[float, float]]


def _now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def latency_buckets(metrics: Metrics) -> dict[str, Buckets]:
    """Cumulative (le, count) per route, summed over methods, from the live histogram."""
    per_route: dict[str, dict[float, float]] = {}
    for family in metrics.request_latency.collect():
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                bound = float(sample.labels["le"])
                route = per_route.setdefault(sample.labels["route"], {})
                route[bound] = route.get(bound, 0.0) + sample.value
    return {route: sorted(b.items()) for route, b in per_route.items()}


class ReadinessHistory:
    """This replica's spans: in memory for scrapes, in the table across restarts."""

    def __init__(self, engine: Engine, replica: str) -> None:
        self.engine, self.replica = engine, replica
        self.spans: list[slo.ReadinessSpan] = []
        self._row_id: int | None = None

    def load(self, since: datetime) -> None:
        """Spans of every replica ending after ``since`` (a restart's gap is downtime)."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(readiness_history)
                                .where(readiness_history.c.ended_at >= since)
                                .order_by(readiness_history.c.started_at)).all()
        self.spans = [slo.ReadinessSpan(r.replica, bool(r.ready), r.started_at, r.ended_at,
                                        bool(r.clean_stop)) for r in rows]

    def refresh_others(self, since: datetime) -> None:
        """Other replicas' spans from the table: the service is up while any is ready."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(readiness_history)
                                .where(readiness_history.c.ended_at >= since,
                                       readiness_history.c.replica != self.replica)
                                .order_by(readiness_history.c.started_at)).all()
        others = [slo.ReadinessSpan(r.replica, bool(r.ready), r.started_at, r.ended_at,
                                    bool(r.clean_stop)) for r in rows]
        # List replaced whole, own spans kept in order at the end (observe edits [-1]).
        self.spans = others + [s for s in self.spans if s.replica == self.replica]

    def observe(self, ready: bool, at: datetime) -> None:
        current = self.spans[-1] if self._row_id is not None and self.spans else None
        with self.engine.begin() as conn:
            if current is not None and current.ready == ready:
                conn.execute(update(readiness_history)
                             .where(readiness_history.c.id == self._row_id)
                             .values(ended_at=at))
                self.spans[-1] = slo.ReadinessSpan(self.replica, ready, current.start, at)
                return
            if current is not None:  # the old state ends where the new one starts
                conn.execute(update(readiness_history)
                             .where(readiness_history.c.id == self._row_id)
                             .values(ended_at=at))
                self.spans[-1] = slo.ReadinessSpan(self.replica, current.ready,
                                                   current.start, at)
            start = at
            result = conn.execute(insert(readiness_history).values(
                replica=self.replica, ready=int(ready), started_at=start, ended_at=at))
            key = result.inserted_primary_key
            assert key is not None
            self._row_id = int(key[0])
            self.spans.append(slo.ReadinessSpan(self.replica, ready, start, at))
        horizon = at - timedelta(seconds=MEMORY_S * 2)
        self.spans = [s for s in self.spans if s.end >= horizon or s is self.spans[-1]]

    def as_of(self, at: datetime) -> list[slo.ReadinessSpan]:
        """The spans with this replica's open one carried up to ``at`` (it is still in
        that state: the next sample has simply not been taken yet)."""
        spans = list(self.spans)
        if self._row_id is not None and spans and spans[-1].end < at:
            last = spans[-1]
            spans[-1] = slo.ReadinessSpan(last.replica, last.ready, last.start, at)
        return spans

    def close(self, at: datetime) -> None:
        """A clean shutdown: the gap until the next start is planned, not downtime."""
        if self._row_id is None:
            return
        with self.engine.begin() as conn:
            conn.execute(update(readiness_history).where(readiness_history.c.id == self._row_id)
                         .values(ended_at=at, clean_stop=1))
        last = self.spans[-1]
        self.spans[-1] = slo.ReadinessSpan(last.replica, last.ready, last.start, at, True)
        self._row_id = None


class SloTracker(Collector):
    def __init__(self, metrics: Metrics, history: ReadinessHistory, *,
                 targets: dict[str, slo.LatencyTarget], downtime_min_per_month: float,
                 max_outage_s: float, anchor_lag_s: float, anchor_lag_budget: float,
                 interval_s: float) -> None:
        self.metrics, self.history, self.targets = metrics, history, targets
        self.availability_budget = slo.availability_budget(downtime_min_per_month)
        self.max_outage_s, self.anchor_lag_s = max_outage_s, anchor_lag_s
        self.anchor_lag_budget = anchor_lag_budget
        keep = int(max(w for _, w in WINDOWS) / max(interval_s, 0.01)) + 2
        # (monotonic time, latency buckets per route, anchor samples, anchor samples over)
        self.snapshots: deque[tuple[float, dict[str, Buckets], int, int]] = deque(maxlen=keep)
        self.anchor_samples = self.anchor_over = 0
        self.refreshed = time.monotonic()  # load() has just read every replica's spans
        self.lock = threading.Lock()

    def sample(self, ready: bool, anchor_lag_s: float) -> None:
        at = _now()
        if time.monotonic() - self.refreshed >= OTHERS_REFRESH_S:
            self.history.refresh_others(at - timedelta(seconds=MEMORY_S))
            self.refreshed = time.monotonic()
        self.history.observe(ready, at)
        with self.lock:
            self.anchor_samples += 1
            self.anchor_over += int(anchor_lag_s > self.anchor_lag_s)
            self.snapshots.append((time.monotonic(), latency_buckets(self.metrics),
                                   self.anchor_samples, self.anchor_over))

    def _baseline(self, window_s: float) -> tuple[float, dict[str, Buckets], int, int] | None:
        """The newest snapshot at least ``window_s`` old; None while the process is younger
        than the window (the window then counts from zero: everything since start)."""
        cutoff = time.monotonic() - window_s
        chosen = None
        for snapshot in self.snapshots:
            if snapshot[0] > cutoff:
                break
            chosen = snapshot
        return chosen

    def collect(self) -> Iterator[GaugeMetricFamily]:
        burn = GaugeMetricFamily(
            "audit_slo_burn_rate", "fraction of the SLO's error budget consumed per unit "
            "time, relative to spending it evenly over the period (1 = on budget)",
            labels=["slo", "window"])
        jitter = GaugeMetricFamily("audit_slo_jitter_seconds", "p99 - p50 latency of the "
                                   "window, per route", labels=["route", "window"])
        target = GaugeMetricFamily("audit_slo_target", "the SLO targets in force (seconds, "
                                   "or minutes per month for availability)",
                                   labels=["slo", "kind"])
        now_latency = latency_buckets(self.metrics)
        with self.lock:
            anchor_now = (self.anchor_samples, self.anchor_over)
            baselines = {name: self._baseline(w) for name, w in WINDOWS}
        at = _now()
        spans = self.history.as_of(at)
        for name, window_s in WINDOWS:
            base = baselines[name]
            for route, goal in self.targets.items():
                delta = slo.subtract(now_latency.get(route, []),
                                     base[1].get(route) if base else None)
                slow, total = slo.slower_than(delta, goal.p99_s)
                burn.add_metric([f"latency:{route}", name],
                                slo.burn_rate(slow, total, slo.LATENCY_BUDGET))
                jitter.add_metric([route, name], slo.quantile(delta, 0.99)
                                  - slo.quantile(delta, 0.5))
            samples = anchor_now[0] - (base[2] if base else 0)
            over = anchor_now[1] - (base[3] if base else 0)
            burn.add_metric(["anchor_lag", name],
                            slo.burn_rate(over, samples, self.anchor_lag_budget))
            measured = slo.availability(spans,
                                        slo.window_start(at, window_s), at)
            burn.add_metric(["availability", name],
                            slo.burn_rate(measured.downtime_s, measured.observed_s,
                                          self.availability_budget))
        for route, goal in self.targets.items():
            target.add_metric([f"latency:{route}", "p99_s"], goal.p99_s)
            target.add_metric([f"latency:{route}", "jitter_s"], goal.jitter_s)
        target.add_metric(["availability", "downtime_min_per_month"],
                          self.availability_budget * slo.MONTH_S / 60.0)
        target.add_metric(["availability", "max_outage_s"], self.max_outage_s)
        target.add_metric(["anchor_lag", "lag_s"], self.anchor_lag_s)
        hour = slo.availability(spans, slo.window_start(at, MEMORY_S), at)
        yield burn
        yield jitter
        yield target
        yield GaugeMetricFamily("audit_slo_longest_outage_seconds", "longest time no "
                                "replica was ready in the last hour", value=hour.longest_outage_s)


def check_settings(settings: Settings) -> dict[str, slo.LatencyTarget]:
    """Refuse SLO settings that would make a budget zero or a target meaningless, naming
    the setting; returns the latency targets."""
    targets = slo.parse_latency_targets(settings.slo_latency)
    bounds = {
        "AUDIT_LEDGER_SLO_DOWNTIME_MIN_PER_MONTH": (settings.slo_downtime_min_per_month,
                                                    slo.MONTH_S / 60.0),
        "AUDIT_LEDGER_SLO_MAX_OUTAGE_S": (settings.slo_max_outage_s, math.inf),
        "AUDIT_LEDGER_SLO_ANCHOR_LAG_BUDGET": (settings.slo_anchor_lag_budget, 1.0),
        "AUDIT_LEDGER_SLO_SAMPLE_INTERVAL_S": (settings.slo_sample_interval_s, 3600.0),
    }
    for name, (value, upper) in bounds.items():
        if not 0 < value <= upper:
            raise InvalidInputError(name, f"must be above 0 and at most {upper:g}")
    return targets


async def slo_context(app: web.Application) -> AsyncIterator[None]:
    """Start the sampler after every worker exists; record a clean stop on the way out."""
    from inference_wrapper.server.routes_ops import readiness_checks

    settings = app[SETTINGS]
    history = ReadinessHistory(app[LEDGER].engine, app[INTEGRATOR].replica_id)
    await asyncio.to_thread(history.load, _now() - timedelta(seconds=MEMORY_S))
    tracker = SloTracker(app[METRICS], history,
                         targets=check_settings(settings),
                         downtime_min_per_month=settings.slo_downtime_min_per_month,
                         max_outage_s=settings.slo_max_outage_s,
                         anchor_lag_s=settings.anchor_lag_slo_s,
                         anchor_lag_budget=settings.slo_anchor_lag_budget,
                         interval_s=settings.slo_sample_interval_s)
    app[SLO_TRACKER] = tracker
    app[METRICS].registry.register(tracker)
    worker = app[ANCHOR_WORKER]

    async def sampler() -> None:
        while True:
            try:
                ready = all((await readiness_checks(app)).values())
                await asyncio.to_thread(tracker.sample, ready, worker.current().lag_s)
            except Exception:  # the database is away: the gap itself reads as downtime
                log.warning("could not record readiness for the SLO history")
            await asyncio.sleep(settings.slo_sample_interval_s)

    task = asyncio.get_running_loop().create_task(sampler(), name="slo-sampler")
    yield
    task.cancel()
    try:
        await asyncio.to_thread(history.close, _now())
    except Exception:
        log.warning("could not record the clean stop in the readiness history")
