"""Issue 22: a stream's text is out before its completed record is appended; a transient
database fault then (the writer's connection terminated while it waits on a lock) is
retried, bounded, before the stream would end with the error. Real PostgreSQL, real
HTTP on loopback, the tiny model; gated on the stream's text, the sealing step and the
writer's backend seen waiting, never on sleeping."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from inference_wrapper.server.app import JOURNAL, KEYS, LEDGER, create_app
from inference_wrapper.server.settings import Settings
from ledger.leaves import commitments
from tests.integration.conftest import PG_ADMIN_URL
from tests.wrapped_generator import WrappedGenerator

MakeClient = Callable[..., Awaitable[Any]]
CHAT = "/v1/chat/completions"


class HeldSeal(WrappedGenerator):
    """Sealing (the completed records) waits until the test has seen text."""

    def seal(self, batch: Any, log: Any = None) -> Any:
        self.wait_for_gate()
        return self.inner.seal(batch, log)


def _writer_waiting_on_lock(database: str) -> int:
    """The pid of the ledger writer's backend once its record insert waits on a lock."""
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with admin.connect() as conn:
                pid = conn.execute(text(
                    "SELECT pid FROM pg_stat_activity WHERE datname = :db AND "
                    "wait_event_type = 'Lock' AND query LIKE 'INSERT INTO records%'"),
                    {"db": database}).scalar()
            if pid is not None:
                return int(pid)
            time.sleep(0.02)  # polled state: the writer's backend, as PostgreSQL shows it
        raise AssertionError("the ledger writer never waited on the lock")
    finally:
        admin.dispose()


def _terminate(pid: int) -> None:
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        assert conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid}).scalar()
    admin.dispose()


async def test_a_streams_completed_record_is_retried_past_a_dropped_connection(
        make_pg_database: Callable[[], str], aiohttp_client: MakeClient, tmp_path: Path,
        tiny_generator: Any, caplog: pytest.LogCaptureFixture) -> None:
    url = make_pg_database()
    database = url.rsplit("/", 1)[1]
    generator = HeldSeal(tiny_generator)
    app = create_app(Settings(database_url=url, log_key_path=tmp_path / "log.key",
                              max_wait_ms=1.0, checkpoint_interval_s=3600.0,
                              anchor_interval_s=3600.0), generator)
    client = await aiohttp_client(app)
    token = app[KEYS].create("bank-a", "client")[0]
    response = await client.post(CHAT, json={
        "model": "tiny-llama", "messages": [{"role": "user", "content": "pay invoice 13"}],
        "max_tokens": 12, "temperature": 0, "stream": True},
        headers={"Authorization": f"Bearer {token}"})
    assert response.status == 200
    lines: list[str] = []
    while not any('"content": "' in line and '"content": ""' not in line for line in lines):
        line = (await response.content.readline()).decode()
        assert line, "the stream ended before any text"
        lines.append(line)
    size_before = app[LEDGER].tree_head()[0]  # environment and stream start records
    failures_before = app[JOURNAL].failures

    # A table lock holds the completed record's insert; its connection is then terminated
    # mid-statement (a real dropped connection), and the lock let go.
    locker = create_engine(url).connect()
    transaction = locker.begin()
    locker.execute(text("LOCK TABLE records IN EXCLUSIVE MODE"))
    generator.gate.set()
    try:
        await asyncio.to_thread(_terminate, await asyncio.to_thread(
            _writer_waiting_on_lock, database))
    finally:
        transaction.commit()
        locker.close()
    with caplog.at_level(logging.WARNING):
        rest = (await response.read()).decode()
    events = [line[6:].strip() for line in [*lines, *rest.splitlines()]
              if line.startswith("data: ")]
    assert events[-1] == "[DONE]", events[-3:]
    final = json.loads(events[-2])
    assert "error" not in final
    audit = final["audit"]
    streamed = "".join(json.loads(e)["choices"][0]["delta"].get("content") or ""
                       for e in events[:-1] if json.loads(e)["choices"])
    row = app[LEDGER].get_record(audit["record_id"])
    assert row is not None
    record = json.loads(row.leaf_body)
    assert record["stream"]["start_record_id"] == audit["stream_start_record_id"]
    assert commitments.opens(record["commitments"]["output"],
                             bytes.fromhex(audit["output_salt"]), "output", streamed.encode())
    assert app[JOURNAL].failures > failures_before  # the fault did reach the append
    assert any("retrying the completed records" in r.getMessage() for r in caplog.records)
    assert app[LEDGER].tree_head()[0] == size_before + 1  # one completed record, not two
