"""Where published tiles go: the small Protocol both drivers (directory, S3) implement."""

from __future__ import annotations

from typing import Protocol

from ledger.errors import BackendError


class ImmutableTileError(BackendError):
    """A published tile or bundle already holds other bytes: full tiles never change, so
    the log being published is not the log that was published there (a fork or a
    misconfigured target)."""

    def __init__(self, path: str) -> None:
        super().__init__(f"{path} is already published with other bytes; published tiles "
                         "never change")
        self.path = path


class TileSink(Protocol):
    """A store of static files named by tile paths (relative to the log's prefix)."""

    def get(self, path: str) -> bytes | None:
        """The file's bytes, or None when there is none."""

    def put_immutable(self, path: str, data: bytes) -> None:
        """Write a file that never changes; the same bytes again are a no-op, other bytes
        raise ImmutableTileError."""

    def put_checkpoint(self, data: bytes) -> None:
        """Replace the checkpoint (the one mutable file)."""
