"""The directory driver (the embedded default): tiles as files, served by any static host."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ledger.publish.sink import ImmutableTileError
from ledger.tiles import CHECKPOINT_PATH


class DirectorySink:
    """Files under ``root``; an immutable file is linked into place, so it appears whole
    and a second writer of other bytes is refused rather than obeyed."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, path: str) -> Path:
        target = (self.root / path).resolve()
        if not target.is_relative_to(self.root.resolve()):
            raise ValueError(f"{path} leaves the publishing directory")
        return target

    def get(self, path: str) -> bytes | None:
        try:
            return self._path(path).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None

    def put_immutable(self, path: str, data: bytes) -> None:
        target = self._path(path)
        existing = self.get(path)
        if existing is not None:
            if existing != data:
                raise ImmutableTileError(path)
            return
        tmp = self._write_temp(target, data)
        try:
            os.link(tmp, target)  # fails if another writer got there first
        except FileExistsError:
            if target.read_bytes() != data:
                raise ImmutableTileError(path) from None
        finally:
            tmp.unlink()
        target.chmod(0o444)

    def put_checkpoint(self, data: bytes) -> None:
        target = self._path(CHECKPOINT_PATH)
        os.replace(self._write_temp(target, data), target)

    @staticmethod
    def _write_temp(target: Path, data: bytes) -> Path:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(name, 0o644)
        return Path(name)
