"""The integrator: seals new log entries into signed checkpoints.

Several replicas may share one PostgreSQL log; a lease (an advisory lock on PostgreSQL, a
file lock beside a SQLite database) makes sure exactly one of them integrates at a time.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from pathlib import Path
from typing import Protocol

from sqlalchemy import text
from sqlalchemy.engine import Connection

from ledger.checkpoint import NoteSigner
from ledger.store.sql import SqlLedger, StoredCheckpoint

log = logging.getLogger(__name__)
INTEGRATOR_LOCK_KEY = 0x696E7465677261  # "integra"


class Lease(Protocol):
    def try_acquire(self) -> bool: ...
    def release(self) -> None: ...


class PostgresLease:
    """A session-level advisory lock held on its own connection."""

    def __init__(self, ledger: SqlLedger) -> None:
        self._ledger = ledger
        self._conn: Connection | None = None

    def try_acquire(self) -> bool:
        if self._conn is not None:
            try:
                self._conn.execute(text("SELECT 1"))  # the lock lives as long as this session
                self._conn.commit()
                return True
            except Exception:
                self._conn.invalidate()
                self._conn = None
        conn = self._ledger.engine.connect()
        got = bool(conn.execute(text("SELECT pg_try_advisory_lock(:k)"),
                                {"k": INTEGRATOR_LOCK_KEY}).scalar())
        conn.commit()
        if got:
            self._conn = conn
        else:
            conn.close()
        return got

    def release(self) -> None:
        if self._conn is not None:
            # A pooled connection outlives close(): unlock explicitly.
            self._conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": INTEGRATOR_LOCK_KEY})
            self._conn.commit()
            self._conn.close()
            self._conn = None


class FileLease:
    """An exclusive ``flock`` on a file beside the SQLite database."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._fd: int | None = None

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


def lease_for(ledger: SqlLedger) -> Lease:
    if ledger.is_postgres:
        return PostgresLease(ledger)
    database = ledger.engine.url.database or ":memory:"
    return FileLease(Path(f"{database}.integrator.lock"))


class Integrator:
    """Seals a checkpoint every ``interval_s`` while it holds the lease, and on demand."""

    def __init__(self, ledger: SqlLedger, signer: NoteSigner, origin: str,
                 interval_s: float = 1.0, lease: Lease | None = None) -> None:
        self.ledger = ledger
        self.signer = signer
        self.origin = origin
        self.interval_s = interval_s
        self.lease = lease or lease_for(ledger)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def is_leader(self) -> bool:
        return self.lease.try_acquire()

    def seal_now(self) -> StoredCheckpoint | None:
        """Seal the current head if this replica holds the lease and the tree grew."""
        if not self.lease.try_acquire():
            return None
        return self.ledger.seal_checkpoint(self.signer, self.origin)

    @property
    def alive(self) -> bool:
        """False only if the thread ended without being asked to stop."""
        return self._thread is None or self._thread.is_alive() or self._stop.is_set()

    def start(self) -> Integrator:
        self._thread = threading.Thread(target=self._loop, name="integrator", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            self.seal_now()  # seal what the last appends added before going away
        finally:
            self.lease.release()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.seal_now()
            except Exception:  # keep integrating after a transient database error
                log.exception("sealing a checkpoint failed; retrying")
