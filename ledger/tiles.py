"""C2SP tlog-tiles, encoding only: tile paths, hash tiles and entry bundles.

The log's Merkle tree served as static files (https://c2sp.org/tlog-tiles): a tile at
level ``L`` holds up to 256 consecutive tree hashes at tree level ``8 * L``; an entry
bundle holds the exact bytes of up to 256 consecutive leaves, each prefixed with its
length as a big-endian uint16. The rightmost tiles of a tree are partial (1..255 wide).

Because the store keeps every perfect subtree hash (``merkle``), the ``i``-th hash of tile
``(L, n)`` is simply the node ``(8 * L, n * 256 + i)``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ledger import merkle
from ledger.errors import (
    InvalidInputError,
    LeafTooLargeError,
    MalformedProofError,
    RootMismatchError,
    VerificationError,
)
from ledger.leaves.envelope import is_envelope, parse_envelope

TILE_HEIGHT = 8
TILE_WIDTH = 1 << TILE_HEIGHT
MAX_LEVEL = 63
MAX_ENTRY_BYTES = 0xFFFF  # the uint16 length prefix of a bundle entry
CHECKPOINT_PATH = "checkpoint"

_INDEX_PART = re.compile(r"x\d{3}")
_LAST_PART = re.compile(r"\d{3}")
_DECIMAL = re.compile(r"0|[1-9]\d*")


@dataclass(frozen=True)
class TileRef:
    """One tile (``level`` 0..63) or entry bundle (``entries``), ``width`` 1..256 wide."""

    level: int
    index: int
    width: int = TILE_WIDTH
    entries: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.level <= MAX_LEVEL or (self.entries and self.level != 0):
            raise ValueError(f"tile level {self.level} is out of range")
        if self.index < 0 or not 1 <= self.width <= TILE_WIDTH:
            raise ValueError(f"tile index {self.index} or width {self.width} is out of range")

    @property
    def partial(self) -> bool:
        return self.width < TILE_WIDTH

    @property
    def path(self) -> str:
        kind = "entries" if self.entries else str(self.level)
        suffix = f".p/{self.width}" if self.partial else ""
        return f"tile/{kind}/{encode_index(self.index)}{suffix}"

    @property
    def first(self) -> int:
        """Index of the first hash (tree level ``8 * level``) or leaf it holds."""
        return self.index * TILE_WIDTH

    def full(self) -> TileRef:
        return TileRef(self.level, self.index, TILE_WIDTH, self.entries)


def encode_index(index: int) -> str:
    """``1234067`` -> ``x001/x234/067``: 3-digit groups, all but the last prefixed ``x``."""
    if index < 0:
        raise ValueError("a tile index is not negative")
    groups = []
    while True:
        groups.append(f"{index % 1000:03d}")
        index //= 1000
        if index == 0:
            break
    groups.reverse()
    return "/".join(["x" + g for g in groups[:-1]] + [groups[-1]])


def parse_path(path: str) -> TileRef:
    """The tile named by ``tile/<L>/<N>[.p/<W>]`` or ``tile/entries/<N>[.p/<W>]``,
    exactly as the spec encodes them (no extra leading zeroes); raise InvalidInputError."""
    parts = path.split("/")
    if len(parts) < 3 or parts[0] != "tile":
        raise InvalidInputError("path", "is not a tile path")
    kind, rest = parts[1], parts[2:]
    width = TILE_WIDTH
    if len(rest) >= 2 and rest[-2].endswith(".p"):
        if not _DECIMAL.fullmatch(rest[-1]) or not 1 <= int(rest[-1]) < TILE_WIDTH:
            raise InvalidInputError("path", "a partial tile's width is 1..255")
        width = int(rest[-1])
        rest = rest[:-2] + [rest[-2][:-2]]
    if not rest or not _LAST_PART.fullmatch(rest[-1]) \
            or not all(_INDEX_PART.fullmatch(p) for p in rest[:-1]) \
            or (len(rest) > 1 and rest[0] == "x000"):
        raise InvalidInputError("path", "the tile index is not encoded as the spec says")
    index = int("".join(p.lstrip("x") for p in rest))
    if kind == "entries":
        return TileRef(0, index, width, entries=True)
    if not _DECIMAL.fullmatch(kind) or int(kind) > MAX_LEVEL:
        raise InvalidInputError("path", "the tile level is 0..63")
    return TileRef(int(kind), index, width)


# --- which tiles a tree of a given size has ----------------------------------------------


def hashes_at(level: int, size: int) -> int:
    """How many hashes tiles of ``level`` hold in a tree of ``size`` leaves: the complete
    subtrees of 256**level leaves (a partial tile is never hashed into the level above)."""
    return size >> (TILE_HEIGHT * level)


def tile_for(level: int, index: int, size: int, entries: bool = False) -> TileRef | None:
    """Tile ``index`` of ``level`` as a tree of ``size`` has it (full or partial), or None."""
    count = hashes_at(level, size)
    width = min(TILE_WIDTH, count - index * TILE_WIDTH)
    return TileRef(level, index, width, entries) if width > 0 else None


def tiles_between(old_size: int, new_size: int) -> list[TileRef]:
    """The tiles and bundles a tree of ``new_size`` serves that one of ``old_size`` did not
    have in that form: every tile that grew, full or partial, bundles included."""
    if not 0 <= old_size <= new_size:
        raise ValueError("sizes must grow")
    found: list[TileRef] = []
    level = 0
    while hashes_at(level, new_size) > 0:
        old_count, new_count = hashes_at(level, old_size), hashes_at(level, new_size)
        for index in range(old_count // TILE_WIDTH, (new_count - 1) // TILE_WIDTH + 1):
            ref = tile_for(level, index, new_size)
            old = tile_for(level, index, old_size)
            if ref is not None and ref != old:
                found.append(ref)
                if level == 0:
                    found.append(TileRef(0, index, ref.width, entries=True))
        level += 1
    return found


# --- contents --------------------------------------------------------------------------


def check_entry_sizes(entry: bytes, body: bytes | None = None) -> None:
    """Raise LeafTooLargeError unless a leaf's ``entry`` (and v2 ``body``, bundled the same
    way beside it) fits a bundle: the log's one append path calls it on every leaf."""
    for part, data in (("entry", entry), ("body", body)):
        if data is not None and len(data) > MAX_ENTRY_BYTES:
            raise LeafTooLargeError(part, len(data), MAX_ENTRY_BYTES)


