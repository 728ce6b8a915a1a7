"""Publish the log's signed tree as tiles: everything new since the last publish (hash
tiles, entry bundles and the v2 bodies beside them, ``ledger.body_bundles``), then the
checkpoint, so a reader never sees a checkpoint whose files are not there yet."""

from __future__ import annotations

from dataclasses import dataclass

from ledger.body_bundles import body_path, split_bodies
from ledger.checkpoint import Checkpoint
from ledger.errors import RollbackError
from ledger.publish.sink import TileSink
from ledger.store.log_api import TileReads
from ledger.tiles import CHECKPOINT_PATH, encode_bundle, tiles_between


@dataclass(frozen=True)
class Published:
    previous_size: int
    size: int
    files: int


def publish(reads: TileReads, note: bytes, sink: TileSink) -> Published:
    """Write the tiles and bundles of the signed ``note``'s tree that ``sink`` lacks, then
    ``note`` itself (with whatever cosignatures it carries)."""
    size = Checkpoint.peek(note).size
    previous = sink.get(CHECKPOINT_PATH)
    old = Checkpoint.peek(previous).size if previous is not None else 0
    if old > size:
        raise RollbackError(old, size)  # a newer tree is published there already
    files = 0
    for ref in tiles_between(old, size):
        if not ref.entries:
            sink.put_immutable(ref.path, reads.hash_tile(ref))
            files += 1
            continue
        # The bodies first: a reader that sees an entry bundle finds its bodies there.
        leaves = reads.leaves(ref.first, ref.first + ref.width)
        entries = [entry for entry, _ in leaves]
        for tag, bodies in split_bodies(entries, [body for _, body in leaves]).items():
            sink.put_immutable(body_path(tag, ref), encode_bundle(bodies))
            files += 1
        sink.put_immutable(ref.path, encode_bundle(entries))
        files += 1
    if previous != note:
        sink.put_checkpoint(note)
    return Published(old, size, files)
