"""Where anchors are remembered: the ``anchors`` table.

Every reader and writer of anchors (the local anchor, the Fabric anchor, the worker, the
routes, the exporter, the database evidence source) goes through ``AnchorStore``. Its one
write, ``record``, inserts one anchor row. Which anchor covers a mirror row is derived
from the anchor sizes (the first anchor whose size exceeds the row's leaf index,
decision 0029), so no row is rewritten and a crash cannot leave the two disagreeing.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from sqlalchemy import Engine, func, insert, select
from sqlalchemy.exc import IntegrityError

from ledger.store.schema import anchors, records


@dataclass(frozen=True)
class AnchoredCheckpoint:
    size: int
    note: bytes
    kind: str  # "local" or "fabric"
    ref: str  # "local:<size>" or "fabric:<channel>:<txid>:<block>"
    anchored_at: datetime


class AnchorStore(Protocol):
    def latest(self) -> AnchoredCheckpoint | None:
        """The newest anchored checkpoint, whatever anchor wrote it."""

    def get(self, size: int) -> AnchoredCheckpoint | None:
        """The anchor recorded for exactly ``size``, if any."""

    def record(self, size: int, note: bytes, kind: str, ref: str) -> AnchoredCheckpoint:
        """Store the anchor of checkpoint ``size``. Idempotent: recording a size already
        stored returns what is stored and changes nothing."""

    def unreferenced_below(self, size: int) -> int:
        """How many leaves below ``size`` no stored anchor covers yet (for checks)."""


def _now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


class SqlAnchorStore:
    """The anchors table and the records mirror of one ledger database, through that
    database's pooled engine (``SqlLedger.engine``): the store owns its SQL, the ledger
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
    """An in-memory twin for unit tests: anchors over a log of ``rows`` leaves."""

    def __init__(self, rows: int = 0) -> None:
        self.anchors: dict[int, AnchoredCheckpoint] = {}
        self.rows = rows
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

    def record(self, size: int, note: bytes, kind: str, ref: str) -> AnchoredCheckpoint:
        with self._lock:
            if size in self.anchors:
                return self.anchors[size]
            stored = AnchoredCheckpoint(size, note, kind, ref, _now())
            self.anchors[size] = stored
            return stored

    def unreferenced_below(self, size: int) -> int:
        with self._lock:
            covered = max(self.anchors, default=0)
            return max(0, min(size, self.rows) - covered)


def _anchored(row: Any) -> AnchoredCheckpoint:
    return AnchoredCheckpoint(int(row.size), bytes(row.note), str(row.kind), str(row.ref),
                              row.anchored_at)