def encode_bundle(entries: Iterable[bytes]) -> bytes:
    """Entries, each prefixed with its length as a big-endian uint16."""
    out = bytearray()
    for entry in entries:
        if not 0 < len(entry) <= MAX_ENTRY_BYTES:
            raise ValueError(f"a bundle entry has 1..65535 bytes, not {len(entry)}")
        out += len(entry).to_bytes(2, "big") + entry
    return bytes(out)


def decode_bundle(data: bytes, width: int) -> list[bytes]:
    """The ``width`` entries of a bundle; raise MalformedProofError if it holds other."""
    entries, at = [], 0
    while at < len(data):
        if at + 2 > len(data):
            raise MalformedProofError("an entry bundle ends inside a length prefix")
        length = int.from_bytes(data[at:at + 2], "big")
        if length == 0 or at + 2 + length > len(data):
            raise MalformedProofError("an entry bundle's entry overruns the bundle")
        entries.append(data[at + 2:at + 2 + length])
        at += 2 + length
    if len(entries) != width:
        raise MalformedProofError(f"an entry bundle holds {len(entries)} entries, "
                                  f"expected {width}")
    return entries


def split_tile(data: bytes, width: int) -> list[bytes]:
    """The ``width`` hashes of a hash tile; raise MalformedProofError on any other length."""
    if len(data) != width * merkle.HASH_SIZE:
        raise MalformedProofError(f"a tile of width {width} has {width * merkle.HASH_SIZE} "
                                  f"bytes, not {len(data)}")
    return [data[i:i + merkle.HASH_SIZE] for i in range(0, len(data), merkle.HASH_SIZE)]


# --- proofs from tiles ----------------------------------------------------------------

TileReader = Callable[[TileRef], bytes]


