"""The integrator's lease: which replica seals (and anchors) at a time.

An advisory lock on its own unpooled PostgreSQL session (``PostgresLease``), or an
exclusive ``flock`` on a file beside a SQLite database (``FileLease``). See
``ledger.store.integrator`` for why safety never rests on it.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from pathlib import Path
from typing import Protocol

from sqlalchemy import Engine, make_url, text
from sqlalchemy.engine import Connection

from ledger.store.sql import PgSessionSettings, make_engine

log = logging.getLogger(__name__)
INTEGRATOR_LOCK_KEY = 0x696E7465677261  # "integra"


class Lease(Protocol):
    def try_acquire(self) -> bool: ...
    def release(self) -> None: ...
    @property
    def held(self) -> bool: ...


class LeasedLog(Protocol):
    """Where a lease is taken: the log's database and its session bounds."""

    @property
    def url(self) -> str: ...

    @property
    def pg(self) -> PgSessionSettings: ...

    @property
    def is_postgres(self) -> bool: ...


class PostgresLease:
    """A session-level advisory lock held on its own session, renewed by use.

    Non-holders keep their session too and retry the lock on it each tick (no connection
    churn); the server's idle-session timeout ends any session nobody uses.
    """

    def __init__(self, ledger: LeasedLog, engine: Engine | None = None) -> None:
        self._engine = engine or make_engine(ledger.url, pg=ledger.pg, role="lease")
        self._conn: Connection | None = None
        self._held = False
        self._guard = threading.Lock()  # the integrator and the anchor worker both ask

    @property
    def held(self) -> bool:
        """Whether this replica held the lease at its last check (no round trip)."""
        return self._held

    def try_acquire(self) -> bool:
        """Renew the lease if held (False if its session is gone), else try to take it."""
        with self._guard:
            if self._conn is None:
                try:
                    self._conn = self._engine.connect()
                except Exception:
                    log.warning("cannot reach the database to take the integrator lease")
                    return False
            try:
                if self._held:
                    self._conn.execute(text("SELECT 1"))  # alive, and the TTL starts again
                else:
                    self._held = bool(self._conn.execute(
                        text("SELECT pg_try_advisory_lock(:k)"),
                        {"k": INTEGRATOR_LOCK_KEY}).scalar())
                    if self._held:
                        log.info("took the integrator lease")
                self._conn.commit()
                return self._held
            except Exception:
                if self._held:
                    log.warning("lost the integrator lease: its database session ended")
                self._drop()
                return False  # never seal on the tick the lease was lost

    def release(self) -> None:
        with self._guard:
            if self._conn is not None and self._held:
                try:
                    self._conn.execute(text("SELECT pg_advisory_unlock(:k)"),
                                       {"k": INTEGRATOR_LOCK_KEY})
                    self._conn.commit()
                except Exception:  # the session is gone, and the lock with it
                    pass
            self._drop()

    def dispose(self) -> None:
        self.release()
        self._engine.dispose()

    def _drop(self) -> None:
        self._held = False
        if self._conn is not None:
            try:
                self._conn.invalidate()
                self._conn.close()
            except Exception:
                pass
            self._conn = None


class FileLease:
    """An exclusive ``flock`` on a file beside the SQLite database."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def try_acquire(self) -> bool:
        if self._fd is not None:
            return True
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def lease_for(ledger: LeasedLog) -> Lease:
    if ledger.is_postgres:
        return PostgresLease(ledger)
    database = make_url(ledger.url).database or ":memory:"
    return FileLease(Path(f"{database}.integrator.lock"))
