"""The console's plots, computed from mirror rows and drawn as server-side SVG.

No I/O and no JavaScript: rows in, SVG text out (docs/decisions/0019). Every label is
escaped, because tenant names and revisions come from the records.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from html import escape
from typing import Any

# The fingerprint columns whose changes the timeline shows, with their labels.
TIMELINE_FIELDS = (
    ("model_digest", "model digest"),
    ("driver_version", "driver"),
    ("torch_version", "torch"),
    ("service_revision", "service revision"),
)


@dataclass(frozen=True)
class Point:
    """What the plots need of one mirror row (timings and batch size from its bytes)."""

    created_at: datetime
    columns: dict[str, object]
    timings_ms: dict[str, float] = dataclasses.field(default_factory=dict)
    batch_size: int | None = None
    schema: str = "audit-record/v1"  # the leaf's kind: only generate records have fingerprints

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
    """Records per UTC minute, oldest first; minutes with no record are left out."""
    counts = Counter(p.created_at.replace(second=0, microsecond=0) for p in points)
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
    """Lines over time on one shared scale, with a legend; labels escaped."""
    colours = ("#3b6ea5", "#c0392b", "#2e8b57", "#8e44ad", "#d4a017", "#555555",
               "#16a085", "#e67e22", "#7f8c8d", "#2c3e50")
    left, bottom, top = 56, 28, 24
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

    def xy(moment: datetime, value: float) -> str:
        x = left + plot_w * (moment - start).total_seconds() / span
        return f"{x:.1f},{top + plot_h - plot_h * value / peak:.1f}"

    for i, (label, values) in enumerate(series.items()):
        colour = colours[i % len(colours)]
        line = " ".join(xy(m, v) for m, v in values)
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" '
                     f'points="{line}"><title>{escape(label)}</title></polyline>')
        parts.extend(f'<circle cx="{xy(m, v).split(",")[0]}" cy="{xy(m, v).split(",")[1]}" '
                     f'r="2" fill="{colour}"><title>{escape(label)} {m:%H:%M}: '
                     f"{v:.3g} {escape(unit)}</title></circle>" for m, v in values)
        parts.append(f'<text x="{left + plot_w + 10}" y="{top + 12 + 14 * i}" '
                     f'fill="{colour}">{escape(label)}</text>')
    parts.append(f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" '
                 f'y2="{top + plot_h}" stroke="#555"/>'
                 f'<text x="4" y="{top + 10}">{peak:.3g} {escape(unit)}</text>'
                 f'<text x="4" y="{top + plot_h}">0</text>'
                 f'<text x="{left}" y="{height - 8}">{start:%Y-%m-%d %H:%M}</text>'
                 f'<text x="{left + plot_w}" y="{height - 8}" text-anchor="end">'
                 f"{end:%Y-%m-%d %H:%M} UTC</text>")
    return "".join(parts) + "</svg>"


def fingerprint_changes(points: Sequence[Point]) -> list[Change]:
    """Where each timeline column changes, in log order, with the run lengths on each side."""
    changes: list[Change] = []
    for field, _ in TIMELINE_FIELDS:
        runs: list[tuple[str, datetime, int]] = []  # value, first seen, count
        for point in points:
            if point.schema != "audit-record/v1":  # access, erasure, report... leaves
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
    left, bottom, top = 48, 28, 24
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
    parts.append(f'<text x="4" y="{top + 10}">{peak}</text>'
                 f'<text x="4" y="{top + plot_h}">0</text>'
                 f'<text x="{left}" y="{height - 8}">{start:%Y-%m-%d %H:%M}</text>'
                 f'<text x="{left + plot_w}" y="{height - 8}" text-anchor="end">'
                 f"{end:%Y-%m-%d %H:%M} UTC</text>")
    return "".join(parts) + "</svg>"


def timeline_svg(points: Sequence[Point], changes: Sequence[Change], *,
                 width: int = 720) -> str:
    """One lane per fingerprint column, a mark where its value changed."""
    lane_h, left, top = 34, 130, 24
    height = top + lane_h * len(TIMELINE_FIELDS) + 24
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
    parts.append(f'<text x="{left}" y="{height - 6}">{start:%Y-%m-%d %H:%M}</text>'
                 f'<text x="{left + plot_w}" y="{height - 6}" text-anchor="end">'
                 f"{end:%Y-%m-%d %H:%M} UTC</text>")
    return "".join(parts) + "</svg>"
