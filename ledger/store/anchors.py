"""Where anchors are remembered: the ``anchors`` table (``SqlAnchorStore``), or memory.

Every reader and writer of anchors (the local anchor, the Fabric anchor, the worker, the
routes, the exporter, the database evidence source, fsck) goes through ``AnchorStore``
(``ledger.store.log_api``), which a log hands out as ``anchors``. Its one
write, ``record``, inserts one anchor row. Which anchor covers a mirror row is derived
from the anchor sizes (the first anchor whose size exceeds the row's leaf index,
decision 0029), so no row is rewritten and a crash cannot leave the two disagreeing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, func, insert, select
from sqlalchemy.exc import IntegrityError

from ledger.store.log_api import AnchoredCheckpoint
from ledger.store.schema import anchors, records


def _now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


class SqlAnchorStore:
    """The anchors table and the records mirror of one ledger database, through that
    database's pooled engine: the store owns its SQL, the ledger (``SqlLedger.anchors``)
    only shares its connection pool."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def latest(self) -> AnchoredCheckpoint | None:
        with self.engine.connect() as conn:
            row = conn.execute(select(anchors).order_by(anchors.c.size.desc()).limit(1)).first()
        return _anchored(row) if row else None

    def get(self, size: int) -> AnchoredCheckpoint | None:
        with self.engine.connect() as conn:
            row = conn.execute(select(anchors).where(anchors.c.size == size)).first()
        return _anchored(row) if row else None

    def iter_anchors(self) -> Iterator[AnchoredCheckpoint]:
        with self.engine.connect() as conn:
            stored = [_anchored(r) for r in conn.execute(select(anchors)
                                                         .order_by(anchors.c.size))]
        yield from stored

    def record(self, size: int, note: bytes, kind: str, ref: str) -> AnchoredCheckpoint:
        now = _now()
        # One statement, a write first (so SQLite takes its write lock at once); a size
        # already recorded (by us earlier, or by another recorder) fails on the primary
        # key, and what is stored stands.
        try:
            with self.engine.begin() as conn:
                conn.execute(insert(anchors).values(size=size, note=note, kind=kind, ref=ref,
                                                    anchored_at=now))
        except IntegrityError:
            stored = self.get(size)
            if stored is None:
                raise
            return stored
        return AnchoredCheckpoint(size, note, kind, ref, now)

    def unreferenced_below(self, size: int) -> int:
        with self.engine.connect() as conn:
            covered = conn.execute(select(func.max(anchors.c.size))).scalar() or 0
            rows = conn.execute(select(func.count()).select_from(records)
                                .where(records.c.leaf_index >= covered,
                                       records.c.leaf_index < size)).scalar()
        return int(rows or 0)


class MemoryAnchorStore:
    """The in-memory twin: anchors over a log of ``rows`` leaves, or of as many leaves
    as ``log_size()`` says (the in-memory log's own store)."""

    def __init__(self, rows: int = 0, log_size: Callable[[], int] | None = None) -> None:
        self.anchors: dict[int, AnchoredCheckpoint] = {}
        self.rows = rows
        self._log_size = log_size
        self._lock = threading.Lock()

    def add_rows(self, count: int) -> None:
        with self._lock:
            self.rows += count

    def latest(self) -> AnchoredCheckpoint | None:
        with self._lock:
            return self.anchors[max(self.anchors)] if self.anchors else None

    def get(self, size: int) -> AnchoredCheckpoint | None:
        with self._lock:
            return self.anchors.get(size)

    def iter_anchors(self) -> Iterator[AnchoredCheckpoint]:
        with self._lock:
            stored = [self.anchors[size] for size in sorted(self.anchors)]
        yield from stored

    def record(self, size: int, note: bytes, kind: str, ref: str) -> AnchoredCheckpoint:
        with self._lock:
            if size in self.anchors:
                return self.anchors[size]
            stored = AnchoredCheckpoint(size, note, kind, ref, _now())
            self.anchors[size] = stored
            return stored

    def unreferenced_below(self, size: int) -> int:
        rows = self._log_size() if self._log_size is not None else self.rows
        with self._lock:
            covered = max(self.anchors, default=0)
            return max(0, min(size, rows) - covered)


def _anchored(row: Any) -> AnchoredCheckpoint:
    return AnchoredCheckpoint(int(row.size), bytes(row.note), str(row.kind), str(row.ref),
                              row.anchored_at)


if TYPE_CHECKING:  # mypy holds both stores to the Protocol
    from ledger.store.log_api import AnchorStore

    def _plays_the_role(sql: SqlAnchorStore, memory: MemoryAnchorStore
                        ) -> tuple[AnchorStore, AnchorStore]:
        return sql, memory
