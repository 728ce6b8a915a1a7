"""The embedded default anchor: an append-only ``anchors`` table beside the log.

It refuses any checkpoint that is not a consistent extension of the last anchored one,
as the Fabric chaincode does; it cannot protect against the operator of the database
(that is what the Fabric anchor is for), but it gives auditors one place to find "the
checkpoint this log committed to" and keeps the verification path the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import insert, select

from ledger.checkpoint import NoteVerifier, check_extends
from ledger.store.schema import anchors
from ledger.store.sql import SqlLedger


@dataclass(frozen=True)
class AnchoredCheckpoint:
    size: int
    note: bytes
    kind: str
    ref: str
    anchored_at: datetime


class LocalAnchor:
    kind = "local"

    def __init__(self, ledger: SqlLedger, verifier: NoteVerifier, origin: str) -> None:
        self.ledger = ledger
        self.verifier = verifier
        self.origin = origin

    def latest(self) -> AnchoredCheckpoint | None:
        return self.latest_row(self.ledger)

    @staticmethod
    def latest_row(ledger: SqlLedger) -> AnchoredCheckpoint | None:
        """The newest anchored checkpoint, whatever anchor wrote it."""
        with ledger.engine.connect() as conn:
            row = conn.execute(select(anchors).order_by(anchors.c.size.desc()).limit(1)).first()
        return _anchored(row) if row else None

    def latest_size(self) -> int:
        latest = self.latest()
        return latest.size if latest else 0

    def get(self, size: int) -> AnchoredCheckpoint | None:
        with self.ledger.engine.connect() as conn:
            row = conn.execute(select(anchors).where(anchors.c.size == size)).first()
        return _anchored(row) if row else None

    def anchor(self, note: bytes) -> AnchoredCheckpoint:
        """Anchor ``note`` if it extends the last anchored checkpoint; idempotent."""
        offered = self.verifier.open_checkpoint(note, self.origin)
        existing = self.get(offered.size)
        if existing is not None and existing.note == note:
            return existing
        last = self.latest()
        trusted = self.verifier.open_checkpoint(last.note, self.origin) if last else None
        proof = (self.ledger.consistency_proof(trusted.size, offered.size)
                 if trusted and offered.size > trusted.size else [])
        check_extends(trusted, offered, proof)
        ref = f"local:{offered.size}"
        now = datetime.now(UTC).replace(tzinfo=None)
        with self.ledger.engine.begin() as conn:
            conn.execute(insert(anchors).values(size=offered.size, note=note, kind=self.kind,
                                                ref=ref, anchored_at=now))
        self.ledger.set_anchor(offered.size, ref, since=trusted.size if trusted else 0)
        return AnchoredCheckpoint(offered.size, note, self.kind, ref, now)


def _anchored(row: object) -> AnchoredCheckpoint:
    return AnchoredCheckpoint(int(row.size), bytes(row.note), str(row.kind),  # type: ignore[attr-defined]
                              str(row.ref), row.anchored_at)  # type: ignore[attr-defined]
