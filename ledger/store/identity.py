"""The log's identity: its origin and verifier key, fixed when the log is created."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Protocol

from sqlalchemy import Engine, insert, select
from sqlalchemy.exc import IntegrityError

from ledger.store.log_api import LogMeta, StoredCheckpoint
from ledger.store.schema import log_meta


class IdentityStore(Protocol):
    def log_meta(self) -> LogMeta | None:
        """The stored identity, or None for a log created before identities were kept."""

    def create_log_meta(self, origin: str, verifier_key: str) -> LogMeta:
        """Record the identity unless a replica did first; returns the stored one."""


class IdentifiedLog(IdentityStore, Protocol):
    """What opening a log's identity reads: the identity and the latest checkpoint (a
    log created before identities were kept is known by its checkpoints)."""

    def latest_checkpoint(self) -> StoredCheckpoint | None: ...


class SqlIdentity:
    """The ``log_meta`` row: read through ``engine``, created through ``writer`` (the
    sequencer's engine, which takes SQLite's write lock up front)."""

    def __init__(self, engine: Engine, writer: Engine | None = None) -> None:
        self.engine = engine
        self.writer = writer or engine

    def log_meta(self) -> LogMeta | None:
        with self.engine.connect() as conn:
            row = conn.execute(select(log_meta).where(log_meta.c.id == 1)).first()
        return LogMeta(row.origin, row.verifier_key, row.created_at) if row else None

    def create_log_meta(self, origin: str, verifier_key: str) -> LogMeta:
        created_at = datetime.now(UTC).replace(tzinfo=None)
        try:
            with self.writer.begin() as conn:
                conn.execute(insert(log_meta).values(id=1, origin=origin,
                                                     verifier_key=verifier_key,
                                                     created_at=created_at))
        except IntegrityError:
            pass  # another replica created the log first: its identity stands
        stored = self.log_meta()
        assert stored is not None
        return stored
