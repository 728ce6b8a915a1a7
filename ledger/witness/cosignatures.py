"""A checkpoint as served: the log-signed note with its witnesses' cosignature lines.

The lines themselves are kept by the log's ``CosignatureStore`` (``ledger.store.log_api``,
``ledger.store.cosignatures``), each verified against its witness's pinned key before it
was stored (``ledger.witness.client``).
"""

from __future__ import annotations

from ledger.cosignature import add_cosignatures, well_formed_line
from ledger.store.log_api import CosignedLog


def cosigned_note(log: CosignedLog, size: int, note: bytes) -> bytes:
    """The log-signed ``note`` of checkpoint ``size`` with its cosignature lines appended
    (a malformed stored line is left out: ``log fsck`` reports it)."""
    lines = [line for line in log.cosignatures.lines(size) if well_formed_line(line)]
    return add_cosignatures(note, lines) if lines else note
