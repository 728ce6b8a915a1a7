"""Where witnesses' cosignatures are kept: the ``cosignatures`` table
(``SqlCosignatures``), or memory (``MemoryCosignatures``). Both play
``ledger.store.log_api.CosignatureStore``; a log hands its store out as ``cosignatures``.

Every line stored was verified against the witness's pinned key before it was written
(``ledger.witness.client``); serving adds the lines to the log-signed note
(``ledger.witness.cosignatures.cosigned_note``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

from sqlalchemy import Engine, func, insert, select
from sqlalchemy.exc import IntegrityError

from ledger.store.log_api import StoredCosignature
from ledger.store.schema import cosignatures


class SqlCosignatures:
    """The ``cosignatures`` table of one ledger database, through its pooled engine."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def store(self, size: int, witness: str, line: str, timestamp: int) -> bool:
        try:
            with self.engine.begin() as conn:
                conn.execute(insert(cosignatures).values(
                    checkpoint_size=size, witness=witness, line=line.rstrip("\n"),
                    timestamp=timestamp))
        except IntegrityError:
            return False
        return True

    def lines(self, size: int) -> list[str]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(cosignatures.c.line)
                                .where(cosignatures.c.checkpoint_size == size)
                                .order_by(cosignatures.c.witness))
            return [str(line) + "\n" for (line,) in rows]

    def cosigners(self, size: int) -> set[str]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(cosignatures.c.witness)
                                .where(cosignatures.c.checkpoint_size == size))
            return {str(name) for (name,) in rows}

    def latest_size(self, witness: str) -> int | None:
        with self.engine.connect() as conn:
            value = conn.execute(select(func.max(cosignatures.c.checkpoint_size))
                                 .where(cosignatures.c.witness == witness)).scalar()
        return int(value) if value is not None else None

    def iter_cosignatures(self) -> Iterator[StoredCosignature]:
        with self.engine.connect() as conn:
            stored = [StoredCosignature(int(size), str(witness), str(line))
                      for size, witness, line in conn.execute(
                          select(cosignatures.c.checkpoint_size, cosignatures.c.witness,
                                 cosignatures.c.line)
                          .order_by(cosignatures.c.checkpoint_size, cosignatures.c.witness))]
        yield from stored


class MemoryCosignatures:
    """The in-memory twin of the table: one line per (checkpoint size, witness)."""

    def __init__(self) -> None:
        self._lines: dict[tuple[int, str], str] = {}
        self._lock = threading.Lock()

    def store(self, size: int, witness: str, line: str, timestamp: int) -> bool:
        with self._lock:
            if (size, witness) in self._lines:
                return False
            self._lines[(size, witness)] = line.rstrip("\n")
            return True

    def lines(self, size: int) -> list[str]:
        with self._lock:
            return [self._lines[key] + "\n" for key in sorted(self._lines) if key[0] == size]

    def cosigners(self, size: int) -> set[str]:
        with self._lock:
            return {witness for at, witness in self._lines if at == size}

    def latest_size(self, witness: str) -> int | None:
        with self._lock:
            return max((at for at, name in self._lines if name == witness), default=None)

    def iter_cosignatures(self) -> Iterator[StoredCosignature]:
        with self._lock:
            stored = [StoredCosignature(size, witness, self._lines[(size, witness)])
                      for size, witness in sorted(self._lines)]
        yield from stored


if TYPE_CHECKING:  # mypy holds both stores to the Protocol
    from ledger.store.log_api import CosignatureStore

    def _plays_the_role(sql: SqlCosignatures, memory: MemoryCosignatures
                        ) -> tuple[CosignatureStore, CosignatureStore]:
        return sql, memory
