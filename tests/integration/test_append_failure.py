"""A real append failure (SQLite refusing the insert, PostgreSQL connections killed and
refused) answers 503 with no output, and its body holds no SQL, no parameters and no
other tenant's data: a failed group insert's error text carries all of them."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from inference_wrapper.server.app import KEYS, LEDGER, create_app
from inference_wrapper.server.settings import Settings
from ledger.store.apikeys import ApiKey, ApiKeyStore
from tests.integration.conftest import PG_ADMIN_URL

MakeClient = Callable[..., Awaitable[Any]]


def remember_keys(store: ApiKeyStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys checked once by the real store are remembered: this stands in for the
    service's key cache, so a request gets as far as the append when the database is gone
    (otherwise the key lookup fails first and the test would not reach the append)."""
    seen: dict[str, ApiKey | None] = {}
    lookup = store.authenticate

    def authenticate(token: str) -> ApiKey | None:
        if token not in seen:
            seen[token] = lookup(token)
        return seen[token]

    monkeypatch.setattr(store, "authenticate", authenticate)


def break_sqlite(url: str) -> None:
    # Running as root, file permissions do not stop writes; a trigger makes SQLite itself
    # refuse every insert into the records table, inside the writer's real transaction.
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("CREATE TRIGGER refuse BEFORE INSERT ON records "
                          "BEGIN SELECT RAISE(ABORT, 'disk refused the write'); END"))
    engine.dispose()


def pg_admin(statement: str) -> None:
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(statement))
    admin.dispose()


def break_postgres(url: str) -> None:
    name = url.rsplit("/", 1)[1]
    pg_admin(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')  # no reconnecting either
    pg_admin(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'")


FORBIDDEN = ("INSERT", "SELECT", "parameters", "[SQL", "sqlite", "psycopg", "records",
             "bank-b", "audit_test_", "127.0.0.1", "disk refused", "terminat")


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_real_append_failure_503_leaks_nothing(
    make_pg_database: Callable[[], str], aiohttp_client: MakeClient, tmp_path: Path,
    tiny_generator: Any, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # make_pg_database first: its teardown (dropping the database) then runs after the
    # app's (which still seals and closes against it).
    url = (f"sqlite:///{tmp_path / 'ledger.db'}" if backend == "sqlite"
           else make_pg_database())
    settings = Settings(database_url=url, log_key_path=tmp_path / "log.key", max_wait_ms=20.0,
                        checkpoint_interval_s=3600.0, anchor_interval_s=3600.0)
    app = create_app(settings, tiny_generator)
    client = await aiohttp_client(app)
    keys = app[KEYS]
    remember_keys(keys, monkeypatch)
    a = keys.create("bank-a", "client")[0]
    b = keys.create("bank-b", "client")[0]
    for token in (a, b):
        assert keys.authenticate(token) is not None
    ok = await client.post("/v1/generate", json={"prompt": "kept", "max_new_tokens": 1},
                           headers={"Authorization": f"Bearer {b}"})
    assert ok.status == 200
    committed_b = (await ok.json())["record_id"]

    (break_sqlite if backend == "sqlite" else break_postgres)(url)
    try:
        # Both tenants at once, so a failed group insert holds both tenants' records.
        responses = await asyncio.gather(*(
            client.post("/v1/generate", json={"prompt": f"secret {i}", "max_new_tokens": 2},
                        headers={"Authorization": f"Bearer {(a, b)[i % 2]}"})
            for i in range(6)))
        for response in responses:
            body = await response.text()
            assert response.status == 503, body
            assert response.headers["Retry-After"] == "1"
            problem = await response.json()
            assert problem["detail"] == ("the audit record could not be committed, so no "
                                         "output is returned")
            assert "output" not in problem
            for word in (*FORBIDDEN, committed_b, "secret"):
                assert word not in body, (word, body)
    finally:
        if backend == "postgresql":
            pg_admin(f'ALTER DATABASE "{url.rsplit("/", 1)[1]}" ALLOW_CONNECTIONS true')
    if backend == "sqlite":
        # Only the environment leaf and the record committed before.
        assert app[LEDGER].tree_head()[0] == 2
