"""The embedded default anchor: an append-only ``anchors`` table beside the log.

It refuses any checkpoint that is not a consistent extension of the last anchored one,
as the Fabric chaincode does; it cannot protect against the operator of the database
(that is what the Fabric anchor is for), but it gives auditors one place to find "the
checkpoint this log committed to" and keeps the verification path the same.
"""

from __future__ import annotations

from ledger.checkpoint import NoteVerifier, check_extends
from ledger.store.log_api import AnchoredCheckpoint, AnchoredLog, AnchorStore

__all__ = ["AnchoredCheckpoint", "LocalAnchor"]


class LocalAnchor:
    kind = "local"

    def __init__(self, ledger: AnchoredLog, verifier: NoteVerifier, origin: str,
                 store: AnchorStore | None = None) -> None:
        self.ledger = ledger
        self.verifier = verifier
        self.origin = origin
        self.store: AnchorStore = store or ledger.anchors

    def prepare(self) -> None:
        """Nothing to register: the table is created by the migrations."""

    def latest(self) -> AnchoredCheckpoint | None:
        return self.store.latest()

    def latest_size(self) -> int:
        latest = self.latest()
        return latest.size if latest else 0

    def get(self, size: int) -> AnchoredCheckpoint | None:
        return self.store.get(size)

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
        return self.store.record(offered.size, note, self.kind, f"local:{offered.size}")
