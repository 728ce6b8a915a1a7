"""The pure SLO arithmetic (ledger.slo) and the report leaf, with exact numbers."""

from __future__ import annotations

import math
from datetime import datetime, timedelta

import pytest

from ledger import slo
from ledger.errors import CanonicalFormError, InvalidInputError
from ledger.record import AuditRecord
from ledger.report_record import REPORT_SCHEMA, report_body

T0 = datetime(2026, 11, 30, 9, 0, 0)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def span(start: float, end: float, ready: bool = True, replica: str = "a",
         clean: bool = False) -> slo.ReadinessSpan:
    return slo.ReadinessSpan(replica, ready, at(start), at(end), clean)


# Cumulative buckets: 50 requests <= 0.1 s, 90 <= 0.5 s, 98 <= 1 s, 100 in all.
BUCKETS = [(0.1, 50.0), (0.5, 90.0), (1.0, 98.0), (math.inf, 100.0)]


def test_burn_rate_is_the_bad_fraction_over_the_budget() -> None:
    assert slo.burn_rate(2, 100, 0.01) == pytest.approx(2.0)
    assert slo.burn_rate(0, 100, 0.01) == 0.0
    assert slo.burn_rate(5, 0, 0.01) == 0.0  # nothing observed: nothing burnt
    with pytest.raises(ValueError):
        slo.burn_rate(1, 1, 0.0)


def test_availability_budget_of_43_2_minutes_is_three_nines() -> None:
    assert slo.availability_budget(43.2) == pytest.approx(0.001)


def test_slower_than_counts_above_the_target_bucket() -> None:
    assert slo.slower_than(BUCKETS, 1.0) == (2.0, 100.0)
    assert slo.slower_than(BUCKETS, 0.5) == (10.0, 100.0)
    # 0.3 s lies inside the 0.5 bucket: rounded up to its bound.
    assert slo.slower_than(BUCKETS, 0.3) == (10.0, 100.0)
    assert slo.slower_than([], 1.0) == (0.0, 0.0)


def test_quantiles_interpolate_inside_a_bucket() -> None:
    assert slo.quantile(BUCKETS, 0.5) == pytest.approx(0.1)
    # rank 70 lies halfway between 50 (0.1 s) and 90 (0.5 s).
    assert slo.quantile(BUCKETS, 0.7) == pytest.approx(0.3)
    # rank 99 is in the +Inf bucket: the largest finite bound answers.
    assert slo.quantile(BUCKETS, 0.99) == pytest.approx(1.0)
    assert math.isnan(slo.quantile([(0.1, 0.0), (math.inf, 0.0)], 0.5))


def test_subtract_gives_the_window_between_two_snapshots() -> None:
    earlier = [(0.1, 40.0), (0.5, 60.0), (1.0, 60.0), (math.inf, 60.0)]
    assert slo.subtract(BUCKETS, earlier) == [(0.1, 10.0), (0.5, 30.0), (1.0, 38.0),
                                             (math.inf, 40.0)]
    assert slo.subtract(BUCKETS, None) == BUCKETS


def test_exact_quantile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert slo.exact_quantile(values, 0.5) == 50.0
    assert slo.exact_quantile(values, 0.99) == 99.0
    assert math.isnan(slo.exact_quantile([], 0.5))


def test_downtime_is_the_time_no_replica_was_ready() -> None:
    # Replica a: ready 0-100, not ready 100-160, ready 160-300. Replica b: ready 120-140.
    spans = [span(0, 100), span(100, 160, ready=False), span(160, 300),
             span(120, 140, replica="b")]
    result = slo.availability(spans, at(0), at(300))
    assert result.observed_s == 300.0
    assert result.downtime_s == 40.0  # 100-120 and 140-160
    assert result.longest_outage_s == 20.0
    assert result.outages == 2
    assert result.downtime_min == pytest.approx(40 / 60)


def test_a_crash_gap_is_downtime_and_a_clean_stop_gap_is_not() -> None:
    crash = [span(0, 100), span(250, 300)]  # nothing recorded from 100 to 250
    assert slo.availability(crash, at(0), at(300)).downtime_s == 150.0
    planned = [span(0, 100, clean=True), span(250, 300)]
    assert slo.availability(planned, at(0), at(300)).downtime_s == 0.0


def test_time_after_the_last_observation_counts_unless_stopped_cleanly() -> None:
    assert slo.availability([span(0, 100)], at(0), at(160)).longest_outage_s == 60.0
    assert slo.availability([span(0, 100, clean=True)], at(0), at(160)).downtime_s == 0.0


def test_time_before_the_first_observation_and_outside_the_range_is_not_counted() -> None:
    spans = [span(100, 200), span(200, 260, ready=False), span(260, 400)]
    result = slo.availability(spans, at(0), at(230))
    assert result.observed_s == 130.0  # from 100, the first observation
    assert result.downtime_s == 30.0  # 200-230, clipped to the range
    assert slo.availability([], at(0), at(10)).observed_s == 0.0


def test_latency_targets_parse_and_name_the_setting_on_error() -> None:
    targets = slo.parse_latency_targets("/v1/generate=2.5:2, /v1/completions=1:0.5")
    assert targets["/v1/generate"] == slo.LatencyTarget("/v1/generate", 2.5, 2.0)
    assert targets["/v1/completions"].jitter_s == 0.5
    for bad in ("/v1/generate=2.5", "v1/generate=1:1", "/v1/generate=x:1",
                "/v1/generate=0:1"):
        with pytest.raises(InvalidInputError) as caught:
            slo.parse_latency_targets(bad)
        assert caught.value.field == "AUDIT_LEDGER_SLO_LATENCY"


def test_report_leaf_round_trips_and_rejects_a_bad_digest() -> None:
    body = report_body(leaf_id="0190c2d4-0000-7000-8000-000000000001",
                       created_at="2026-11-30T10:00:00.000Z", digest="sha256:" + "ab" * 32,
                       since="2026-11-30T09:00:00.000Z", until="2026-11-30T10:00:00.000Z",
                       scope_tenant=None, made_by="local:auditor")
    record = AuditRecord.from_body(body)
    assert AuditRecord.from_canonical(record.canonical).body["schema"] == REPORT_SCHEMA
    with pytest.raises(CanonicalFormError) as caught:
        AuditRecord.from_body({**body, "report": {**body["report"], "digest": "md5:00"}})
    assert caught.value.field == "record.report.digest"
    with pytest.raises(CanonicalFormError) as caught:
        AuditRecord.from_body({**body, "extra": 1})
    assert caught.value.field == "record"


def test_ready_steps_draw_the_count_of_ready_replicas() -> None:
    spans = [span(0, 100), span(100, 160, ready=False), span(160, 300),
             span(120, 140, replica="b")]
    assert slo.ready_steps(spans, at(0), at(300)) == [
        (at(0), 1.0), (at(100), 1.0), (at(100), 0.0), (at(120), 0.0), (at(120), 1.0),
        (at(140), 1.0), (at(140), 0.0), (at(160), 0.0), (at(160), 1.0), (at(300), 1.0)]
    assert slo.ready_steps([], at(0), at(10)) == [(at(0), 0.0), (at(10), 0.0)]
