"""Alembic environment: online migrations only, under an advisory lock on PostgreSQL so
that two replicas starting together do not migrate twice."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, text

from ledger.store.schema import metadata

MIGRATION_LOCK_KEY = 0x6175646974  # "audit": any constant shared by all replicas

config = context.config
url = config.get_main_option("sqlalchemy.url")
assert url, "sqlalchemy.url is required"

engine = create_engine(url)
with engine.connect() as connection:
    is_postgres = connection.dialect.name == "postgresql"
    if is_postgres:
        connection.execute(text("SELECT pg_advisory_lock(:k)"), {"k": MIGRATION_LOCK_KEY})
        connection.commit()
    try:
        context.configure(connection=connection, target_metadata=metadata)
        with context.begin_transaction():
            context.run_migrations()
        connection.commit()
    finally:
        if is_postgres:
            connection.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": MIGRATION_LOCK_KEY})
            connection.commit()
engine.dispose()
