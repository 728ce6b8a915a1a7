"""SLO arithmetic: error budgets, burn rates, histogram quantiles and downtime. Pure.

Definitions (README "SLOs"):

- latency: a route meets its p99 target when at most 1 % of its requests are slower than
  the target; the error budget is that 1 %.
- jitter: p99 - p50 of the same latency distribution (not the standard deviation: a
  tail measure, robust to a handful of huge outliers, and computable from a histogram).
- availability: the service is down while no replica reports ready; the budget is the
  allowed minutes of unplanned downtime per 30-day month. A gap in the history that
  follows a clean shutdown is planned and not counted; any other gap is downtime.
- burn rate: the fraction of the error budget consumed per unit time, relative to
  spending it evenly. 1.0 spends the budget exactly over the SLO period; 14.4 over an
  hour spends 2 % of a 30-day budget in that hour.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from ledger.errors import InvalidInputError

MONTH_S = 30 * 24 * 3600.0
LATENCY_BUDGET = 0.01  # p99: one request in a hundred may be slower than the target


def burn_rate(bad: float, total: float, budget: float) -> float:
    """Observed bad fraction over the allowed fraction; 0 when nothing was observed."""
    if budget <= 0:
        raise ValueError("an error budget must be positive")
    if total <= 0:
        return 0.0
    return (bad / total) / budget


def availability_budget(downtime_min_per_month: float) -> float:
    """The allowed down fraction of time, e.g. 43.2 min/month -> 0.001 (99.9 %)."""
    return downtime_min_per_month * 60.0 / MONTH_S


def slower_than(buckets: Sequence[tuple[float, float]], target_s: float) -> tuple[float, float]:
    """(requests slower than target, all requests) from cumulative ``(le, count)`` buckets.

    The target is rounded up to the next bucket bound: a histogram cannot say where inside
    a bucket a request fell, so requests there are counted as meeting the target.
    """
    if not buckets:
        return 0.0, 0.0
    total = buckets[-1][1]
    within = 0.0
    for bound, count in buckets:
        if bound >= target_s:
            within = count
            break
    return total - within, total


def quantile(buckets: Sequence[tuple[float, float]], q: float) -> float:
    """The q-quantile of cumulative ``(le, count)`` buckets, linear inside a bucket (as
    Prometheus' histogram_quantile); NaN without observations. The +Inf bucket answers
    with the largest finite bound."""
    if not buckets or buckets[-1][1] <= 0:
        return math.nan
    rank = q * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (
                count - lower_count)
        lower_bound, lower_count = bound, count
    return lower_bound


def exact_quantile(values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile of raw values (the report has every record's own timing)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def subtract(later: Sequence[tuple[float, float]],
             earlier: Sequence[tuple[float, float]] | None) -> list[tuple[float, float]]:
    """Bucket counts observed between two snapshots of the same cumulative histogram."""
    if not earlier:
        return list(later)
    before = dict(earlier)
    return [(bound, count - before.get(bound, 0.0)) for bound, count in later]


# --- availability --------------------------------------------------------------------


@dataclass(frozen=True)
class ReadinessSpan:
    """One replica's observed state from ``start`` to ``end``; ``clean_stop``: the span
    ended in a clean shutdown, so the gap after it (until any replica is seen) is planned."""

    replica: str
    ready: bool
    start: datetime
    end: datetime
    clean_stop: bool = False


@dataclass(frozen=True)
class Availability:
    observed_s: float  # time from the first observation in range to the end of the range
    downtime_s: float
    longest_outage_s: float
    outages: int

    @property
    def downtime_min(self) -> float:
        return self.downtime_s / 60.0


Interval = tuple[datetime, datetime]


def _union(intervals: Iterable[Interval]) -> list[Interval]:
    merged: list[Interval] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _clip(intervals: Iterable[Interval], lo: datetime, hi: datetime) -> list[Interval]:
    return [(max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi]


def availability(spans: Sequence[ReadinessSpan], since: datetime,
                 until: datetime) -> Availability:
    """Downtime in ``[since, until)``: time no replica was ready, less planned gaps.

    Time before the first observation is not counted (the service did not exist yet);
    time after the last observation up to ``until`` is, unless it follows a clean stop.
    """
    if not spans:
        return Availability(0.0, 0.0, 0.0, 0)
    first = min(s.start for s in spans)
    lo = max(since, first)
    if lo >= until:
        return Availability(0.0, 0.0, 0.0, 0)
    up = _union((s.start, s.end) for s in spans if s.ready)
    starts = sorted(s.start for s in spans)
    planned: list[Interval] = []
    for span in spans:
        if span.clean_stop:
            later = [t for t in starts if t >= span.end]
            planned.append((span.end, later[0] if later else until))
    covered = _clip(_union(up + planned), lo, until)
    down: list[Interval] = []
    cursor = lo
    for start, end in covered:
        if start > cursor:
            down.append((cursor, start))
        cursor = max(cursor, end)
    if cursor < until:
        down.append((cursor, until))
    lengths = [(e - s).total_seconds() for s, e in down]
    return Availability((until - lo).total_seconds(), sum(lengths),
                        max(lengths, default=0.0), len(lengths))


def ready_steps(spans: Sequence[ReadinessSpan], since: datetime,
                until: datetime) -> list[tuple[datetime, float]]:
    """Replicas ready over time, as a step line: two points at each change (the count
    before and after), clipped to ``[since, until]``."""
    changes = sorted({t for s in spans for t in (s.start, s.end) if since <= t <= until}
                     | {since, until})

    def ready_at(moment: datetime) -> float:
        return float(sum(1 for s in spans if s.ready and s.start <= moment < s.end))

    steps: list[tuple[datetime, float]] = []
    for moment in changes:
        if moment == until:  # the line holds its last value to the end of the range
            steps.append((until, steps[-1][1] if steps else 0.0))
            break
        now = ready_at(moment)
        if steps and steps[-1][1] != now:
            steps.append((moment, steps[-1][1]))
        if not steps or steps[-1][1] != now:
            steps.append((moment, now))
    return steps


def window_start(now: datetime, window_s: float) -> datetime:
    return now - timedelta(seconds=window_s)


@dataclass(frozen=True)
class LatencyTarget:
    route: str
    p99_s: float
    jitter_s: float  # bound on p99 - p50


def parse_latency_targets(text: str, field: str = "AUDIT_LEDGER_SLO_LATENCY"
                          ) -> dict[str, LatencyTarget]:
    """``"/v1/generate=2.5:2.0,/v1/completions=1:0.5"`` -> targets per route."""
    targets: dict[str, LatencyTarget] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        route, sep, numbers = item.partition("=")
        p99, colon, jitter = numbers.partition(":")
        try:
            if not sep or not colon or not route.startswith("/"):
                raise ValueError(item)
            target = LatencyTarget(route, float(p99), float(jitter))
        except ValueError:
            raise InvalidInputError(field, f"{item!r} is not ROUTE=P99_S:JITTER_S") from None
        if not (target.p99_s > 0 and target.jitter_s > 0) or math.isinf(target.p99_s):
            raise InvalidInputError(field, f"{item!r}: targets must be positive seconds")
        targets[route] = target
    return targets
