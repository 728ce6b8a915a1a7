"""The console's plots, computed from mirror rows and drawn as server-side SVG.

No I/O and no JavaScript: rows in, SVG text out (docs/decisions/0019). Every label is
escaped with its control and bidi characters spelled out (``visible``), because tenant
names, phases and revisions come from the records. Values carry human units ("1.39 s",
not "1.39e+03 ms") and the time axis has ticks on round UTC times.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from html import escape as _escape
from typing import Any

from inference_wrapper.server.console_pages import visible
from ledger.leaves.record_v2 import RECORD_KIND
from ledger.record import RECORD_SCHEMA

# The fingerprint columns whose changes the timeline shows, with their labels. A v2
# record's columns are those of the environment leaf it names (the mirror fills them in).
TIMELINE_FIELDS = (
    ("model_digest", "model digest"),
    ("accelerator_model", "accelerator"),
    ("driver_version", "driver"),
    ("torch_version", "torch"),
    ("service_revision", "service revision"),
)


# Tick steps on the time axis, the smallest that gives at most MAX_TICKS ticks.
TICK_STEPS = tuple(timedelta(seconds=s) for s in (
    1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200,
    86400, 172800, 604800))
MAX_TICKS = 7


def escape(text: object) -> str:
    """Untrusted text for SVG: control and bidi characters spelled, then escaped."""
    return _escape(visible(text))


def human(value: float, unit: str) -> str:
    """A value with a unit a reader takes in at a glance: 1390 ms is "1.39 s", 0.2 ms is
    "200 µs", 95 s is "1.58 min"; counts keep their digits ("1,234")."""
    if unit in ("ms", "s"):
        ms = value * 1000 if unit == "s" else value
        for size, name in ((60_000.0, "min"), (1000.0, "s"), (1.0, "ms")):
            if abs(ms) >= size:
                return f"{ms / size:.3g} {name}"
        return "0 ms" if ms == 0 else f"{ms * 1000:.3g} µs"
    text = f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"
    return f"{text} {unit}".strip()


def time_ticks(start: datetime, end: datetime) -> list[datetime]:
    """Round UTC times from ``start`` to ``end``: every step of the first size in
    ``TICK_STEPS`` that gives at most ``MAX_TICKS`` of them."""
    span = end - start
    step = next((s for s in TICK_STEPS if span / s <= MAX_TICKS), TICK_STEPS[-1])
    seconds = int(step.total_seconds())
    first = start.replace(microsecond=0)
    epoch = datetime(1970, 1, 1, tzinfo=start.tzinfo)
    offset = int((first - epoch).total_seconds())
    tick = epoch + timedelta(seconds=-(-offset // seconds) * seconds)
    ticks = []
    while tick <= end:
        ticks.append(tick)
        tick += step
    return ticks


def tick_label(moment: datetime, step: timedelta) -> str:
    if step < timedelta(minutes=1):
        return f"{moment:%H:%M:%S}"
    if step < timedelta(days=1) and moment.hour + moment.minute:
        return f"{moment:%H:%M}"
    return f"{moment:%m-%d %H:%M}"


def _time_axis(start: datetime, end: datetime, left: float, plot_w: float, y: float
               ) -> str:
    """Tick marks and labels along the time axis, and the span's dates in full."""
    span = max((end - start).total_seconds(), 1.0)
    ticks = time_ticks(start, end)
    step = ticks[1] - ticks[0] if len(ticks) > 1 else timedelta(minutes=1)
    parts = []
    for tick in ticks:
        x = left + plot_w * (tick - start).total_seconds() / span
        parts.append(f'<line class="tick" x1="{x:.1f}" y1="{y}" x2="{x:.1f}" y2="{y + 4}" '
                     f'stroke="#555"/><text class="tick-label" x="{x:.1f}" y="{y + 14}" '
                     f'text-anchor="middle">{tick_label(tick, step)}</text>')
    return "".join(parts)


