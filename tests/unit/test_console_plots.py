"""The console's plot data and SVG, from mirror-like rows (pure: no server)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from datetime import datetime, timedelta

from inference_wrapper.server.console_plots import (
    Point,
    bar_chart_svg,
    fingerprint_changes,
    per_minute,
    timeline_svg,
)

T0 = datetime(2026, 11, 30, 9, 0, 0)


def point(seconds: int, **columns: object) -> Point:
    base: dict[str, object] = {"model_digest": "sha256:aa", "driver_version": "550",
                               "torch_version": "2.13.0", "service_revision": "r1"}
    return Point(T0 + timedelta(seconds=seconds), {**base, **columns})


def test_per_minute_counts_each_minute_and_skips_empty_ones() -> None:
    points = [point(0), point(59), point(60), point(600)]
    assert per_minute(points) == [(T0, 2), (T0 + timedelta(minutes=1), 1),
                                  (T0 + timedelta(minutes=10), 1)]


def test_per_minute_counts_requests_not_the_other_leaves() -> None:
    # One streamed call (its start and its record), a content read and an erasure: one
    # request. Every leaf used to count, so this plotted as four requests a minute.
    kinds = ["audit-stream-start/v2", "audit-record/v2", "access-record/v2",
             "erasure-record/v2"]
    points = [Point(T0 + timedelta(seconds=i), {}, schema=kind) for i, kind in enumerate(kinds)]
    assert per_minute(points) == [(T0, 1)]


def test_changes_name_when_and_how_many_records_on_each_side() -> None:
    points = [point(0), point(1), point(2, driver_version="560"), point(3, driver_version="560"),
              point(4, driver_version="560", service_revision="r2"),
              point(5, driver_version="550", service_revision="r2")]
    changes = fingerprint_changes(points)
    summary = [(c.field, c.at, c.before, c.after, c.records_before, c.records_after)
               for c in changes]
    assert summary == [
        ("driver_version", T0 + timedelta(seconds=2), "550", "560", 2, 3),
        ("service_revision", T0 + timedelta(seconds=4), "r1", "r2", 4, 2),
        ("driver_version", T0 + timedelta(seconds=5), "560", "550", 3, 1),
    ]


def test_no_change_when_every_fingerprint_stays() -> None:
    assert fingerprint_changes([point(i) for i in range(5)]) == []


def test_missing_values_count_as_unknown() -> None:
    changes = fingerprint_changes([point(0, driver_version=None), point(1)])
    assert [(c.before, c.after) for c in changes] == [("unknown", "550")]


def test_svg_is_well_formed_and_escapes_record_values() -> None:
    points = [point(0), point(60, service_revision="<script>x</script>&")]
    for svg in (bar_chart_svg(per_minute(points), title="a < b"),
                timeline_svg(points, fingerprint_changes(points))):
        tree = ET.fromstring(svg)  # raises on markup a value could have injected
        assert tree.tag.endswith("svg")
        assert "<script>" not in svg
    bars = ET.fromstring(bar_chart_svg(per_minute(points), title="rpm"))
    assert len(bars.findall("{http://www.w3.org/2000/svg}rect")) == 2


def test_empty_range_says_so() -> None:
    assert "no records in range" in bar_chart_svg([], title="rpm")
    assert "no records in range" in timeline_svg([], [])


def test_timeline_places_marks_inside_the_plot_when_log_order_is_not_time_order() -> None:
    # The newest record was appended first (another writer's clock ran ahead).
    points = [point(3600), point(0, driver_version="560"), point(60, driver_version="560")]
    svg = ET.fromstring(timeline_svg(points, fingerprint_changes(points)))
    marks = svg.findall("{http://www.w3.org/2000/svg}circle")
    assert len(marks) == 1
    assert 130 <= float(marks[0].get("cx", "-1")) <= 720


def test_percentile_is_nearest_rank() -> None:
    from inference_wrapper.server.console_plots import percentile

    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile([7.0], 99) == 7.0
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0


def test_phase_percentiles_per_minute_include_the_total() -> None:
    from inference_wrapper.server.console_plots import phase_percentiles

    points = [Point(T0 + timedelta(seconds=i), {}, {"forward": float(i), "decode": 1.0})
              for i in range(1, 5)]
    points.append(Point(T0 + timedelta(minutes=1), {}, {"forward": 10.0, "decode": 2.0}))
    series = phase_percentiles(points)
    assert series["forward p50"] == [(T0, 2.0), (T0 + timedelta(minutes=1), 10.0)]
    assert series["forward p99"] == [(T0, 4.0), (T0 + timedelta(minutes=1), 10.0)]
    assert series["total p99"] == [(T0, 5.0), (T0 + timedelta(minutes=1), 12.0)]


def test_points_read_timings_and_batch_size_from_the_record_body() -> None:
    from inference_wrapper.server.console_plots import mean_batch_size

    body = {"timings_ms": {"forward": 2.5, "note": "x"}, "data": {"batch": {"size": 3}}}
    first = Point.from_record(T0, {}, body)
    assert first.timings_ms == {"forward": 2.5} and first.batch_size == 3
    second = Point.from_record(T0, {}, {"data": {"batch": {"size": 1}}})
    assert mean_batch_size([first, second, Point.from_record(T0, {}, {})]) == [(T0, 2.0)]


def test_line_chart_is_well_formed_and_escapes_labels() -> None:
    from inference_wrapper.server.console_plots import line_chart_svg

    svg = line_chart_svg({"<b>p99</b>": [(T0, 1.0), (T0 + timedelta(minutes=1), 3.0)]},
                         title="t", unit="ms")
    tree = ET.fromstring(svg)
    assert len(tree.findall("{http://www.w3.org/2000/svg}polyline")) == 1
    assert "<b>" not in svg
    assert "no data in range" in line_chart_svg({"x": []}, title="t", unit="ms")


def test_leaves_of_other_kinds_are_not_fingerprint_changes() -> None:
    from datetime import datetime

    from inference_wrapper.server.console_plots import Point, fingerprint_changes

    at = datetime(2026, 11, 30, 12, 0)
    record = {"schema": "audit-record/v1"}
    points = [Point.from_record(at, {"model_digest": "sha256:aa"}, record),
              Point.from_record(at, {}, {"schema": "access-record/v1"}),
              Point.from_record(at, {"model_digest": "sha256:aa"}, record)]
    assert [c for c in fingerprint_changes(points) if c.field == "model_digest"] == []
