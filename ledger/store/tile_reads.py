"""Read tiles and entry bundles straight from the log's tables (``SqlTileReads``, which a
SQL ledger hands out as ``tiles``; ``ledger.store.log_api.TileReads``).

A hash tile ``(L, n)`` of width ``W`` is the ``W`` stored nodes ``(8 * L, n * 256 + i)``;
an entry bundle is the leaves' exact bytes (``records.canonical``) in index order. Only
what the latest signed checkpoint covers is served: a tile beyond it is "not found",
so nothing unsealed leaves through the tiles.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import Engine

from ledger import tiles
from ledger.body_bundles import PREFIX, body_path, parse_body_path, split_bodies
from ledger.checkpoint import Checkpoint
from ledger.errors import InvalidInputError
from ledger.leaves.body_codec import unpack_body
from ledger.store.log_api import TileNotFoundError, TileReads
from ledger.tiles import TileRef

__all__ = ["SqlTileReads", "StoreTiles", "TileNotFoundError", "covered", "read_body_bundle",
           "read_bundle", "read_tile"]


def covered(ref: TileRef, size: int) -> bool:
    """Whether a tree of ``size`` leaves has this tile, at this width or wider."""
    return ref.index * tiles.TILE_WIDTH + ref.width <= tiles.hashes_at(ref.level, size)


class SqlTileReads:
    """The ``tree_nodes`` and ``records`` tables of one ledger database, as tiles."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._mark = "%s" if engine.dialect.name == "postgresql" else "?"

    def hash_tile(self, ref: TileRef) -> bytes:
        level, first, mark = ref.level * tiles.TILE_HEIGHT, ref.first, self._mark
        with self.engine.connect() as conn:
            rows = conn.exec_driver_sql(
                f"SELECT hash FROM tree_nodes WHERE level = {mark} AND idx >= {mark} "
                f"AND idx < {mark} ORDER BY idx", (level, first, first + ref.width)).all()
        if len(rows) != ref.width:
            raise TileNotFoundError(ref.path)
        return b"".join(bytes(row[0]) for row in rows)

    def entries(self, start: int, end: int) -> list[bytes]:
        mark = self._mark
        with self.engine.connect() as conn:
            rows = conn.exec_driver_sql(
                f"SELECT leaf_index, canonical FROM records WHERE leaf_index >= {mark} "
                f"AND leaf_index < {mark} ORDER BY leaf_index", (start, end)).all()
        if len(rows) != end - start or (rows and int(rows[0][0]) != start):
            raise TileNotFoundError(f"leaves [{start}, {end})")
        return [bytes(row[1]) for row in rows]

    def leaves(self, start: int, end: int) -> list[tuple[bytes, bytes | None]]:
        mark = self._mark
        with self.engine.connect() as conn:
            rows = conn.exec_driver_sql(
                f"SELECT leaf_index, canonical, body FROM records WHERE leaf_index >= {mark} "
                f"AND leaf_index < {mark} ORDER BY leaf_index", (start, end)).all()
        if len(rows) != end - start or (rows and int(rows[0][0]) != start):
            raise TileNotFoundError(f"leaves [{start}, {end})")
        return [(bytes(row[1]), None if row[2] is None else unpack_body(bytes(row[2])))
                for row in rows]


def read_body_bundle(reads: TileReads, tag: str | None, ref: TileRef) -> bytes:
    """The bodies of ``tag``'s v2 leaves in entry bundle ``ref``, encoded
    (``ledger.body_bundles``); TileNotFoundError when the bundle holds none of them."""
    leaves = reads.leaves(ref.first, ref.first + ref.width)
    grouped = split_bodies([e for e, _ in leaves], [b for _, b in leaves])
    if tag not in grouped:
        raise TileNotFoundError(body_path(tag, ref))
    return tiles.encode_bundle(grouped[tag])


def read_bundle(reads: TileReads, ref: TileRef) -> bytes:
    """The entry bundle ``ref`` (``ref.entries``), encoded."""
    return tiles.encode_bundle(reads.entries(ref.first, ref.first + ref.width))


def read_tile(reads: TileReads, ref: TileRef) -> bytes:
    """A hash tile or an entry bundle, as the spec encodes it."""
    return read_bundle(reads, ref) if ref.entries else reads.hash_tile(ref)


class StoreTiles:
    """The log's own tables as a tile source (``ledger.client.tiles.TileSource``) for a
    caller inside the service (the console's search): the files ``/tlog`` serves, for
    the signed ``note`` given (read with its cosignatures), with no access check (the
    caller applies its own)."""

    def __init__(self, reads: TileReads, note: bytes) -> None:
        self.reads, self.note = reads, note
        self.size = Checkpoint.peek(note).size

    def get(self, path: str) -> bytes | None:
        if path == tiles.CHECKPOINT_PATH:
            return self.note
        try:
            if path.startswith(PREFIX + "/"):
                tag, ref = parse_body_path(path)
                return read_body_bundle(self.reads, tag, ref) if covered(ref, self.size) \
                    else None
            ref = tiles.parse_path(path)
            return read_tile(self.reads, ref) if covered(ref, self.size) else None
        except (InvalidInputError, TileNotFoundError):
            return None


if TYPE_CHECKING:  # mypy holds the SQL reads to the Protocol
    def _plays_the_role(reads: SqlTileReads) -> TileReads:
        return reads