class TileNodes:
    """Any perfect subtree hash of a tree of ``size`` leaves, from that tree's hash tiles.

    Node ``(level, idx)`` is the fold of ``2**(level % 8)`` hashes of one tile at level
    ``level // 8``. Tiles are read once each through ``read`` (which fetches and may
    cache; contents are checked for length only: the root check decides).
    """

    def __init__(self, size: int, read: TileReader) -> None:
        self.size = size
        self._read = read
        self._tiles: dict[TileRef, list[bytes]] = {}

    def node(self, level: int, idx: int) -> bytes:
        tile_level, below = divmod(level, TILE_HEIGHT)
        first = idx << below
        last = first + (1 << below)
        ref = tile_for(tile_level, first // TILE_WIDTH, self.size)
        if ref is None or last - ref.first > ref.width:
            raise MalformedProofError(f"node ({level}, {idx}) is beyond a tree of size "
                                      f"{self.size}")
        hashes = self._tiles.get(ref)
        if hashes is None:
            hashes = split_tile(self._read(ref), ref.width)
            self._tiles[ref] = hashes
        return perfect_root(hashes[first - ref.first:last - ref.first])

    def read_nodes(self, keys: Sequence[merkle.Node]) -> dict[merkle.Node, bytes]:
        """A ``merkle.NodeReader``: proofs of this tree from its tiles."""
        return {key: self.node(*key) for key in keys}


def perfect_root(hashes: Sequence[bytes]) -> bytes:
    """The root of a perfect subtree (a power of two of hashes), level by level."""
    layer = list(hashes)
    if not layer or len(layer) & (len(layer) - 1):
        raise ValueError("a perfect subtree has a power of two of hashes")
    while len(layer) > 1:
        layer = [merkle.hash_children(layer[i], layer[i + 1]) for i in range(0, len(layer), 2)]
    return layer[0]


def root_with_leaves(size: int, start: int, leaf_hashes: Sequence[bytes],
                     outside: Callable[[int, int], bytes]) -> bytes:
    """The root of a tree of ``size`` leaves whose leaves ``[start, start + len)`` are
    ``leaf_hashes`` (computed by the caller from the bytes it read) and whose other
    subtrees come from ``outside(level, idx)`` (perfect nodes, e.g. ``TileNodes.node``).

    Equal to the signed root only if those exact leaves sit at those exact places: no
    leaf of the range can be missing, added or moved.
    """
    end = start + len(leaf_hashes)
    if not 0 <= start <= end <= size or size == 0:
        raise MalformedProofError(f"leaves [{start}, {end}) are not in a tree of size {size}")

    def subtree(lo: int, hi: int) -> bytes:
        width = hi - lo
        perfect = width & (width - 1) == 0 and lo % width == 0
        if perfect and (hi <= start or lo >= end):
            return outside(width.bit_length() - 1, lo // width)
        if perfect and start <= lo and hi <= end:
            return perfect_root(leaf_hashes[lo - start:hi - start])
        if width == 1:  # unreachable: a single leaf is perfect
            raise AssertionError("leaf neither inside nor outside")
        k = 1 << ((width - 1).bit_length() - 1)
        return merkle.hash_children(subtree(lo, lo + k), subtree(lo + k, hi))

    return subtree(0, size)


def check_leaves(size: int, root: bytes, start: int, end: int, leaf_hashes: Sequence[bytes],
                 outside: Callable[[int, int], bytes]) -> None:
    """Raise unless ``leaf_hashes`` are exactly the tree's leaves ``[start, end)``, in the
    tree of ``size`` with ``root`` (MalformedProofError for a count that is not
    ``end - start``, RootMismatchError for any other difference)."""
    if len(leaf_hashes) != end - start:
        raise MalformedProofError(f"{len(leaf_hashes)} leaves given for [{start}, {end})")
    calculated = root_with_leaves(size, start, leaf_hashes, outside)
    if calculated != root:
        raise RootMismatchError(expected=root, calculated=calculated)



def only_envelopes(entries: Iterable[bytes]) -> bool:
    """Whether every entry is a v2 leaf envelope (kind, time, tenant tag and body digest,
    never a record): what a tenant-scoped reader may receive."""
    for entry in entries:
        if not is_envelope(entry):
            return False
        try:
            parse_envelope(entry)
        except VerificationError:
            return False
    return True
