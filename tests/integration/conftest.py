"""Ledger databases for the storage suite: SQLite files and fresh PostgreSQL databases.

PostgreSQL runs on 127.0.0.1:5432 with trust auth; each test gets its own database,
created here and dropped afterwards, and its schema comes only from the migrations.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import create_engine, text

from ledger.checkpoint import NoteSigner
from ledger.store.migrate import upgrade

PG_ADMIN_URL = os.environ.get(
    "AUDIT_LEDGER_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
ORIGIN = "audit-ledger.test/log"


def _pg_url(name: str) -> str:
    return PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name


@pytest.fixture()
def make_pg_database() -> Iterator[object]:
    created: list[str] = []
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")

    def make() -> str:
        name = f"audit_test_{uuid.uuid4().hex[:12]}"
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        created.append(name)
        return _pg_url(name)

    yield make
    with admin.connect() as conn:
        for name in created:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_url(request: pytest.FixtureRequest, tmp_path: Path, make_pg_database) -> str:  # type: ignore[no-untyped-def]
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.db'}"
    return str(make_pg_database())


@pytest.fixture()
def ledger_url(empty_url: str) -> str:
    upgrade(empty_url)
    return empty_url


@pytest.fixture()
def signer() -> NoteSigner:
    return NoteSigner(ORIGIN, Ed25519PrivateKey.generate())
