"""A replica whose database role cannot see or signal other roles' sessions says so (at
start, on /readyz and on /metrics) instead of silently never fencing them (issue 27)."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine, text

from inference_wrapper.server.app import create_app
from inference_wrapper.server.settings import Settings
from ledger.store.migrate import upgrade
from ledger.store.sql import SqlLedger


def _fencing_gauge(metrics: str) -> float | None:
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            if sample.name == "audit_fencing_other_roles":
                return float(sample.value)
    return None


async def test_a_role_that_cannot_fence_other_roles_says_so(  # type: ignore[no-untyped-def]
        make_pg_database, aiohttp_client: Any, tiny_generator: Any, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    admin_url = str(make_pg_database())
    upgrade(admin_url)
    role = f"audit_nofence_{uuid.uuid4().hex[:8]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:  # every table right, no fencing role
        conn.execute(text(f'CREATE ROLE "{role}" LOGIN'))
        conn.execute(text(f'GRANT ALL ON ALL TABLES IN SCHEMA public TO "{role}"'))
        conn.execute(text(f'GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO "{role}"'))
    limited_url = admin_url.replace("postgres@", f"{role}@", 1)
    try:
        with SqlLedger(admin_url) as ledger:  # the test's own superuser can fence anyone
            reach = ledger.fencing_reach()
            assert reach is not None and reach.other_roles and reach.missing == ()
        settings = Settings(database_url=limited_url, log_key_path=tmp_path / "log.key",
                            checkpoint_interval_s=0.1)
        with caplog.at_level(logging.WARNING):
            client = await aiohttp_client(create_app(settings, tiny_generator))
        warned = [r.getMessage() for r in caplog.records
                  if r.getMessage().startswith("fencing limited")]
        assert warned == [f"fencing limited: role '{role}' is not a member of "
                          "pg_read_all_stats and pg_signal_backend: it can fence only "
                          "replicas that connect as the same role; a replica of another "
                          "role frozen mid-statement would hold the sequencer until it "
                          "wakes"], warned
        ready = await (await client.get("/readyz")).json()
        assert ready["replica"]["fencing"] == {
            "other_roles": False, "role": role,
            "missing": ["pg_read_all_stats", "pg_signal_backend"]}, ready
        assert _fencing_gauge(await (await client.get("/metrics")).text()) == 0.0
        await client.close()
        with admin.connect() as conn:  # granted one: still short of the other
            conn.execute(text(f'GRANT pg_read_all_stats TO "{role}"'))
        with SqlLedger(limited_url) as ledger:
            reach = ledger.fencing_reach()
            assert reach is not None and reach.missing == ("pg_signal_backend",)
    finally:
        with admin.connect() as conn:
            conn.execute(text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = :r"),
                {"r": role})
        owned = create_engine(admin_url, isolation_level="AUTOCOMMIT")
        with owned.connect() as conn:
            conn.execute(text(f'DROP OWNED BY "{role}"'))
            conn.execute(text(f'DROP ROLE "{role}"'))
        owned.dispose()
        admin.dispose()


async def test_a_sqlite_replica_reports_no_fencing(aiohttp_client: Any, tiny_generator: Any,
                                                   tmp_path: Path) -> None:
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'ledger.db'}",
                        log_key_path=tmp_path / "log.key", checkpoint_interval_s=0.1)
    client = await aiohttp_client(create_app(settings, tiny_generator))
    ready = await (await client.get("/readyz")).json()
    assert "fencing" not in ready["replica"]
    assert _fencing_gauge(await (await client.get("/metrics")).text()) is None
