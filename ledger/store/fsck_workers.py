"""``log fsck``'s row checks spread over worker processes by ranges of leaf indexes
(decision 0059).

Each worker opens the database itself (an SQLite file read-only) and, for every row of
its range, either proves it (``QuickRows.proof``: its leaf hash and the environment it
names, judged later) or runs what the row alone says is wrong with it (``row_findings``).
The parent takes the verdicts range after range, in leaf order, and does all that
depends on the rows before: comparing each leaf hash with the stored leaf, the
environments and stream starts a leaf names, the tree. So the findings, their words and
their order are those of one process.
"""

from __future__ import annotations

import multiprocessing
import os
import sqlite3
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import NamedTuple
from urllib.parse import quote

from sqlalchemy import Engine, create_engine, make_url
from sqlalchemy.pool import StaticPool

from ledger import merkle
from ledger.audit import EnvironmentKey, QuickRows
from ledger.errors import BackendUnavailableError
from ledger.leaves.batch_layouts import BatchLayouts
from ledger.leaves.envelope import Leaf
from ledger.store.fsck_row import Finding, row_findings
from ledger.store.log_api import RecordRow
from ledger.store.mirror import SqlMirror

ROWS_PER_RANGE = 25_000  # a worker's task: its start-up and reading are a small part
MAX_WORKERS = 8  # beyond this the parent's share (tree, leaf comparisons) dominates
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


class WorkerLostError(BackendUnavailableError):
    """A worker process ended before answering for its range (killed, out of memory):
    nothing is concluded about the log (exit 3), never a partial "ok"."""

    def __init__(self, span: tuple[int, int | None]) -> None:
        start, end = span
        upto = f"{end})" if end is not None else "the end]"
        super().__init__(f"a log fsck worker ended before answering for leaves [{start}, "
                         f"{upto} (killed or out of memory): nothing is concluded; run "
                         "again, or with --workers 1")
        self.span = span


def default_workers() -> int:
    """One worker per core, at most ``MAX_WORKERS``."""
    return max(1, min(os.cpu_count() or 1, MAX_WORKERS))


@dataclass(frozen=True)
class RowWorkers:
    """Worker processes for the rows of the log at ``url``."""

    url: str
    workers: int = 2
    rows_per_range: int = ROWS_PER_RANGE

    def ranges(self, size: int) -> list[tuple[int, int | None]]:
        """Leaf-index ranges covering every row from 0 on; the last is open (rows
        beyond the log's size are reported by the parent)."""
        starts = list(range(0, max(size, 1), self.rows_per_range))
        return [(start, starts[at + 1] if at + 1 < len(starts) else None)
                for at, start in enumerate(starts)]

    def used(self, size: int) -> bool:
        """Whether workers pay for this log: more than one of them and of its ranges."""
        return self.workers > 1 and len(self.ranges(size)) > 1

    def verdicts(self, origin: str, size: int) -> Iterator[Proven | Checked]:
        """Every row's verdict in leaf order. A few ranges are handed out ahead of the
        one being read, so memory stays bounded however slow the reader is."""
        ranges = iter(self.ranges(size))
        processes = min(self.workers, len(self.ranges(size)))
        context = multiprocessing.get_context("spawn")  # no state of this process copied
        # An executor, not a multiprocessing.Pool: a worker killed mid-range (out of
        # memory, a signal) breaks it and every waiting result raises, where a Pool
        # loses the task and waits for it for ever.
        with ProcessPoolExecutor(processes, mp_context=context, initializer=_start_worker,
                                 initargs=(self.url, origin)) as pool:
            pending: deque[tuple[tuple[int, int | None], Future[list[Proven | Checked]]]]
            pending = deque()
            try:
                for span in ranges:
                    pending.append((span, pool.submit(_check_range, *span)))
                    if len(pending) >= 2 * processes:
                        break
                while pending:
                    span, result = pending.popleft()
                    try:
                        done = result.result()
                    except BrokenProcessPool as exc:
                        raise WorkerLostError(span) from exc
                    following = next(ranges, None)
                    if following is not None:
                        pending.append((following, pool.submit(_check_range, *following)))
                    yield from done
            except BrokenProcessPool as exc:  # broken before a range was handed out
                raise WorkerLostError(pending[0][0] if pending else (0, None)) from exc


class _RangeChecker:
    """One worker's own reading and layouts (a worker is one thread)."""

    def __init__(self, url: str, origin: str) -> None:
        self.origin = origin
        self.mirror = SqlMirror(_read_only_engine(url))
        self.layouts = BatchLayouts()
        self.quick = QuickRows(origin, self.layouts, {})  # environments: the parent's

    def check(self, start: int, end: int | None) -> list[Proven | Checked]:
        verdicts: list[Proven | Checked] = []
        for chunk in self.mirror.scan_records(start, end, READ_BATCH):
            typed, stored_time = chunk.typed, chunk.stored_time
            for raw in chunk.rows:
                proof = self.quick.proof(raw, typed, stored_time)
                if proof is not None:
                    verdicts.append(Proven(raw[0], proof[0], proof[2]))
                else:
                    verdicts.append(self.checked(chunk.record_row(raw)))
        return verdicts

    def checked(self, row: RecordRow) -> Checked:
        where = f"leaf {row.leaf_index} (record {row.record_id})"
        try:
            findings, leaf = row_findings(row, where, self.origin, self.layouts)
        except Exception:  # noqa: BLE001 - the parent repeats the row (see ``Checked``)
            findings, leaf = None, None
        return Checked(row.leaf_index, merkle.hash_leaf(row.canonical), row.record_id,
                       findings, leaf)


_checker: _RangeChecker | None = None  # this worker process's


def _start_worker(url: str, origin: str) -> None:
    global _checker
    _checker = _RangeChecker(url, origin)


def _check_range(start: int, end: int | None) -> list[Proven | Checked]:
    assert _checker is not None, "a worker process starts with _start_worker"
    return _checker.check(start, end)


def _read_only_engine(url: str) -> Engine:
    """The database at ``url`` for reading only: an SQLite file opened read-only (a
    worker can neither write it nor create it), any other database as given."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database:
        return create_engine(url, hide_parameters=True)
    location = f"file:{quote(os.path.abspath(parsed.database))}?mode=ro"

    def connect() -> sqlite3.Connection:
        return sqlite3.connect(location, uri=True, check_same_thread=False)
    return create_engine("sqlite://", creator=connect, poolclass=StaticPool,
                         hide_parameters=True)
