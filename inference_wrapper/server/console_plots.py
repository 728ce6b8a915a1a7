"""The console's plots, computed from mirror rows and drawn as server-side SVG.

No I/O and no JavaScript: rows in, SVG text out (docs/decisions/0019). Every label is
escaped, because tenant names and revisions come from the records.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from html import escape

# The fingerprint columns whose changes the timeline shows, with their labels.
TIMELINE_FIELDS = (
    ("model_digest", "model digest"),
    ("driver_version", "driver"),
    ("torch_version", "torch"),
    ("service_revision", "service revision"),
)


@dataclass(frozen=True)
class Point:
    """What the plots need of one mirror row."""

    created_at: datetime
    columns: dict[str, object]


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


def fingerprint_changes(points: Sequence[Point]) -> list[Change]:
    """Where each timeline column changes, in log order, with the run lengths on each side."""
    changes: list[Change] = []
    for field, _ in TIMELINE_FIELDS:
        runs: list[tuple[str, datetime, int]] = []  # value, first seen, count
        for point in points:
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
    bar_w = max(1.0, plot_w / span_min - 1)
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
