"""Publish the log's signed tree as tiles: everything new since the last publish, then
the checkpoint, so a reader never sees a checkpoint whose tiles are not there yet."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine

from ledger.checkpoint import Checkpoint
from ledger.errors import RollbackError
from ledger.publish.sink import TileSink
from ledger.store.tile_reads import read_tile
from ledger.tiles import CHECKPOINT_PATH, tiles_between


@dataclass(frozen=True)
class Published:
    previous_size: int
    size: int
    files: int


def publish(engine: Engine, note: bytes, sink: TileSink) -> Published:
    """Write the tiles and bundles of the signed ``note``'s tree that ``sink`` lacks, then
    ``note`` itself (with whatever cosignatures it carries)."""
    size = Checkpoint.peek(note).size
    previous = sink.get(CHECKPOINT_PATH)
    old = Checkpoint.peek(previous).size if previous is not None else 0
    if old > size:
        raise RollbackError(old, size)  # a newer tree is published there already
    refs = tiles_between(old, size)
    for ref in refs:
        sink.put_immutable(ref.path, read_tile(engine, ref))
    if previous != note:
        sink.put_checkpoint(note)
    return Published(old, size, len(refs))