@dataclass(frozen=True)
class Point:
    """What the plots need of one mirror row (timings and batch size from its bytes)."""

    created_at: datetime
    columns: dict[str, object]
    timings_ms: dict[str, float] = dataclasses.field(default_factory=dict)
    batch_size: int | None = None
    schema: str = RECORD_SCHEMA  # the leaf's kind: only generate records have fingerprints

    @classmethod
    def from_record(cls, created_at: datetime, columns: dict[str, object],
                    body: Mapping[str, Any]) -> Point:
        timings = body.get("timings_ms")
        # A v2 record holds its batch at the top; a v1 record under data.
        batch = body.get("batch") or (body.get("data") or {}).get("batch") or {}
        size = batch.get("size") if isinstance(batch, Mapping) else None
        return cls(created_at, columns,
                   {k: float(v) for k, v in timings.items() if isinstance(v, int | float)}
                   if isinstance(timings, Mapping) else {},
                   size if isinstance(size, int) else None,
                   str(body.get("schema", "")))


@dataclass(frozen=True)
class Change:
    """One fingerprint column changing value between two consecutive records."""

    field: str
    at: datetime
    before: str
    after: str
    records_before: int  # records in the run that ended with this change
    records_after: int  # records in the run that began with it


def per_minute(points: Iterable[Point]) -> list[tuple[datetime, int]]:
    """Generate records per UTC minute, oldest first; minutes with none are left out.
    A stream's start, a content read, an erasure or a report is a leaf too, not a request."""
    counts = Counter(p.created_at.replace(second=0, microsecond=0) for p in points
                     if p.schema in RECORD_SCHEMAS)
    return sorted(counts.items())


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in (0, 100]) of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil without floats drifting
    return ordered[int(rank) - 1]


def phase_percentiles(points: Iterable[Point]) -> dict[str, list[tuple[datetime, float]]]:
    """p50 and p99 per minute of each recorded phase and of their total, in ms."""
    by_minute: dict[datetime, dict[str, list[float]]] = {}
    for p in points:
        if not p.timings_ms:
            continue
        minute = by_minute.setdefault(p.created_at.replace(second=0, microsecond=0), {})
        for phase, ms in {**p.timings_ms, "total": sum(p.timings_ms.values())}.items():
            minute.setdefault(phase, []).append(ms)
    series: dict[str, list[tuple[datetime, float]]] = {}
    for moment in sorted(by_minute):
        for phase, values in by_minute[moment].items():
            for q in (50, 99):
                series.setdefault(f"{phase} p{q}", []).append((moment, percentile(values, q)))
    return series


def per_phase(series: Mapping[str, Sequence[tuple[datetime, float]]]
              ) -> dict[str, dict[str, Sequence[tuple[datetime, float]]]]:
    """``phase_percentiles``' lines grouped by phase (one plot each), labels kept."""
    grouped: dict[str, dict[str, Sequence[tuple[datetime, float]]]] = {}
    for label, values in series.items():
        grouped.setdefault(label.rpartition(" ")[0], {})[label] = values
    return grouped


def mean_batch_size(points: Iterable[Point]) -> list[tuple[datetime, float]]:
    """Mean recorded batch size per minute (records without one are left out)."""
    sums: dict[datetime, list[int]] = {}
    for p in points:
        if p.batch_size is not None:
            sums.setdefault(p.created_at.replace(second=0, microsecond=0), []).append(
                p.batch_size)
    return [(m, sum(v) / len(v)) for m, v in sorted(sums.items())]


