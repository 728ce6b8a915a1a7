"""A SQLite database file that changes under a running process fails closed.

SQLite maps its WAL index (the ``-shm`` file) into memory, writably. If the files stop
being writable while the process runs (an immutable flag, a read-only remount), the next
write into that map is a SIGBUS, and the process dies. If they are unlinked or replaced,
open connections go on committing into a file nobody will read again (acknowledged
records lost), and a new connection makes an empty database at the path.

So before a connection is opened or handed out, ``SqliteFileGuard`` checks that the path
still names the file it first saw, and that every one of the database, ``-wal`` and
``-shm`` files that was writable when first seen still is; if not it raises
``DatabaseFileError`` (``BackendUnavailableError``: 503 with ``Retry-After``, and
``/readyz`` 503) and SQLite is not touched. A database that was read-only from the start
(an auditor's copy) is opened as before: SQLite never maps it writably. A file brought
back writable serves again; a replaced or vanished file does not, until a restart (the
process cannot tell which database is the right one). Closing a connection runs a
checkpoint that writes into the same map, so a connection is not closed while the guard
fails: it is kept, deliberately never freed, and the operating system releases it at
exit. Decision record 0044.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine

from ledger.errors import BackendUnavailableError
from ledger.store.file_modes import sqlite_path

SUFFIXES = ("", "-wal", "-shm")


class DatabaseFileError(BackendUnavailableError):
    """The SQLite database file vanished, was replaced or stopped being writable."""


class SqliteFileGuard:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.identity: tuple[int, int] | None = None  # (device, inode) first seen
        self._writable: dict[str, bool] = {}  # per suffix, when first seen

    def check(self) -> None:
        """Raise ``DatabaseFileError`` unless the files are still the ones first seen,
        as writable as they were then."""
        try:
            status = os.stat(self.path)
        except FileNotFoundError:
            if self.identity is None:
                return  # not created yet: the first connection creates it
            raise DatabaseFileError(f"the database file {self.path} is gone") from None
        identity = (status.st_dev, status.st_ino)
        if self.identity is None:
            self.identity = identity
        elif identity != self.identity:
            raise DatabaseFileError(f"the database file {self.path} was replaced")
        for suffix in SUFFIXES:
            name = f"{self.path}{suffix}"
            writable = os.access(name, os.W_OK)
            first = self._writable.setdefault(suffix, writable) if os.path.exists(name) \
                else None
            if first and not writable:
                raise DatabaseFileError(f"{name} is no longer writable")


def guard_sqlite_engine(engine: Engine, url: str) -> SqliteFileGuard | None:
    """Check the files before each new connection and each checkout of ``engine``."""
    path = sqlite_path(url)
    if path is None:
        return None
    guard = SqliteFileGuard(path)

    @event.listens_for(engine, "do_connect")
    def _before_connect(*_args: Any) -> None:
        guard.check()  # returns None: SQLAlchemy then connects as usual

    @event.listens_for(engine.pool, "checkout")
    def _before_use(*_args: Any) -> None:
        guard.check()

    close = engine.dialect.do_close

    def do_close(dbapi_connection: Any) -> None:
        try:
            guard.check()
        except DatabaseFileError:
            _never_free(dbapi_connection)
            return
        close(dbapi_connection)

    engine.dialect.do_close = do_close  # type: ignore[method-assign]
    return guard


_KEPT: list[Any] = []


def _never_free(connection: Any) -> None:
    """Keep a connection open for the life of the process: its finalizer would close it
    (a checkpoint into an unwritable map), even at interpreter exit, so one more
    reference is taken that nothing ever drops."""
    _KEPT.append(connection)
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(connection))
