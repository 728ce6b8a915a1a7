"""An offline window bundle (``export --window``) from a log read through its tiles:
the range's leaves and the tree nodes around them, and the v2 bodies the exporting key
may read (decision 0049), with the environment leaves before the range that those
records name, each proved included."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

from ledger import merkle, tiles
from ledger.client.tiles import FETCH_THREADS, RefusedError, TiledLog
from ledger.window import WindowAnswer
from ledger.window_bundle import WindowBundle


def export_window(log: TiledLog, since: datetime, until: datetime, answer: WindowAnswer,
                  entries: list[bytes], tags: set[str | None] | None
                  ) -> tuple[WindowBundle, int]:
    """The bundle of ``answer``'s range (``entries``, proved by the caller) carrying the
    bodies of ``tags``' leaves (None: every tag the source lets this key read; a refused
    tag is left out). Returns it and how many v2 leaves of the range have no body in it."""
    nodes: dict[tuple[int, int], bytes] = {}

    def outside(level: int, idx: int) -> bytes:
        nodes[(level, idx)] = log.nodes.node(level, idx)
        return nodes[(level, idx)]

    tiles.root_with_leaves(log.size, answer.start, [merkle.hash_leaf(e) for e in entries],
                           outside)
    bodies = _range_bodies(log, answer.start, answer.end, tags)
    leaves: dict[int, bytes] = {}
    for index in sorted(bodies):
        at = _environment_index(bodies[index])
        if at is None or at >= answer.start or at in leaves:
            continue  # a leaf in the range brings its own body; one before it, once
        entry = log.proved_leaf(at)
        tiles.root_with_leaves(log.size, at, [merkle.hash_leaf(entry)], outside)
        leaves[at] = entry
        bodies[at] = log.body(at, entry)
    in_range = sum(len(p) for n in _bundles(answer.start, answer.end)
                   for p in _positions(log, n, answer.start, answer.end).values())
    left_out = in_range - sum(1 for i in bodies if answer.start <= i < answer.end)
    return WindowBundle(log.note, since, until, answer.start, answer.end,
                        list(enumerate(entries, start=answer.start)), nodes,
                        bodies=bodies, leaves=leaves), left_out


def _bundles(start: int, end: int) -> range:
    return range(start // tiles.TILE_WIDTH, (end - 1) // tiles.TILE_WIDTH + 1)


def _positions(log: TiledLog, n: int, start: int, end: int) -> dict[str | None, list[int]]:
    """Entry bundle ``n``'s v2 leaves in ``[start, end)``, by tenant tag."""
    first = n * tiles.TILE_WIDTH
    out = {tag: [p for p in found if start <= first + p < end]
           for tag, found in log.tags(n).items()}
    return {tag: found for tag, found in out.items() if found}


def _range_bodies(log: TiledLog, start: int, end: int, tags: set[str | None] | None
                  ) -> dict[int, bytes]:
    """The bodies of the range's v2 leaves of ``tags``, each checked by ``log.bodies``,
    their files fetched in parallel."""
    wanted = [(n, tag) for n in _bundles(start, end) for tag in _positions(log, n, start, end)
              if tags is None or tag in tags]

    refused: set[str | None] = set()

    def fetch(key: tuple[int, str | None]) -> dict[int, bytes]:
        if key[1] in refused:
            return {}
        try:
            return log.bodies(*key)
        except RefusedError:
            if key[1] is None or tags is not None:
                raise  # the log-wide bodies, or a tag asked for: never left out
            refused.add(key[1])  # another tenant's: this key may not read them
            return {}

    bodies: dict[int, bytes] = {}
    with ThreadPoolExecutor(FETCH_THREADS) as pool:
        for found in pool.map(fetch, wanted):
            bodies.update((i, b) for i, b in found.items() if start <= i < end)
    return bodies


def _environment_index(body: bytes) -> int | None:
    """The environment leaf a record's body names (checked later by whoever opens it)."""
    ref = json.loads(body).get("environment")
    at = ref.get("leaf_index") if isinstance(ref, dict) else None
    return at if isinstance(at, int) else None