def line_chart_svg(series: Mapping[str, Sequence[tuple[datetime, float]]], *, title: str,
                   unit: str, width: int = 720, height: int = 240) -> str:
    """Lines over time on one shared scale, with a legend, a value axis in human units
    and time ticks; labels escaped."""
    colours = ("#3b6ea5", "#c0392b", "#2e8b57", "#8e44ad", "#d4a017", "#555555",
               "#16a085", "#e67e22", "#7f8c8d", "#2c3e50")
    left, bottom, top = 64, 40, 24
    plot_w, plot_h = width - left - 150, height - bottom - top
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" role="img" class="plot" '
             f'width="{width}" height="{height}" viewBox="0 0 {width} {height}">',
             f"<title>{escape(title)}</title>",
             f'<text x="{left}" y="16" class="plot-title">{escape(title)}</text>']
    points = [pt for values in series.values() for pt in values]
    if not points:
        parts.append(f'<text x="{left + 8}" y="{top + plot_h // 2}">no data in range</text>')
        return "".join(parts) + "</svg>"
    start = min(m for m, _ in points)
    end = max(m for m, _ in points)
    span = max((end - start).total_seconds(), 1.0)
    peak = max(v for _, v in points) or 1.0

    def xy(moment: datetime, value: float) -> tuple[float, float]:
        return (left + plot_w * (moment - start).total_seconds() / span,
                top + plot_h - plot_h * value / peak)

    for fraction in (0.0, 0.5, 1.0):  # the value axis: 0, half the peak, the peak
        y = top + plot_h - plot_h * fraction
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" '
                     f'stroke="#e4e4e4"/><text class="value-label" x="{left - 4}" '
                     f'y="{y + 4:.1f}" text-anchor="end">{escape(human(peak * fraction, unit))}'
                     "</text>")
    for i, (label, values) in enumerate(series.items()):
        colour = colours[i % len(colours)]
        line = " ".join("{:.1f},{:.1f}".format(*xy(m, v)) for m, v in values)
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" '
                     f'points="{line}"><title>{escape(label)}</title></polyline>')
        parts.extend('<circle cx="{:.1f}" cy="{:.1f}" '.format(*xy(m, v))
                     + f'r="2" fill="{colour}"><title>{escape(label)} {m:%H:%M}: '
                     f"{escape(human(v, unit))}</title></circle>" for m, v in values)
        parts.append(f'<text x="{left + plot_w + 10}" y="{top + 12 + 14 * i}" '
                     f'fill="{colour}">{escape(label)}</text>')
    parts.append(f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" '
                 f'y2="{top + plot_h}" stroke="#555"/>'
                 + _time_axis(start, end, left, plot_w, top + plot_h)
                 + f'<text x="{left + plot_w}" y="{height - 4}" text-anchor="end">'
                 f"{start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC</text>")
    return "".join(parts) + "</svg>"


def phase_charts_svg(points: Iterable[Point], *, title: str) -> str:
    """One plot per recorded phase (and their total): p50 and p99 per minute."""
    grouped = per_phase(phase_percentiles(points))
    if not grouped:
        return line_chart_svg({}, title=title, unit="ms")
    return "".join(
        f'<div class="phase" data-phase="{escape(phase)}">'
        + line_chart_svg(lines, title=f"{phase}: {title}", unit="ms") + "</div>"
        for phase, lines in sorted(grouped.items(), key=lambda kv: (kv[0] == "total", kv[0])))


# The leaves that are inference records (v1 and v2, in one log): only they have fingerprints.
RECORD_SCHEMAS = frozenset((RECORD_SCHEMA, RECORD_KIND))


def fingerprint_changes(points: Sequence[Point]) -> list[Change]:
    """Where each timeline column changes, in log order, with the run lengths on each side.

    v1 and v2 records form one run per column: a v2 record's value is its environment
    leaf's, so a change of environment between v2 records (or from v1 to v2) is a change.
    """
    changes: list[Change] = []
    for field, _ in TIMELINE_FIELDS:
        runs: list[tuple[str, datetime, int]] = []  # value, first seen, count
        for point in points:
            if point.schema not in RECORD_SCHEMAS:  # access, erasure, report... leaves
                continue
            value = str(point.columns.get(field) or "unknown")
            if runs and runs[-1][0] == value:
                runs[-1] = (value, runs[-1][1], runs[-1][2] + 1)
            else:
                runs.append((value, point.created_at, 1))
        for before, after in zip(runs, runs[1:], strict=False):
            changes.append(Change(field, after[1], before[0], after[0], before[2], after[2]))
    return sorted(changes, key=lambda c: c.at)


