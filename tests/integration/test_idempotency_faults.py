"""Idempotency-Key claims never stay pending after their request ended (decision 32):
PostgreSQL backends terminated while keys are claimed give no 500 and no second record,
and every key resolves within one request timeout; claims of a process that died are
released at start."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, select, text

from inference_wrapper.server.app import IDEMPOTENCY, KEYS, LEDGER, create_app
from inference_wrapper.server.idempotency import (
    Idempotency,
    owner_is_dead,
    owner_token,
    process_identity,
)
from inference_wrapper.server.settings import Settings
from ledger.store.migrate import upgrade
from ledger.store.receipts import ReceiptStore
from ledger.store.schema import records
from tests.integration.conftest import PG_ADMIN_URL

MakeClient = Callable[..., Awaitable[Any]]
KEYS_SENT = 16
TIMEOUT_S = 20.0


class BackendKiller(threading.Thread):
    """Terminates every backend of one database, again and again, until stopped."""

    def __init__(self, database: str) -> None:
        super().__init__(daemon=True)
        self.database, self.stop, self.killed = database, threading.Event(), 0

    def run(self) -> None:
        admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            while not self.stop.wait(0.005):
                self.killed += len(conn.execute(text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = :name AND pid <> pg_backend_pid()"),
                    {"name": self.database}).all())
        admin.dispose()


async def test_terminated_backends_during_claims_give_no_500_and_no_second_record(
        make_pg_database: Callable[[], str], aiohttp_client: MakeClient, tmp_path: Path,
        tiny_generator: Any) -> None:
    url = make_pg_database()
    app = create_app(Settings(database_url=url, log_key_path=tmp_path / "log.key",
                              max_wait_ms=1.0, request_timeout_s=TIMEOUT_S,
                              checkpoint_interval_s=3600.0, anchor_interval_s=3600.0),
                     tiny_generator)
    client = await aiohttp_client(app)
    token = app[KEYS].create("bank-a", "client")[0]
    # Requests authenticate from the key cache: the database faults hit the claims.
    assert app[KEYS].authenticate(token) is not None

    def send(i: int) -> Any:
        return client.post("/v1/generate", json={"prompt": f"pay {i}", "seed": i,
                                                  "temperature": 1.0, "max_new_tokens": 2},
                           headers={"Authorization": f"Bearer {token}",
                                    "Idempotency-Key": f"key-{i}"})

    killer = BackendKiller(url.rsplit("/", 1)[1])
    killer.start()
    try:
        first = await asyncio.gather(*(send(i) for i in range(KEYS_SENT)))
        first_status = [r.status for r in first]
        first_body = [await r.json() for r in first]
    finally:
        killer.stop.set()
        await asyncio.to_thread(killer.join)
    assert killer.killed > 0
    assert all(s in (200, 409, 503) for s in first_status), Counter(first_status)
    # Once the database is back, every key resolves within one request timeout: its
    # stored answer (the same record), or free again (a new generate).
    loop = asyncio.get_running_loop()
    started = loop.time()
    again = await asyncio.gather(*(send(i) for i in range(KEYS_SENT)))
    assert loop.time() - started < TIMEOUT_S
    freed = 0
    for i, response in enumerate(again):
        body = await response.json()
        if response.status == 409:  # its claim was found ownerless and freed: send again
            assert body["field"] == "Idempotency-Key"
            response = await send(i)
            body = await response.json()
            freed += 1
        committed = first_body[i].get("record_id")  # an answer, or an error after commit
        if committed is not None:  # its stored answer, the same record
            assert (response.status, body.get("record_id")) == (first_status[i], committed)
        else:  # nothing was committed: the key was free and this one generated
            assert response.status == 200, body
    # No key made a second record: each seed appears once at most in the log.
    engine = create_engine(url)
    with engine.connect() as conn:
        ids = [r.record_id for r in conn.execute(select(records.c.record_id)).all()]
    engine.dispose()
    bodies = [json.loads(app[LEDGER].get_record(i).leaf_body) for i in ids]  # type: ignore[union-attr]
    generated = [b for b in bodies if b["schema"] == "audit-record/v2"]
    seeds = Counter(b["data"]["generation"]["seed"] for b in generated)
    assert all(seeds[i] == 1 for i in range(KEYS_SENT)), seeds
    assert len(generated) == KEYS_SENT
    assert not app[IDEMPOTENCY]._unstored  # every answer stored by now


def _dead_owner() -> str:
    """The owner token a process that has exited would have left."""
    child = subprocess.run(
        [sys.executable, "-c", "from inference_wrapper.server.idempotency import "
         "process_identity; print(process_identity())"],
        capture_output=True, text=True, check=True, timeout=60)
    return owner_token(child.stdout.strip())


async def test_claims_of_a_dead_process_are_released_at_start(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    upgrade(url)
    engine = create_engine(url)
    store = ReceiptStore(engine)
    dead, alive = _dead_owner(), owner_token(process_identity())
    assert len(dead) <= 32
    assert owner_is_dead(dead) and not owner_is_dead(alive)
    assert not owner_is_dead("0ther0/1/1/abc")  # another host's is never judged
    assert store.claim("bank-a", "left-by-dead", b"f" * 32, 600.0, dead) is None
    assert store.claim("bank-a", "still-running", b"f" * 32, 600.0, alive) is None
    idempotency = Idempotency(store, timeout_s=TIMEOUT_S)
    assert await idempotency.recover() == 1
    assert store.get("bank-a", "left-by-dead") is None  # free: a retry generates
    assert store.get("bank-a", "still-running") is not None
    engine.dispose()
