"""A log of many tiny leaves written straight into the tables (tests and benches).

Appending records one by one through the writer is the subject of other tests; tile and
window tests need trees of 65,537 leaves, built here in one transaction from a
``merkle.CompactRange`` (the writer's own node arithmetic).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

from sqlalchemy import create_engine, text

from ledger import merkle
from ledger.checkpoint import Checkpoint, NoteSigner


def tiny_leaf(i: int) -> bytes:
    return f"leaf {i}".encode()


def build_log(url: str, count: int, signer: NoteSigner, origin: str,
              checkpoint_sizes: Sequence[int] = (),
              leaf: Callable[[int], bytes] = tiny_leaf,
              created_at: Callable[[int], datetime] | None = None,
              tenant: Callable[[int], str] = lambda i: "bank-a") -> list[bytes]:
    """Append ``count`` leaves to the (migrated, empty) log at ``url`` and seal a signed
    checkpoint at each of ``checkpoint_sizes`` (and at ``count``); returns the notes."""
    compact = merkle.CompactRange()
    nodes: list[dict[str, object]] = []
    records: list[dict[str, object]] = []
    roots: dict[int, bytes] = {}
    sizes = sorted({*checkpoint_sizes, count})
    for i in range(count):
        data = leaf(i)
        nodes.extend({"l": lv, "i": ix, "h": h}
                     for (lv, ix), h in compact.append(merkle.hash_leaf(data)))
        stamp = created_at(i) if created_at else datetime(2026, 11, 1)
        records.append({"i": i, "r": f"tiny-{i}", "c": stamp, "t": tenant(i), "b": data})
        if compact.size in sizes:
            roots[compact.size] = compact.root()
    notes = [signer.sign_checkpoint(Checkpoint(origin, size, roots[size])) for size in sizes]
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO tree_nodes (level, idx, hash) VALUES (:l, :i, :h)"),
                     nodes)
        conn.execute(text("INSERT INTO records (leaf_index, record_id, created_at, tenant, "
                          "canonical) VALUES (:i, :r, :c, :t, :b)"), records)
        conn.execute(text("UPDATE tree_state SET size = :s, root = :r WHERE id = 1"),
                     {"s": count, "r": compact.root()})
        conn.execute(text("INSERT INTO checkpoints (size, root, note, sealed_at) "
                          "VALUES (:s, :r, :n, :t)"),
                     [{"s": size, "r": roots[size], "n": note, "t": datetime(2026, 11, 2)}
                      for size, note in zip(sizes, notes, strict=True)])
    engine.dispose()
    return notes
