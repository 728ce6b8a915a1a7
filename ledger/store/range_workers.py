"""Worker processes that each take ranges of a log's rows, for the whole-log scans
(``log fsck``, decision 0059; ``audit``, decision 0065).

Each worker opens the database itself (an SQLite file read-only), is started once with
its job's arguments, and answers for one range of leaf indexes at a time; the parent
takes the answers range after range, in leaf order, and does all that depends on the
rows before. A few ranges are handed out ahead of the one being read, so memory stays
bounded however slow the parent is.
"""

from __future__ import annotations

import multiprocessing
import os
import sqlite3
from collections import deque
from collections.abc import Callable, Generator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, NamedTuple
from urllib.parse import quote

from sqlalchemy import Engine, create_engine, make_url
from sqlalchemy.pool import StaticPool

from ledger.errors import BackendUnavailableError
from ledger.store.log_api import MIN_LEAF_INDEX
from ledger.store.sql import make_engine

ROWS_PER_RANGE = 25_000  # a worker's task: its start-up and reading are a small part
MAX_WORKERS = 8  # beyond this the parent's share (tree, leaf comparisons) dominates
MAX_LEAF_INDEX = 2**63 - 1  # a BIGINT's largest: no range starts beyond it

Span = tuple[int, int | None]  # leaf indexes [start, end), end None: to the last row


class RangeJob(NamedTuple):
    """What a worker does: ``start(*arguments)`` once, then ``check(start, end)`` for
    each range, answering a list in leaf order. Both are module-level functions: a
    spawned worker imports them. ``name``: the command, for ``WorkerLostError``."""

    name: str
    start: Callable[..., None]
    check: Callable[[int, int | None], list[Any]]


class WorkerLostError(BackendUnavailableError):
    """A worker process ended before answering for its range (killed, out of memory):
    nothing is concluded about the log (exit 3), never a partial "ok"."""

    def __init__(self, span: tuple[int, int | None], name: str = "log fsck") -> None:
        start, end = span
        upto = f"{end})" if end is not None else "the end]"
        super().__init__(f"a {name} worker ended before answering for leaves [{start}, "
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

    def ranges(self, next_row_from: Callable[[int], int | None]) -> list[Span]:
        """Leaf-index ranges covering every row (the first from ``MIN_LEAF_INDEX``, the
        last open (rows beyond
        the log's size are the parent's to report). Each range starts at a stored row
        (``next_row_from(i)``: the lowest leaf index of a row at or after ``i``, None if
        none or unreadable), about ``rows_per_range`` after the one before: ranges follow
        the rows stored, never a stored size or a stored index's mere value, since the
        database's owner can set either to anything (2**63 - 1 must not mean millions of
        empty ranges)."""
        starts = [MIN_LEAF_INDEX]
        while max(starts[-1], 0) <= MAX_LEAF_INDEX - self.rows_per_range:
            wanted = max(starts[-1], 0) + self.rows_per_range
            following = next_row_from(wanted)
            if following is None or following < wanted:
                break
            starts.append(following)
        return [(start, starts[at + 1] if at + 1 < len(starts) else None)
                for at, start in enumerate(starts)]

    def used(self, ranges: list[Span]) -> bool:
        """Whether workers pay for these ranges: more than one of them and of workers."""
        return self.workers > 1 and len(ranges) > 1

    def run(self, job: RangeJob, ranges: list[Span], *arguments: Any
            ) -> Generator[Any, None, None]:
        """Every answer of ``job`` over ``ranges`` (``ranges``), in leaf order; each
        worker starts with ``job.start(url, *arguments)``."""
        processes = min(self.workers, len(ranges))
        spans = iter(ranges)
        context = multiprocessing.get_context("spawn")  # no state of this process copied
        # An executor, not a multiprocessing.Pool: a worker killed mid-range (out of
        # memory, a signal) breaks it and every waiting result raises, where a Pool
        # loses the task and waits for it for ever.
        with ProcessPoolExecutor(processes, mp_context=context, initializer=job.start,
                                 initargs=(self.url, *arguments)) as pool:
            pending: deque[tuple[tuple[int, int | None], Future[list[Any]]]] = deque()
            try:
                for span in spans:
                    pending.append((span, pool.submit(job.check, *span)))
                    if len(pending) >= 2 * processes:
                        break
                while pending:
                    span, result = pending.popleft()
                    try:
                        done = result.result()
                    except BrokenProcessPool as exc:
                        raise WorkerLostError(span, job.name) from exc
                    following = next(spans, None)
                    if following is not None:
                        pending.append((following, pool.submit(job.check, *following)))
                    yield from done
            except BrokenProcessPool as exc:  # broken before a range was handed out
                raise WorkerLostError(pending[0][0] if pending else (0, None),
                                      job.name) from exc
            finally:  # stopped early (a finding that ends the scan, an error): no more
                pool.shutdown(wait=True, cancel_futures=True)


def read_only_engine(url: str) -> Engine:
    """The database at ``url`` for reading only, as the parent's ``SqlLedger`` reads it:
    an SQLite file opened read-only (a worker can neither write it nor create it; a
    ``file:`` URI as given, read-only too), PostgreSQL with the parent's own session
    settings (``make_engine``: they replace any ``options`` of the URL or of PGOPTIONS,
    so a worker's search path is the parent's and both read the same tables)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database:
        return make_engine(url)
    if str(parsed.query.get("uri", "")).lower() in ("true", "1"):
        location = parsed.database + ("&" if "?" in parsed.database else "?") + "mode=ro"
    else:
        location = f"file:{quote(os.path.abspath(parsed.database))}?mode=ro"

    def connect() -> sqlite3.Connection:
        return sqlite3.connect(location, uri=True, check_same_thread=False)
    return create_engine("sqlite://", creator=connect, poolclass=StaticPool,
                         hide_parameters=True)
