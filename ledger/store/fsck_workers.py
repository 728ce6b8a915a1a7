"""``log fsck``'s row checks spread over worker processes by ranges of leaf indexes
(decision 0059; the pool is ``range_workers``).

For every row of its range a worker either proves it (``QuickRows.proof``: its leaf
hash and the environment it names, judged later) or runs what the row alone says is
wrong with it (``row_findings``). The parent takes the verdicts in leaf order and does
all that depends on the rows before: comparing each leaf hash with the stored leaf, the
environments and stream starts a leaf names, the tree. So the findings, their words and
their order are those of one process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from ledger import merkle
from ledger.audit import EnvironmentKey, QuickRows
from ledger.leaves.batch_layouts import BatchLayouts
from ledger.leaves.envelope import Leaf
from ledger.store.fsck_row import Finding, row_findings
from ledger.store.log_api import RecordRow
from ledger.store.mirror import SqlMirror
from ledger.store.range_workers import (
    RangeJob,
    RowWorkers,
    Span,
    WorkerLostError,
    default_workers,
    read_only_engine,
)

__all__ = ["Checked", "Proven", "RowWorkers", "WorkerLostError", "default_workers",
           "fsck_verdicts"]

READ_BATCH = 5000


class Proven(NamedTuple):
    """A row ``QuickRows`` proved: right if its leaf hash is the stored leaf and the
    environment it names passes (``QuickRows.environment_passes``)."""

    leaf_index: int
    leaf_hash: bytes
    environment: EnvironmentKey | None


class Checked(NamedTuple):
    """Any other row: its bytes' leaf hash and what the row alone says is wrong with it
    (``row_findings``, to be reported only if that hash is the stored leaf), and its leaf
    for ``link_findings`` when nothing is. ``findings`` None: the check raised, and the
    parent repeats the row itself (so an error surfaces, or not, as in one process)."""

    leaf_index: int
    leaf_hash: bytes
    record_id: str
    findings: list[Finding] | None
    leaf: Leaf | None


def fsck_verdicts(workers: RowWorkers, origin: str, ranges: list[Span]
                  ) -> Iterator[Proven | Checked]:
    """Every row's verdict in leaf order, from ``workers`` over ``ranges``
    (``RowWorkers.ranges``)."""
    return workers.run(FSCK_JOB, ranges, origin)


class _RangeChecker:
    """One worker's own reading and layouts (a worker is one thread)."""

    def __init__(self, url: str, origin: str) -> None:
        self.origin = origin
        self.mirror = SqlMirror(read_only_engine(url))
        self.layouts = BatchLayouts()
        self.quick = QuickRows(origin, self.layouts, {})  # environments: the parent's

    def check(self, start: int, end: int | None) -> list[Proven | Checked]:
        verdicts: list[Proven | Checked] = []
        for chunk in self.mirror.scan_records(start, end, READ_BATCH):
            typed, stored_time = chunk.typed, chunk.stored_time
            for raw in chunk.rows:
                try:
                    proof = self.quick.proof(raw, typed, stored_time)
                except Exception:  # noqa: BLE001 - ``checked`` or the parent says why
                    proof = None
                if proof is not None:
                    verdicts.append(Proven(raw[0], proof[0], proof[2]))
                else:
                    verdicts.append(self.checked(raw, chunk.record_row))
        return verdicts

    def checked(self, raw: tuple[Any, ...], record_row: Callable[[tuple[Any, ...]], RecordRow]
                ) -> Checked:
        try:
            row = record_row(raw)
            leaf_hash = merkle.hash_leaf(row.canonical)
        except Exception:  # noqa: BLE001 - a value of another type: the parent names it
            return Checked(raw[0], b"", str(raw[1]), None, None)
        where = f"leaf {row.leaf_index} (record {row.record_id})"
        try:
            findings, leaf = row_findings(row, where, self.origin, self.layouts)
        except Exception:  # noqa: BLE001 - the parent repeats the row (see ``Checked``)
            findings, leaf = None, None
        return Checked(raw[0], leaf_hash, row.record_id, findings, leaf)  # as stored


_checker: _RangeChecker | None = None  # this worker process's


def _start_worker(url: str, origin: str) -> None:
    global _checker
    _checker = _RangeChecker(url, origin)


def _check_range(start: int, end: int | None) -> list[Proven | Checked]:
    assert _checker is not None, "a worker process starts with _start_worker"
    return _checker.check(start, end)


FSCK_JOB = RangeJob("log fsck", _start_worker, _check_range)
