"""SLO burn rates on /metrics and the readiness history, on a real app (tiny model, SQLite,
real HTTP on loopback)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine, insert, select

from inference_wrapper.server.app import KEYS, create_app
from inference_wrapper.server.settings import Settings
from ledger.errors import InvalidInputError
from ledger.store.migrate import upgrade
from ledger.store.schema import readiness_history

MakeClient = Callable[..., Awaitable[Any]]


def settings_for(tmp_path: Path) -> Settings:
    # /v1/generate: a 0.5 ms p99 target no generate call meets (the batcher alone waits
    # max_wait_ms = 5 ms for company); /v1/models: 30 s, which a listing always meets.
    return Settings(database_url=f"sqlite:///{tmp_path / 'ledger.db'}",
                    log_key_path=tmp_path / "log.key", max_wait_ms=5.0,
                    checkpoint_interval_s=0.2, anchor_interval_s=0.2,
                    slo_latency="/v1/generate=0.0005:0.0005,/v1/models=30:30",
                    slo_sample_interval_s=0.05)


class Scrape:
    """One /metrics answer's SLO samples, looked up by name and labels."""

    def __init__(self, text: str) -> None:
        self.values = {(s.name, frozenset(s.labels.items())): s.value
                       for family in text_string_to_metric_families(text)
                       if family.name.startswith("audit_slo") for s in family.samples}

    def __call__(self, name: str, **labels: str) -> float:
        return self.values[(name, frozenset(labels.items()))]


async def scrape(client: Any) -> Scrape:
    return Scrape(await (await client.get("/metrics")).text())


def history(url: str) -> list[Any]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return list(conn.execute(select(readiness_history)
                                     .order_by(readiness_history.c.id)))
    finally:
        engine.dispose()


