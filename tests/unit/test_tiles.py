"""Tile paths, bundles and range checks of ledger.tiles (C2SP tlog-tiles)."""

from __future__ import annotations

import pytest

from ledger import merkle, tiles
from ledger.errors import InvalidInputError, MalformedProofError, RootMismatchError
from ledger.tiles import TileRef


@pytest.mark.parametrize(("index", "encoded"), [
    (0, "000"), (7, "007"), (999, "999"), (1000, "x001/000"), (1234067, "x001/x234/067"),
])
def test_index_encoding_round_trips(index: int, encoded: str) -> None:
    assert tiles.encode_index(index) == encoded
    assert tiles.parse_path(f"tile/2/{encoded}") == TileRef(2, index)
    assert tiles.parse_path(f"tile/entries/{encoded}.p/9") == TileRef(0, index, 9, True)
    assert TileRef(0, index, 9, True).path == f"tile/entries/{encoded}.p/9"


@pytest.mark.parametrize("path", [
    "tile/0/0000", "tile/0/x000/001", "tile/01/000", "tile/64/000", "tile/0/000.p/0",
    "tile/0/000.p/256", "tile/0/000.p/07", "tile/0/1", "tile/0/001/x002", "tiles/0/000",
    "tile/entries", "tile/0/000.p",
])
def test_paths_not_as_the_spec_encodes_them_are_refused(path: str) -> None:
    with pytest.raises(InvalidInputError):
        tiles.parse_path(path)


def test_tiles_between_names_each_grown_tile_once() -> None:
    paths = {r.path for r in tiles.tiles_between(0, 256)}
    assert paths == {"tile/0/000", "tile/entries/000", "tile/1/000.p/1"}
    grown = {r.path for r in tiles.tiles_between(256, 70_000)}
    assert "tile/0/000" not in grown and "tile/0/273.p/112" in grown
    assert "tile/1/001.p/17" in grown and "tile/2/000.p/1" in grown
    assert "tile/0/272" in grown and "tile/entries/272" in grown


def test_bundles_round_trip_and_refuse_bad_lengths() -> None:
    entries = [b"a", b"b" * 300, b"c" * 65535]
    assert tiles.decode_bundle(tiles.encode_bundle(entries), 3) == entries
    with pytest.raises(MalformedProofError, match="holds 3 entries, expected 4"):
        tiles.decode_bundle(tiles.encode_bundle(entries), 4)
    with pytest.raises(MalformedProofError, match="overruns"):
        tiles.decode_bundle(tiles.encode_bundle(entries)[:-1], 3)
    with pytest.raises(ValueError):
        tiles.encode_bundle([b"x" * 65536])


@pytest.mark.parametrize(("size", "start", "end"), [
    (1, 0, 1), (257, 0, 257), (257, 100, 257), (1000, 255, 513), (70_001, 65_535, 65_537),
])
def test_a_range_of_leaves_checks_against_the_root_and_a_dropped_leaf_fails(
        size: int, start: int, end: int) -> None:
    leaves = [merkle.hash_leaf(str(i).encode()) for i in range(size)]
    tree = merkle.MemoryTree(leaves)
    nodes = tiles.TileNodes(size, lambda ref: b"".join(
        tree.nodes[(ref.level * 8, ref.first + i)] for i in range(ref.width)))
    tiles.check_leaves(size, tree.root(), start, end, leaves[start:end], nodes.node)
    dropped = leaves[start:end]
    del dropped[len(dropped) // 2]
    with pytest.raises(MalformedProofError, match="leaves given"):
        tiles.check_leaves(size, tree.root(), start, end, dropped, nodes.node)
    if end - start > 1:  # one leaf swapped for a neighbour's copy: same count, other root
        swapped = leaves[start:end]
        swapped[0] = swapped[1]
        with pytest.raises(RootMismatchError):
            tiles.check_leaves(size, tree.root(), start, end, swapped, nodes.node)
    # The tiles also answer any proof as the store does.
    assert merkle.inclusion_proof(start, size, nodes.read_nodes) == tree.inclusion_proof(start)


def test_only_v2_envelopes_are_envelopes() -> None:
    envelope = (b'{"body":"sha256:' + b"0" * 64 + b'","created_at":"2026-12-02T01:02:03.456Z",'
                b'"kind":"audit-record/v2","schema":"audit-leaf/v2","tenant_tag":null}')
    assert tiles.only_envelopes([envelope, envelope])
    assert not tiles.only_envelopes([envelope, b'{"schema":"audit-record/v1"}'])
    assert not tiles.only_envelopes([envelope[:-1] + b',"tenant":"x"}'])


def test_a_leaf_time_is_read_where_canonical_json_puts_it_or_parsed() -> None:
    from datetime import datetime

    from ledger.errors import VerificationError
    from ledger.window import entry_time

    v1 = b'{"created_at":"2026-11-03T08:00:01.250Z","tenant":"a"}'
    v2 = (b'{"body":"sha256:' + b"0" * 64 + b'","created_at":"2026-12-02T01:02:03.456Z",'
          b'"kind":"k","schema":"audit-leaf/v2","tenant_tag":null}')
    assert entry_time(v1) == datetime(2026, 11, 3, 8, 0, 1, 250000)
    assert entry_time(v2) == datetime(2026, 12, 2, 1, 2, 3, 456000)
    assert entry_time(b'{"a":1,"created_at":"2026-11-03T08:00:01+01:00"}') == \
        datetime(2026, 11, 3, 7, 0, 1)
    with pytest.raises(VerificationError):  # a second created_at: no single meaning
        entry_time(b'{"created_at":"2026-11-03T08:00:01.250Z","created_at":"2030-01-01"}')
