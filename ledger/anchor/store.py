"""Where anchors are remembered: the ``anchors`` table and the mirror's ``anchor_ref``.

Every reader and writer of anchors (the local anchor, the Fabric anchor, the worker, the
routes, the exporter, the database evidence source) goes through ``AnchorStore``. Its one
write, ``record``, inserts the anchor row AND gives every mirror row below the anchored
size that still has no reference this anchor's reference, in ONE database transaction:
a crash can leave neither an anchor whose rows are unreferenced nor rows referencing an
anchor that was never stored.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from sqlalchemy import func, insert, select, update
from sqlalchemy.exc import IntegrityError

from ledger.store.schema import anchors, records
from ledger.store.sql import SqlLedger


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
        """Store the anchor of checkpoint ``size`` and reference it from every mirror row
        below ``size`` that has no reference yet, atomically. Idempotent: recording a size
        already stored returns what is stored and changes nothing."""

    def unreferenced_below(self, size: int) -> int:
        """How many mirror rows below ``size`` have no anchor reference (for checks)."""


def _now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


class SqlAnchorStore:
    """The anchors table and the records mirror of one ledger database."""

    def __init__(self, ledger: SqlLedger) -> None:
        self.ledger = ledger

    def latest(self) -> AnchoredCheckpoint | None:
        with self.ledger.engine.connect() as conn:
            row = conn.execute(select(anchors).order_by(anchors.c.size.desc()).limit(1)).first()
        return _anchored(row) if row else None

    def get(self, size: int) -> AnchoredCheckpoint | None:
        with self.ledger.engine.connect() as conn:
            row = conn.execute(select(anchors).where(anchors.c.size == size)).first()
        return _anchored(row) if row else None

    def record(self, size: int, note: bytes, kind: str, ref: str) -> AnchoredCheckpoint:
        now = _now()
        # The ledger's writer engine takes SQLite's write lock at BEGIN, so two recorders
        # serialise; on PostgreSQL the primary key makes the loser's insert fail, which
        # rolls its mirror update back with it.
        try:
            with self.ledger._writer_engine.begin() as conn:
                row = conn.execute(select(anchors).where(anchors.c.size == size)).first()
                if row is not None:
                    return _anchored(row)
                conn.execute(insert(anchors).values(size=size, note=note, kind=kind, ref=ref,
                                                    anchored_at=now))
                # Every row still without a reference, not only those since the previous
                # anchor: rows a lost anchor never referenced are covered here at the latest.
                conn.execute(update(records)
                             .where(records.c.leaf_index < size,
                                    records.c.anchor_ref.is_(None))
                             .values(anchor_ref=ref))
        except IntegrityError:
            stored = self.get(size)
            if stored is None:
                raise
            return stored
        return AnchoredCheckpoint(size, note, kind, ref, now)

    def unreferenced_below(self, size: int) -> int:
        with self.ledger.engine.connect() as conn:
            return int(conn.execute(
                select(func.count()).select_from(records)
                .where(records.c.leaf_index < size, records.c.anchor_ref.is_(None))).scalar()
                or 0)


class MemoryAnchorStore:
    """An in-memory twin for unit tests: anchors and a mirror of ``rows`` leaf indexes."""

    def __init__(self, rows: int = 0) -> None:
        self.anchors: dict[int, AnchoredCheckpoint] = {}
        self.refs: list[str | None] = [None] * rows
        self._lock = threading.Lock()

    def add_rows(self, count: int) -> None:
        with self._lock:
            self.refs.extend([None] * count)

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
            for index in range(min(size, len(self.refs))):
                if self.refs[index] is None:
                    self.refs[index] = ref
            return stored

    def unreferenced_below(self, size: int) -> int:
        with self._lock:
            return sum(1 for ref in self.refs[:size] if ref is None)


def _anchored(row: Any) -> AnchoredCheckpoint:
    return AnchoredCheckpoint(int(row.size), bytes(row.note), str(row.kind), str(row.ref),
                              row.anchored_at)