async def poll(condition: Callable[[], Awaitable[bool]], timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def test_latency_burn_rate_per_route_from_the_histogram(
        aiohttp_client: MakeClient, tmp_path: Path, tiny_generator: Any) -> None:
    app = create_app(settings_for(tmp_path), tiny_generator)
    client = await aiohttp_client(app)
    token = app[KEYS].create("bank-a", "client")[0]
    auth = {"Authorization": f"Bearer {token}"}
    for _ in range(2):
        answer = await client.post("/v1/generate", json={"prompt": "hi", "max_new_tokens": 2},
                                   headers=auth)
        assert answer.status == 200
    assert (await client.get("/v1/models", headers=auth)).status == 200
    values = await scrape(client)
    for window in ("5m", "1h"):
        # Both generate calls over target: (2/2) / 1 % budget.
        assert values("audit_slo_burn_rate", slo="latency:/v1/generate", window=window) == 100.0
        assert values("audit_slo_burn_rate", slo="latency:/v1/models", window=window) == 0.0
        assert values("audit_slo_burn_rate", slo="availability", window=window) == 0.0
    assert values("audit_slo_target", slo="latency:/v1/generate", kind="p99_s") == 0.0005
    assert values("audit_slo_target", slo="availability", kind="downtime_min_per_month") == 43.2


async def test_readiness_history_survives_restarts_and_a_crash_gap_burns_budget(
        aiohttp_client: MakeClient, tmp_path: Path, tiny_generator: Any) -> None:
    settings = settings_for(tmp_path)
    upgrade(settings.database_url)
    # A replica that died 60 s ago without a clean stop, after a minute of being ready.
    now = datetime.now(UTC).replace(tzinfo=None)
    engine = create_engine(settings.database_url)
    with engine.begin() as conn:
        conn.execute(insert(readiness_history).values(
            replica="crashed", ready=1, clean_stop=0, started_at=now - timedelta(seconds=120),
            ended_at=now - timedelta(seconds=60)))
    engine.dispose()

    client = await aiohttp_client(create_app(settings, tiny_generator))

    async def sampled_ready() -> bool:
        return any(r.replica != "crashed" and r.ready == 1
                   for r in await asyncio.to_thread(history, settings.database_url))

    await poll(sampled_ready)
    values = await scrape(client)
    # At least the 60 s gap is down, in at most ~2 minutes observed: far over 0.1 %.
    assert values("audit_slo_burn_rate", slo="availability", window="5m") > 100.0
    assert values("audit_slo_longest_outage_seconds") >= 60.0
    await client.close()  # a clean shutdown marks the span
    rows = await asyncio.to_thread(history, settings.database_url)
    mine = [r for r in rows if r.replica != "crashed"]
    assert len(mine) == 1 and mine[0].ready == 1 and mine[0].clean_stop == 1

    # After the clean stop, a new start is no outage: only the old crash gap remains.
    client = await aiohttp_client(create_app(settings, tiny_generator))

    async def second_span() -> bool:
        rows = await asyncio.to_thread(history, settings.database_url)
        return len([r for r in rows if r.replica != "crashed"]) == 2

    await poll(second_span)
    rows = await asyncio.to_thread(history, settings.database_url)
    assert [r.clean_stop for r in rows if r.replica != "crashed"] == [1, 0]
    values = await scrape(client)
    assert 60.0 <= values("audit_slo_longest_outage_seconds") < 120.0
    await client.close()


def test_readiness_spans_on_both_backends(ledger_url: str) -> None:
    """One row per state, its end pushed forward per sample; the clean stop is kept."""
    from inference_wrapper.server.slo import ReadinessHistory
    from ledger import slo
    from ledger.store.readiness import spans_between
    from ledger.store.sql import SqlLedger

    t0 = datetime(2026, 11, 30, 9, 0, 0)
    with SqlLedger(ledger_url) as ledger:
        kept = ReadinessHistory(ledger.engine, "r1")
        for seconds, ready in ((0, True), (10, True), (20, False), (50, False), (60, True)):
            kept.observe(ready, t0 + timedelta(seconds=seconds))
        kept.close(t0 + timedelta(seconds=70))
        spans = spans_between(ledger.engine, t0, t0 + timedelta(seconds=100))
        assert [(s.ready, (s.start - t0).seconds, (s.end - t0).seconds, s.clean_stop)
                for s in spans] == [(True, 0, 20, False), (False, 20, 60, False),
                                    (True, 60, 70, True)]
        result = slo.availability(spans, t0, t0 + timedelta(seconds=100))
        assert (result.downtime_s, result.longest_outage_s) == (40.0, 40.0)
        reloaded = ReadinessHistory(ledger.engine, "r2")
        reloaded.load(t0)
        assert reloaded.spans == spans


def test_other_replicas_spans_are_read_back(ledger_url: str) -> None:
    """While r1 is not ready, r2 (another process) is: the service was up."""
    from inference_wrapper.server.slo import ReadinessHistory
    from ledger import slo
    from ledger.store.sql import SqlLedger

    t0 = datetime(2026, 11, 30, 9, 0, 0)
    with SqlLedger(ledger_url) as ledger:
        r1, r2 = ReadinessHistory(ledger.engine, "r1"), ReadinessHistory(ledger.engine, "r2")
        r1.observe(False, t0)
        r2.observe(True, t0)
        r2.observe(True, t0 + timedelta(seconds=30))
        r1.observe(False, t0 + timedelta(seconds=60))
        assert slo.availability(r1.spans, t0, t0 + timedelta(seconds=60)).downtime_s == 60.0
        r1.refresh_others(t0)
        assert [s.replica for s in r1.spans] == ["r2", "r1"]
        r1.observe(False, t0 + timedelta(seconds=61))  # its own open span is still the last
        result = slo.availability(r1.spans, t0, t0 + timedelta(seconds=61))
        assert (result.downtime_s, result.longest_outage_s) == (31.0, 31.0)


def test_bad_slo_settings_are_refused_naming_the_setting(tmp_path: Path,
                                                         tiny_generator: Any) -> None:
    base = settings_for(tmp_path)
    for override, name in ((dict(slo_latency="/v1/generate=fast"), "AUDIT_LEDGER_SLO_LATENCY"),
                           (dict(slo_downtime_min_per_month=0.0),
                            "AUDIT_LEDGER_SLO_DOWNTIME_MIN_PER_MONTH"),
                           (dict(slo_anchor_lag_budget=1.5),
                            "AUDIT_LEDGER_SLO_ANCHOR_LAG_BUDGET")):
        with pytest.raises(InvalidInputError) as caught:
            create_app(replace(base, **override), tiny_generator)
        assert caught.value.field == name
    assert not (tmp_path / "ledger.db").exists()  # refused before anything was created
