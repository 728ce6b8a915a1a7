"""The log's side of cosignatures: the ``cosignatures`` table in the ledger database.

Every line stored here was verified against the witness's pinned key before it was
written (``ledger.witness.client``); serving adds the lines to the log-signed note.
"""

from __future__ import annotations

from sqlalchemy import Engine, func, insert, select
from sqlalchemy.exc import IntegrityError

from ledger.cosignature import add_cosignatures, well_formed_line
from ledger.store.schema import cosignatures
from ledger.store.sql import SqlLedger


def store_cosignature(engine: Engine, size: int, witness: str, line: str,
                      timestamp: int) -> bool:
    """Keep a witness's (verified) line for checkpoint ``size``; False if it had one."""
    try:
        with engine.begin() as conn:
            conn.execute(insert(cosignatures).values(
                checkpoint_size=size, witness=witness, line=line.rstrip("\n"),
                timestamp=timestamp))
    except IntegrityError:
        return False
    return True


def cosignature_lines(engine: Engine, size: int) -> list[str]:
    """The stored lines for checkpoint ``size``, by witness name."""
    with engine.connect() as conn:
        rows = conn.execute(select(cosignatures.c.line)
                            .where(cosignatures.c.checkpoint_size == size)
                            .order_by(cosignatures.c.witness))
        return [str(line) + "\n" for (line,) in rows]


def cosigners_of(engine: Engine, size: int) -> set[str]:
    """The witnesses that cosigned checkpoint ``size``."""
    with engine.connect() as conn:
        rows = conn.execute(select(cosignatures.c.witness)
                            .where(cosignatures.c.checkpoint_size == size))
        return {str(name) for (name,) in rows}


def latest_cosigned_size(engine: Engine, witness: str) -> int | None:
    """The largest checkpoint ``witness`` cosigned for this log (its state, as we saw it)."""
    with engine.connect() as conn:
        value = conn.execute(select(func.max(cosignatures.c.checkpoint_size))
                             .where(cosignatures.c.witness == witness)).scalar()
    return int(value) if value is not None else None


def cosigned_note(ledger: SqlLedger, size: int, note: bytes) -> bytes:
    """The log-signed ``note`` of checkpoint ``size`` with its cosignature lines appended
    (a malformed stored line is left out: ``log fsck`` reports it)."""
    lines = [line for line in cosignature_lines(ledger.engine, size)
             if well_formed_line(line)]
    return add_cosignatures(note, lines) if lines else note
