"""``audit``'s row proofs spread over worker processes by ranges of leaf indexes
(decision 0065; the pool is ``range_workers``).

A worker proves each covered row of its range it can (``QuickRows.proof``) and answers
consecutive proven rows naming one environment as one ``ProvenRun`` (their leaf hashes
concatenated: little to pickle, and the parent extends its tree by them in one call).
Any other row (the first of each batch, which teaches the worker its batch's layout, a
row the checkpoint does not cover, a row with something wrong) it answers raw, and the
parent gives it the full path in leaf order (``ledger.audit.audit_answers``), so the
findings are those of one process.
"""

from __future__ import annotations

from collections.abc import Generator
from datetime import datetime
from typing import Any

from ledger.audit import EnvironmentKey, ProvenRun, QuickRows, open_row
from ledger.leaves.batch_layouts import BatchLayouts
from ledger.store.log_api import ScannedRows
from ledger.store.mirror import SqlMirror
from ledger.store.range_workers import RangeJob, RowWorkers, Span, read_only_engine

READ_BATCH = 5000


def audit_answers_of(workers: RowWorkers, ranges: list[Span], origin: str, covered: int,
                     since: datetime, until: datetime
                     ) -> Generator[ProvenRun | tuple[Any, ...], None, None]:
    """The workers' answers for every row, in leaf order (``ranges``:
    ``RowWorkers.ranges``; ``covered``: the checkpoint's size; ``since``/``until``: the
    audit's range)."""
    return workers.run(AUDIT_JOB, ranges, origin, covered, since, until)


class _RangeAuditor:
    """One worker's own reading and layouts (a worker is one thread)."""

    def __init__(self, url: str, origin: str, covered: int, since: datetime,
                 until: datetime) -> None:
        self.origin, self.covered, self.since, self.until = origin, covered, since, until
        self.mirror = SqlMirror(read_only_engine(url))
        self.layouts = BatchLayouts()
        self.quick = QuickRows(origin, self.layouts, {})  # environments: the parent's

    def check(self, start: int, end: int | None) -> list[ProvenRun | tuple[Any, ...]]:
        answers: list[ProvenRun | tuple[Any, ...]] = []
        run = _Run()
        for chunk in self.mirror.scan_records(start, end, READ_BATCH):
            typed, stored_time = chunk.typed, chunk.stored_time
            for raw in chunk.rows:
                # Only a stored index that is an integer can be part of a run; any other
                # (SQLite keeps what it is given) is the parent's to read as one process.
                if type(raw[0]) is int and raw[0] < self.covered:
                    try:
                        proof = self.quick.proof(raw, typed, stored_time)
                    except Exception:  # noqa: BLE001 - the parent's full path says why
                        proof = None
                    if proof is not None:
                        leaf_hash, moment, environment = proof
                        if not run.continues(raw[0], environment):
                            run.close(answers)
                            run.open(raw[0], environment)
                        run.add(leaf_hash, self.since <= moment < self.until)
                        continue
                run.close(answers)
                self._learn(chunk, raw)
                answers.append(tuple(bytes(v) if isinstance(v, memoryview) else v
                                     for v in raw))
        run.close(answers)
        return answers

    def _learn(self, chunk: ScannedRows, raw: tuple[Any, ...]) -> None:
        """Open the row as the full path does, which teaches its batch's layout to the
        rows after it; what is wrong with it is the parent's to say."""
        try:
            row = chunk.record_row(raw)
            open_row(row.canonical, row.body, self.origin, layouts=self.layouts)
        except Exception:  # noqa: BLE001 - the parent's full path says what is wrong
            pass


class _Run:
    """The ``ProvenRun`` being gathered."""

    def __init__(self) -> None:
        self.first, self.hashes, self.in_range = 0, bytearray(), 0
        self.environment: EnvironmentKey | None = None

    def continues(self, index: int, environment: EnvironmentKey | None) -> bool:
        return (bool(self.hashes) and index == self.first + len(self.hashes) // 32
                and environment == self.environment)

    def open(self, index: int, environment: EnvironmentKey | None) -> None:
        self.first, self.environment = index, environment

    def add(self, leaf_hash: bytes, in_range: bool) -> None:
        self.hashes += leaf_hash
        self.in_range += in_range

    def close(self, answers: list[ProvenRun | tuple[Any, ...]]) -> None:
        if self.hashes:
            answers.append(ProvenRun(self.first, bytes(self.hashes), self.in_range,
                                     self.environment))
        self.hashes, self.in_range = bytearray(), 0


_auditor: _RangeAuditor | None = None  # this worker process's


def _start_worker(url: str, origin: str, covered: int, since: datetime,
                  until: datetime) -> None:
    global _auditor
    _auditor = _RangeAuditor(url, origin, covered, since, until)


def _check_range(start: int, end: int | None) -> list[ProvenRun | tuple[Any, ...]]:
    assert _auditor is not None, "a worker process starts with _start_worker"
    return _auditor.check(start, end)


AUDIT_JOB = RangeJob("audit", _start_worker, _check_range)