def bar_chart_svg(series: Sequence[tuple[datetime, int]], *, title: str,
                  width: int = 720, height: int = 220) -> str:
    """A bar chart of counts over time, with its largest value and time span labelled."""
    left, bottom, top = 48, 40, 24
    plot_w, plot_h = width - left - 8, height - bottom - top
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" role="img" class="plot" '
             f'width="{width}" height="{height}" viewBox="0 0 {width} {height}">',
             f"<title>{escape(title)}</title>",
             f'<text x="{left}" y="16" class="plot-title">{escape(title)}</text>',
             f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" '
             f'y2="{top + plot_h}" stroke="#555"/>']
    if not series:
        parts.append(f'<text x="{left + 8}" y="{top + plot_h // 2}">no records in range</text>')
        return "".join(parts) + "</svg>"
    peak = max(count for _, count in series)
    start, end = series[0][0], series[-1][0]
    span_min = max(1, int((end - start).total_seconds() // 60) + 1)
    bar_w = max(1.0, plot_w / span_min * 0.8)  # a visible gap at any scale
    for moment, count in series:
        x = left + (moment - start).total_seconds() / 60 * (plot_w / span_min)
        h = plot_h * count / peak
        parts.append(f'<rect x="{x:.1f}" y="{top + plot_h - h:.1f}" width="{bar_w:.1f}" '
                     f'height="{h:.1f}" fill="#3b6ea5"><title>{moment:%Y-%m-%d %H:%M} UTC: '
                     f"{count}</title></rect>")
    parts.append(f'<text x="4" y="{top + 10}">{human(peak, "")}</text>'
                 f'<text x="4" y="{top + plot_h}">0</text>'
                 + _time_axis(start, start + timedelta(minutes=span_min), left, plot_w,
                              top + plot_h)
                 + f'<text x="{left + plot_w}" y="{height - 4}" text-anchor="end">'
                 f"{start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC</text>")
    return "".join(parts) + "</svg>"


def timeline_svg(points: Sequence[Point], changes: Sequence[Change], *,
                 width: int = 720) -> str:
    """One lane per fingerprint column, a mark where its value changed."""
    lane_h, left, top = 34, 130, 24
    height = top + lane_h * len(TIMELINE_FIELDS) + 36
    plot_w = width - left - 16
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" role="img" class="plot" '
             f'width="{width}" height="{height}" viewBox="0 0 {width} {height}">',
             "<title>fingerprint changes</title>",
             '<text x="8" y="16" class="plot-title">fingerprint changes</text>']
    if not points:
        parts.append(f'<text x="{left}" y="{top + 20}">no records in range</text>')
        return "".join(parts) + "</svg>"
    # Log order is not time order (several writers, clocks): scale by the extremes.
    start = min(p.created_at for p in points)
    end = max(p.created_at for p in points)
    span = max((end - start).total_seconds(), 1.0)
    for lane, (field, label) in enumerate(TIMELINE_FIELDS):
        y = top + lane * lane_h + lane_h // 2
        parts.append(f'<text x="8" y="{y + 4}">{escape(label)}</text>'
                     f'<line x1="{left}" y1="{y}" x2="{left + plot_w}" y2="{y}" '
                     f'stroke="#bbb"/>')
        for change in (c for c in changes if c.field == field):
            x = left + plot_w * (change.at - start).total_seconds() / span
            tip = (f"{change.at:%Y-%m-%d %H:%M:%S} UTC: {change.before} "
                   f"({change.records_before} records) -> {change.after} "
                   f"({change.records_after} records)")
            parts.append(f'<circle cx="{x:.1f}" cy="{y}" r="6" fill="#c0392b" '
                         f'class="change"><title>{escape(tip)}</title></circle>')
    axis_y = top + lane_h * len(TIMELINE_FIELDS)
    parts.append(_time_axis(start, end, left, plot_w, axis_y)
                 + f'<text x="{left + plot_w}" y="{height - 4}" text-anchor="end">'
                 f"{start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC</text>")
    return "".join(parts) + "</svg>"
