"""Owner-only files for what holds secrets or content: the service home and the keyring
directory (0700), SQLite's database, ``-wal`` and ``-shm`` files (0600).

SQLite creates ``-wal`` and ``-shm`` with the database file's own permissions, so
creating the database file 0600 first is what keeps them private too.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

log = logging.getLogger(__name__)

FILE_MODE = 0o600
DIRECTORY_MODE = 0o700


def private_directory(path: Path) -> None:
    """Create ``path`` (and parents) as 0700; tighten it if it is looser."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True, mode=DIRECTORY_MODE)
    _tighten(path, DIRECTORY_MODE)


def private_file(path: Path) -> None:
    """Tighten an existing file to 0600 (no-op if missing)."""
    if Path(path).exists():
        _tighten(Path(path), FILE_MODE)


def sqlite_path(url: str) -> Path | None:
    """The database file of a ``sqlite:///`` URL (None for memory or other databases)."""
    if not url.startswith("sqlite:///"):
        return None
    raw = url[len("sqlite:///"):].split("?", 1)[0]
    return Path(raw) if raw and raw != ":memory:" else None


def private_sqlite_files(url: str) -> None:
    """Create the database file 0600 before SQLite does; tighten it and its ``-wal`` and
    ``-shm`` if they already exist with looser modes."""
    path = sqlite_path(url)
    if path is None:
        return
    if not path.parent.is_dir():
        return  # SQLite reports it, as it always did
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE))
    except FileExistsError:
        pass
    except OSError:  # a read-only place: SQLite will say so, in its own words
        return
    for suffix in ("", "-wal", "-shm", "-journal"):
        private_file(Path(f"{path}{suffix}"))


def _tighten(path: Path, mode: int) -> None:
    try:
        current = stat.S_IMODE(path.stat().st_mode)
        if current & 0o077:
            os.chmod(path, current & ~0o077 & 0o7777 | (mode & 0o700))
    except OSError:  # not ours: say so, do not fail
        log.warning("%s is open to others and cannot be tightened", path)
