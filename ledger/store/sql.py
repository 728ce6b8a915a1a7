"""The SQL ledger: a group-committing journal over SQLite or PostgreSQL.

One writer thread per process drains a queue of pending appends into one transaction
(group commit). Inside that transaction the sequencer row ``tree_state`` is locked
(``BEGIN IMMEDIATE`` on SQLite, ``SELECT ... FOR UPDATE`` on PostgreSQL), so appends from
several processes sharing one database are numbered with no gap and no duplicate. Each
append's future resolves only after its transaction has committed.

Every PostgreSQL session has bounded waits (``PgSessionSettings``): a lock wait, an idle
transaction and a statement all end after a set time, and TCP keepalives notice a peer
that vanished. A replica that freezes between statements while it holds ``tree_state``
stops the others only until the server ends its idle transaction (2 s by default); one
frozen while still sending a statement is fenced (``ledger.store.fencing``).
"""

from __future__ import annotations

import asyncio
import logging
import operator
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    Engine,
    create_engine,
    event,
    func,
    insert,
    select,
    text,
)
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.pool import NullPool

from ledger import merkle
from ledger.checkpoint import Checkpoint, NoteSigner
from ledger.errors import (
    BackendError,
    BackendUnavailableError,
    DuplicateRecordError,
    InvalidInputError,
    LeafTooLargeError,
    SequencerBusyError,
    WorkerDiedError,
)
from ledger.leaves.envelope import Leaf
from ledger.leaves.mirror import environment_row
from ledger.store import fencing
from ledger.store.anchors import SqlAnchorStore
from ledger.store.cosignatures import SqlCosignatures
from ledger.store.fencing import PROCESS_TAG
from ledger.store.file_modes import private_sqlite_files
from ledger.store.identity import SqlIdentity
from ledger.store.log_api import (
    LogLeaf,
    LogMeta,
    Receipt,
    RecordRow,
    ScannedRows,
    StoredCheckpoint,
    TreeProofs,
    parse_timestamp,
)
from ledger.store.mirror import SqlMirror
from ledger.store.rows import (
    RECORD_INSERT_COLUMNS,
    check_publishable,
    row_columns,
    stored_bytes,
)
from ledger.store.schema import (
    checkpoints,
    environments,
    tree_nodes,
    tree_state,
)
from ledger.store.sqlite_guard import guard_sqlite_engine
from ledger.store.tile_reads import SqlTileReads

log = logging.getLogger(__name__)

MAX_GROUP = 4096  # appends per transaction at most
LOCK_NOT_AVAILABLE = "55P03"  # PostgreSQL's SQLSTATE for a lock_timeout
# Rows per multi-row INSERT on PostgreSQL: well under its 65,535 parameters a statement.
PG_NODE_ROWS_PER_STATEMENT = 8192
PG_RECORD_ROWS_PER_STATEMENT = 2048
ENVIRONMENT_COLUMNS = tuple(column.name for column in environments.columns)
_RECORD_ROW = operator.itemgetter(*RECORD_INSERT_COLUMNS)  # a mirror row's values, in order

# Inside a writer transaction: run one statement and return its rows; insert a group's
# tree nodes, mirror rows and environment rows.
_Run = Callable[[str, Sequence[Any]], Sequence[Sequence[Any]]]
_Insert = Callable[[list[tuple[int, int, bytes]], list[tuple[Any, ...]],
                    list[dict[str, Any]]], None]


@dataclass(frozen=True)
class PgSessionSettings:
    """Bounds on every wait of a PostgreSQL session (seconds; 0 turns one off).

    - ``lock_timeout_s``: the longest a statement waits for a row or table lock. It must
      exceed ``writer_idle_in_transaction_s``: a writer waiting behind a frozen peer gets
      the lock once the server has ended that peer's idle transaction.
    - ``writer_idle_in_transaction_s``: the server ends a writer (append, seal) session
      that sits idle inside a transaction this long: a frozen or partitioned replica
      releases the ``tree_state`` row lock after at most this. Writer transactions never
      wait on anything but the database between statements.
    - ``idle_in_transaction_s``: the same for request and tool sessions, which may read a
      result at the pace of a client.
    - ``statement_timeout_s``: the longest one statement of a request or tool session may
      run (writer sessions have none: see ``make_engine``).
    - ``fence_after_s``: the lease holder ends (``pg_terminate_backend``) another
      process's writer session that holds the ``tree_state`` row and has waited on its
      client this long since its last statement (``SqlLedger.fence_stuck_writers``). The
      idle-in-transaction timeout cannot end every frozen writer: one frozen while it was
      still sending a statement leaves its session "active", waiting for the rest of the
      request, and the server arms that timeout only between complete requests (a writer
      frozen between its statements, even right after a bulk insert, is ended by the
      timeout: see ``SqlLedger._insert_rows``). Healthy writers wait on their client for
      milliseconds.
    - ``lease_ttl_s``: the lease session is ended by the server when it has not been
      renewed for this long (``idle_session_timeout``); the holder renews it at least
      three times per TTL, so another replica takes the lease at most this long (plus one
      integrator tick) after the holder froze.
    - ``keepalives_*``: libpq TCP keepalives and ``tcp_user_timeout``, so a vanished
      server (or network path) is noticed by the client in about
      ``idle + interval * count`` seconds instead of the kernel's two hours.
    """

    lock_timeout_s: float = 10.0
    writer_idle_in_transaction_s: float = 2.0
    idle_in_transaction_s: float = 30.0
    statement_timeout_s: float = 60.0
    lease_ttl_s: float = 3.0
    fence_after_s: float = 2.0
    keepalives_idle_s: int = 5
    keepalives_interval_s: int = 2
    keepalives_count: int = 3

    def connect_args(self, *, role: str, idle_in_transaction_s: float,
                     idle_session_s: float = 0.0,
                     statement_timeout_s: float | None = None) -> dict[str, Any]:
        """libpq connection parameters: keepalives and the session GUCs as ``options``."""
        statement = self.statement_timeout_s if statement_timeout_s is None \
            else statement_timeout_s
        gucs = {
            "lock_timeout": self.lock_timeout_s,
            "idle_in_transaction_session_timeout": idle_in_transaction_s,
            "statement_timeout": statement,
            "idle_session_timeout": idle_session_s,
            # The server's side of keepalives: it notices a vanished client too.
            "tcp_keepalives_idle": self.keepalives_idle_s,
            "tcp_keepalives_interval": self.keepalives_interval_s,
            "tcp_keepalives_count": self.keepalives_count,
        }
        options = " ".join(
            f"-c {name}={_pg_ms(value) if name.endswith('timeout') else int(value)}"
            for name, value in gucs.items()
        )
        dead_after_s = self.keepalives_idle_s + self.keepalives_interval_s * self.keepalives_count
        return {
            "options": options,
            "application_name": f"audit-ledger/{role}/{PROCESS_TAG}",
            "keepalives": 1,
            "keepalives_idle": self.keepalives_idle_s,
            "keepalives_interval": self.keepalives_interval_s,
            "keepalives_count": self.keepalives_count,
            "tcp_user_timeout": int(dead_after_s * 1000),
            "connect_timeout": max(2, int(self.lock_timeout_s)),
        }


def _pg_ms(seconds: float) -> int:
    return max(0, int(seconds * 1000))


def make_engine(url: str, *, writer: bool = False, sqlite_synchronous: str = "FULL",
                pg: PgSessionSettings | None = None, role: str = "request") -> Engine:
    """An engine with the pragmas a durable journal needs.

    ``sqlite_synchronous``: FULL (default) makes each commit survive power loss; NORMAL
    survives a process crash but may lose the last commits on power loss.

    On PostgreSQL ``role`` picks the session bounds (see ``PgSessionSettings``):
    "request" (pooled, for reads and tools), "writer" (appends and seals: a short idle
    transaction timeout) or "lease" (unpooled; idle sessions end after the lease TTL).
    """
    if sqlite_synchronous not in ("FULL", "NORMAL"):
        raise ValueError("sqlite_synchronous is FULL or NORMAL")
    if url.startswith("sqlite"):
        private_sqlite_files(url)  # 0600 before SQLite creates it (and its -wal, -shm)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30},
                               hide_parameters=True)  # errors never carry record bytes

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.isolation_level = None  # we issue BEGIN ourselves
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute(f"PRAGMA synchronous={sqlite_synchronous}")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.close()

        @event.listens_for(engine, "begin")
        def _begin(connection: Connection) -> None:
            # The writer takes the write lock up front: that is SQLite's sequencer.
            connection.exec_driver_sql("BEGIN IMMEDIATE" if writer else "BEGIN")

        guard_sqlite_engine(engine, url)  # a vanished or read-only file: 503, no SIGBUS
        return engine
    pg = pg or PgSessionSettings()
    if role == "lease":
        # Unpooled: the idle-session timeout must never follow a connection into a pool.
        return create_engine(url, poolclass=NullPool, hide_parameters=True,
                             connect_args=pg.connect_args(
                                 role=role,
                                 idle_in_transaction_s=pg.writer_idle_in_transaction_s,
                                 idle_session_s=pg.lease_ttl_s))
    if role == "writer":
        # The writer thread, the integrator and anchor bookkeeping: few connections.
        # No statement timeout here: a seal after a long pause marks every row since the
        # last checkpoint in one UPDATE, and must not fail forever on a big backlog.
        # Its lock waits are still bounded by lock_timeout.
        return create_engine(url, pool_pre_ping=True, pool_size=2, max_overflow=2,
                             hide_parameters=True, connect_args=pg.connect_args(
                                 role=role,
                                 idle_in_transaction_s=pg.writer_idle_in_transaction_s,
                                 statement_timeout_s=0.0))
    return create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=10,
                         hide_parameters=True, connect_args=pg.connect_args(
                             role="request", idle_in_transaction_s=pg.idle_in_transaction_s))


class _Pending:
    """One queued append, answered through a thread future or an asyncio future."""

    __slots__ = ("record", "future", "loop")

    def __init__(self, record: LogLeaf, loop: asyncio.AbstractEventLoop | None = None):
        self.record = record
        self.loop = loop
        self.future: Future[Receipt] | asyncio.Future[Receipt] = (
            loop.create_future() if loop is not None else Future()
        )


def _settle(outcomes: list[tuple[Any, Receipt | BaseException]]) -> None:
    """Answer each future that is still waiting; one whose caller gave up (cancelled)
    is skipped: setting it would raise and must never take the writer down."""
    for future, outcome in outcomes:
        if future.done():
            continue
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)


def _claim(future: Future[Receipt]) -> bool:
    """True if the caller still waits; from now on it can no longer cancel."""
    try:
        return future.set_running_or_notify_cancel()
    except RuntimeError:  # already answered
        return False


class SqlLedger(TreeProofs):
    """Journal, tree, checkpoints and mirror in one SQL database."""

    def __init__(self, url: str, *, sqlite_synchronous: str = "FULL",
                 pg: PgSessionSettings | None = None,
                 max_created_lag: timedelta | None = None) -> None:
        self.url = url
        # The lag rule (ledger.window): no leaf older than the newest before it by more
        # than this; None leaves it unchecked (tools and tests that write history).
        self.max_created_lag = max_created_lag
        self._newest: datetime | None = None
        self.is_postgres = url.startswith("postgresql")
        self.pg = pg or PgSessionSettings()
        self.engine = make_engine(url, pg=self.pg)
        self._writer_engine = make_engine(url, writer=True, sqlite_synchronous=sqlite_synchronous,
                                          pg=self.pg, role="writer")
        # The log's identity, mirror, anchors, cosignatures and tiles live in their own
        # modules (decisions 0042, 0048); they share this database's pool.
        self.identity = SqlIdentity(self.engine, self._writer_engine)
        self.mirror = SqlMirror(self.engine)
        self.anchors = SqlAnchorStore(self.engine)
        self.cosignatures = SqlCosignatures(self.engine)
        self.tiles = SqlTileReads(self.engine)
        # Items are single appends or lists of appends made in one event-loop turn.
        self._queue: queue.SimpleQueue[_Pending | list[_Pending] | None] = queue.SimpleQueue()
        self._turn_buffers: dict[asyncio.AbstractEventLoop, list[_Pending]] = {}
        self._compact: merkle.CompactRange | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False
        self.failure: BaseException | None = None  # why the writer thread stopped, if it did
        self.groups_committed = 0  # transactions the writer committed (group commit)
        mark = self._mark = "?" if not self.is_postgres else "%s"
        # The sequencer: the row lock orders appends and seals across processes.
        self._sequencer_sql = "SELECT size FROM tree_state WHERE id = 1" + (
            " FOR UPDATE" if self.is_postgres else "")
        self._node_insert_sql = (
            f"INSERT INTO tree_nodes (level, idx, hash) VALUES ({mark}, {mark}, {mark})"
        )
        self._record_insert_sql = (
            f"INSERT INTO records ({', '.join(RECORD_INSERT_COLUMNS)}) "
            f"VALUES ({', '.join([mark] * len(RECORD_INSERT_COLUMNS))})"
        )
        self._environment_insert_sql = (
            f"INSERT INTO environments ({', '.join(ENVIRONMENT_COLUMNS)}) "
            f"VALUES ({', '.join([mark] * len(ENVIRONMENT_COLUMNS))})"
        )
        self._node_insert_head = "INSERT INTO tree_nodes (level, idx, hash) VALUES "
        self._record_insert_head = (
            f"INSERT INTO records ({', '.join(RECORD_INSERT_COLUMNS)}) VALUES ")

    # --- lifecycle ------------------------------------------------------------------

    def start(self) -> SqlLedger:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._writer_loop, name="ledger-writer", daemon=True
                )
                self._thread.start()
        return self

    def close(self, timeout_s: float | None = 60.0) -> None:
        """Commit everything queued so far, then stop the writer.

        Waits at most ``timeout_s`` for the writer; appends still queued after that (or
        after the writer died) are failed, never left waiting.
        """
        with self._lock:
            self._closed = True
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join(timeout_s)
            if thread.is_alive():
                log.error("the ledger writer did not stop within %.0f s", timeout_s or 0)
        self._fail_queued(BackendUnavailableError("ledger is closed"))
        self.engine.dispose()
        self._writer_engine.dispose()

    def __enter__(self) -> SqlLedger:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- appending ------------------------------------------------------------------

    @property
    def writer_alive(self) -> bool:
        """False once the writer thread has died (not merely stopped by ``close``)."""
        return self.failure is None

    def _check_open(self) -> None:
        if self.failure is not None:
            raise WorkerDiedError("ledger-writer")
        if self._closed:
            raise BackendUnavailableError("ledger is closed")

    def _enqueue(self, item: _Pending | list[_Pending]) -> None:
        with self._lock:  # close() and a dying writer change these under the same lock
            self._check_open()
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._writer_loop, name="ledger-writer", daemon=True
                )
                self._thread.start()
            self._queue.put(item)

    def _enqueue_this_turn(self, pendings: Sequence[_Pending],
                           loop: asyncio.AbstractEventLoop) -> None:
        """Gather the appends made in one turn of ``loop`` into one queue item.

        A batch's records are appended together; queued one by one, the writer would
        wake on the first and commit the batch in several transactions (several fsyncs),
        releasing its answers in waves.
        """
        with self._lock:
            self._check_open()
        buffer = self._turn_buffers.get(loop)
        if buffer is None:
            buffer = self._turn_buffers[loop] = []
            loop.call_soon(self._flush_turn, loop)
        buffer.extend(pendings)

    def _flush_turn(self, loop: asyncio.AbstractEventLoop) -> None:
        buffer = self._turn_buffers.pop(loop, [])
        try:
            self._enqueue(buffer)
        except BackendError as exc:  # closed or dead since the appends were made
            _settle([(p.future, exc) for p in buffer])

    def _fail_queued(self, error: BaseException) -> None:
        """Answer every append still in the queue with ``error``."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not None:
                items = item if isinstance(item, list) else [item]
                self._answer(items, [error] * len(items))

    def submit(self, record: LogLeaf) -> Future[Receipt]:
        """Queue an append; the future resolves once it is durably committed."""
        pending = _Pending(record)
        self._enqueue(pending)
        assert isinstance(pending.future, Future)
        return pending.future

    def append(self, record: LogLeaf, timeout: float | None = 60.0) -> Receipt:
        return self.submit(record).result(timeout)

    def append_many(self, records: Sequence[LogLeaf], timeout: float | None = 60.0
                    ) -> list[Receipt | BaseException]:
        """Append ``records`` as one queue item: the writer never splits one, so they
        commit in one transaction (all or none on a crash)."""
        pendings = [_Pending(record) for record in records]
        self._enqueue(pendings)
        deadline = None if timeout is None else time.monotonic() + timeout
        outcomes: list[Receipt | BaseException] = []
        for pending in pendings:
            assert isinstance(pending.future, Future)
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            error = pending.future.exception(left)
            outcomes.append(error if error is not None else pending.future.result())
        return outcomes

    async def append_async(self, record: LogLeaf) -> Receipt:
        """Append from asyncio; a whole group's waiters are woken with one loop call."""
        loop = asyncio.get_running_loop()
        pending = _Pending(record, loop)
        self._enqueue_this_turn([pending], loop)
        assert isinstance(pending.future, asyncio.Future)
        return await pending.future

    async def append_many_async(self, records: Sequence[LogLeaf]
                                ) -> list[Receipt | BaseException]:
        """Append a batch's records together (one group, normally one transaction).

        Each outcome is that record's receipt or its own error: one record's failure
        (a clashing record id) does not fail the others.
        """
        loop = asyncio.get_running_loop()
        pendings = [_Pending(record, loop) for record in records]
        self._enqueue_this_turn(pendings, loop)
        # Futures, not coroutines: gathering them creates no task per record.
        futures = [p.future for p in pendings if isinstance(p.future, asyncio.Future)]
        return list(await asyncio.gather(*futures, return_exceptions=True))

    def _writer_loop(self) -> None:
        group: list[_Pending] = []
        carried: _Pending | list[_Pending] | None = None  # did not fit the last group
        try:
            stopping = False
            while not stopping or carried is not None:
                first = carried if carried is not None else self._queue.get()
                carried = None
                if first is None:
                    break
                group = list(first) if isinstance(first, list) else [first]
                while len(group) < MAX_GROUP and not stopping:
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if item is None:
                        stopping = True
                        break
                    items = item if isinstance(item, list) else [item]
                    if len(group) + len(items) > MAX_GROUP:
                        carried = item  # a batch is never split: it opens the next group
                        break
                    group.extend(items)
                if not group:
                    continue
                try:
                    self._commit_group(group)
                except Exception:  # a bug answering one group must not stop the writer
                    log.exception("the ledger writer failed to answer a group; continuing")
                    self._answer(group, [BackendError("append failed")] * len(group))
                group = []
        except BaseException as exc:  # the thread is going away: nobody may wait forever
            with self._lock:
                self.failure = exc
            log.critical("the ledger writer thread died", exc_info=True)
            died = WorkerDiedError("ledger-writer")
            if carried is not None:
                group = group + (carried if isinstance(carried, list) else [carried])
            self._answer(group, [died] * len(group))
            self._fail_queued(died)
            raise

    def _commit_group(self, group: list[_Pending]) -> None:
        outcomes: list[Receipt | BaseException]
        try:
            try:
                # Optimistic: record ids are fresh UUIDv7s, so the group is inserted
                # without first looking its ids up; the unique index still refuses a
                # repeated id, and then the group is written again with the lookup
                # (a retried append answers with its first receipt).
                outcomes = list(self._write(group, look_up_ids=False))
            except (IntegrityError, sqlite3.IntegrityError):
                self._compact = None  # the failed attempt advanced our in-memory tree
                outcomes = list(self._write(group, look_up_ids=True))
        except Exception as exc:  # every waiter must hear about the failure
            self._compact = None  # our view of the tree may be stale now
            error: Exception
            if isinstance(exc, BackendError):
                error = exc
            elif isinstance(exc, OperationalError | sqlite3.OperationalError):
                error = BackendUnavailableError(f"ledger database unavailable: {exc}")
            else:
                error = BackendError(f"append failed: {exc}")
            error.__cause__ = exc
            outcomes = [error] * len(group)
        self._answer(group, outcomes)

    @staticmethod
    def _answer(group: Sequence[_Pending], outcomes: Sequence[Receipt | BaseException]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[Any]] = {}
        direct: list[Any] = []
        for pending, outcome in zip(group, outcomes, strict=True):
            if pending.loop is not None:
                by_loop.setdefault(pending.loop, []).append((pending.future, outcome))
            else:
                direct.append((pending.future, outcome))
        # A thread future is cancelled by its caller from any thread: claim it first.
        _settle([(f, o) for f, o in direct if _claim(f)])
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_settle, items)
            except RuntimeError:  # that event loop is closed: nobody is waiting any more
                log.warning("dropped %d answers for a closed event loop", len(items))

    def _write(self, group: list[_Pending], look_up_ids: bool) -> list[Receipt | Exception]:
        """Write a group in one transaction; its outcomes once that has committed.

        Plain SQL throughout: building these statements with SQLAlchemy's expression
        language cost more CPU per group than running them. On SQLite they go straight
        to the sqlite3 connection under the pooled one (decision 0051): SQLAlchemy's own
        work per statement cost many times SQLite's. PostgreSQL keeps SQLAlchemy's
        connection and its bulk insert rules (``_insert_rows``).
        """
        if self.is_postgres:
            with self._writer_engine.begin() as conn:
                def run(sql: str, params: Sequence[Any]) -> Sequence[Sequence[Any]]:
                    result = conn.exec_driver_sql(sql, tuple(params)) if params \
                        else conn.exec_driver_sql(sql)
                    return result.all() if result.returns_rows else []

                def insert(node_rows: list[tuple[int, int, bytes]],
                           record_rows: list[tuple[Any, ...]],
                           environment_rows: list[dict[str, Any]]) -> None:
                    self._insert_rows(conn, node_rows, record_rows)
                    if environment_rows:  # rare: an engine started or changed
                        conn.execute(environments.insert().values(environment_rows))

                results, compact = self._write_in(run, insert, group, look_up_ids)
        else:
            with _sqlite_write_transaction(self._writer_engine) as raw:
                def run(sql: str, params: Sequence[Any]) -> Sequence[Sequence[Any]]:
                    return raw.execute(sql, params).fetchall()

                def insert(node_rows: list[tuple[int, int, bytes]],
                           record_rows: list[tuple[Any, ...]],
                           environment_rows: list[dict[str, Any]]) -> None:
                    raw.executemany(self._node_insert_sql, node_rows)
                    raw.executemany(self._record_insert_sql, record_rows)
                    raw.executemany(self._environment_insert_sql,
                                    [tuple(row.get(c) for c in ENVIRONMENT_COLUMNS)
                                     for row in environment_rows])

                results, compact = self._write_in(run, insert, group, look_up_ids)
        self._compact = compact
        self.groups_committed += 1
        return results

    def _write_in(self, run: _Run, insert: _Insert, group: list[_Pending], look_up_ids: bool
                  ) -> tuple[list[Receipt | Exception], merkle.CompactRange]:
        """The statements of one group, inside its transaction (``run`` one statement and
        return its rows; ``insert`` the group's rows)."""
        mark = self._mark
        size = run(self._sequencer_sql, ())[0][0]
        compact = self._compact
        if compact is None or compact.size != size:
            # Another process appended, or we just started: reload O(log n) nodes.
            compact = merkle.CompactRange.load(size, lambda keys: _nodes_by_key(run, mark, keys))
            if self.max_created_lag is not None:
                newest = run("SELECT max(created_at) FROM records", ())[0][0]
                self._newest = (parse_timestamp(newest) if isinstance(newest, str)
                                else newest)

        ids = list({p.record.record_id for p in group}) if look_up_ids else []
        existing = {
            row[0]: row  # (record_id, leaf_index, canonical)
            for start in range(0, len(ids), 500)  # bound the number of parameters
            for row in run(
                "SELECT record_id, leaf_index, canonical FROM records WHERE record_id IN "
                f"({', '.join([mark] * len(ids[start:start + 500]))})",
                ids[start:start + 500])
        }
        results: list[Receipt | Exception] = []
        assigned: dict[str, Receipt] = {}
        record_rows: list[tuple[Any, ...]] = []
        environment_rows: list[dict[str, Any]] = []
        node_rows: list[tuple[int, int, bytes]] = []
        created_at: dict[str, Any] = {}
        for pending in group:
            record = pending.record
            try:  # before it has an index: a refused leaf must leave no trace in the tree
                check_publishable(record)
            except LeafTooLargeError as exc:
                results.append(exc)
                continue
            earlier = existing.get(record.record_id)
            if earlier is not None:
                results.append(_idempotent_receipt(record, earlier[1], earlier[2]))
                continue
            if record.record_id in assigned:
                first = assigned[record.record_id]
                results.append(first if first.leaf_hash == record.leaf_hash else
                               DuplicateRecordError(f"record id {record.record_id} is "
                                                    "already used by another record"))
                continue
            columns = row_columns(record)
            stamp = columns["created_at"]
            if self.max_created_lag is not None:
                moment = parse_timestamp(stamp)
                if self._newest is not None and moment < self._newest - self.max_created_lag:
                    results.append(InvalidInputError(
                        "created_at", f"{stamp} is more than {self.max_created_lag} before "
                        "the newest leaf's time (the lag rule keeps windows provable)"))
                    continue  # refused before the tree has it, as above
                self._newest = max(moment, self._newest or moment)
            index = compact.size
            for (level, idx), node_hash in compact.append(record.leaf_hash):
                node_rows.append((level, idx, node_hash))
            if stamp not in created_at:  # a batch's records share one timestamp
                created = parse_timestamp(stamp)
                # SQLite keeps DATETIME as text in SQLAlchemy's own format.
                created_at[stamp] = created if self.is_postgres else _sqlite_datetime(created)
            columns["created_at"] = created_at[stamp]
            columns["leaf_index"] = index
            record_rows.append(_RECORD_ROW(columns))
            if isinstance(record, Leaf):
                environment = environment_row(record)
                if environment is not None:
                    environment_rows.append({"leaf_index": index, **environment})
            receipt = Receipt(record.record_id, index, record.leaf_hash)
            assigned[record.record_id] = receipt
            results.append(receipt)
        if record_rows:
            insert(node_rows, record_rows, environment_rows)
            run(f"UPDATE tree_state SET size = {mark}, root = {mark} WHERE id = 1",
                (compact.size, compact.root()))
        return results, compact

    def _insert_rows(self, conn: Connection, node_rows: list[tuple[int, int, bytes]],
                     record_rows: list[tuple[Any, ...]]) -> None:
        """Insert a group's tree nodes and mirror rows on PostgreSQL.

        Each chunk is one multi-row ``INSERT`` sent as one complete request (ending with
        ``Sync``), never ``executemany``: psycopg pipelines that and ends it with ``Sync``
        then ``Flush``, and the server arms the idle-in-transaction timeout only when it
        reads a message while ready for a query. The trailing ``Flush`` is read first and
        disarms it, so a writer frozen right after its bulk insert kept the sequencer row
        until fenced (decision 0028). SQLite has no such timer (see ``_write``).
        """
        for sql, rows, per_statement in (
            (self._node_insert_head, node_rows, PG_NODE_ROWS_PER_STATEMENT),
            (self._record_insert_head, record_rows, PG_RECORD_ROWS_PER_STATEMENT),
        ):
            width = len(rows[0])
            one_row = "(" + ", ".join(["%s"] * width) + ")"
            for start in range(0, len(rows), per_statement):
                chunk = rows[start:start + per_statement]
                values = ", ".join([one_row] * len(chunk))
                conn.exec_driver_sql(sql + values,
                                     tuple(value for row in chunk for value in row))

    # --- fencing ----------------------------------------------------------------------

    def fence_stuck_writers(self, older_than_s: float) -> list[tuple[int, str, float]]:
        """See ``ledger.store.fencing.fence_stuck_writers``; nothing on SQLite."""
        if not self.is_postgres:
            return []
        return fencing.fence_stuck_writers(self.engine, older_than_s)

    def fencing_reach(self) -> fencing.FencingReach | None:
        """Whose stuck writers this replica's role can end; None on SQLite (no fencing)."""
        return fencing.fencing_reach(self.engine) if self.is_postgres else None

    # --- reading the tree -----------------------------------------------------------

    def tree_head(self) -> tuple[int, bytes]:
        """The committed tree size and root (not necessarily sealed in a checkpoint)."""
        with self.engine.connect() as conn:
            row = conn.execute(select(tree_state.c.size, tree_state.c.root)).one()
        return int(row.size), bytes(row.root)

    def read_nodes(self, keys: Sequence[merkle.Node]) -> dict[merkle.Node, bytes]:
        with self.engine.connect() as conn:
            return _read_nodes(conn, keys)

    def read_leaves(self, start: int, end: int) -> dict[int, bytes]:
        """The leaf hashes stored at indexes [start, end), by index (a range read: its
        cost follows what is stored). A tampered index stored as no integer is none."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(tree_nodes.c.idx, tree_nodes.c.hash).where(
                tree_nodes.c.level == 0, tree_nodes.c.idx >= start,
                tree_nodes.c.idx <= end - 1)).all()  # ``end`` may be 2**63, no BIGINT
        return {idx: stored_bytes(leaf) for idx, leaf in rows if type(idx) is int}

    def next_leaf_from(self, index: int) -> int | None:
        """The lowest index of a stored leaf hash at or after ``index`` (an index seek);
        None if there is none or it is stored as no integer. ``log fsck`` skips by it
        what nothing is stored for, however large the stored tree size."""
        if index >= 2**63:  # beyond any BIGINT
            return None
        with self.engine.connect() as conn:
            found = conn.execute(select(func.min(tree_nodes.c.idx)).where(
                tree_nodes.c.level == 0, tree_nodes.c.idx >= index)).scalar()
        return found if type(found) is int else None

    # --- checkpoints ----------------------------------------------------------------

    def seal_checkpoint(self, signer: NoteSigner, origin: str, sealed_by: str | None = None,
                        lock_wait_s: float | None = None) -> StoredCheckpoint | None:
        """Sign the current tree head if it grew since the last checkpoint.

        Safe to call from several replicas at once: the ``tree_state`` row lock orders
        them, and the later one finds nothing new to seal. No mirror row is touched: the
        checkpoint that first covers a row follows from the checkpoint sizes.

        ``lock_wait_s`` (PostgreSQL) bounds the wait for that row below the session's
        ``lock_timeout``: the integrator must not sit behind a stuck writer for longer
        than its tick, or it could neither renew its lease nor fence that writer.
        Raises ``SequencerBusyError`` when the wait runs out.
        """
        try:
            return self._seal(signer, origin, sealed_by, lock_wait_s)
        except OperationalError as exc:
            if getattr(exc.orig, "sqlstate", None) == LOCK_NOT_AVAILABLE:
                raise SequencerBusyError("the sequencer row is locked by another "
                                         "session") from exc
            raise

    def _seal(self, signer: NoteSigner, origin: str, sealed_by: str | None,
              lock_wait_s: float | None) -> StoredCheckpoint | None:
        with self._writer_engine.begin() as conn:
            if self.is_postgres and lock_wait_s is not None:
                conn.execute(text("SELECT set_config('lock_timeout', :wait, true)"),
                             {"wait": f"{max(1, _pg_ms(lock_wait_s))}ms"})
            head = select(tree_state.c.size, tree_state.c.root).where(tree_state.c.id == 1)
            if self.is_postgres:
                head = head.with_for_update()
            size, root = conn.execute(head).one()
            last = conn.execute(select(func.max(checkpoints.c.size))).scalar()
            if last is not None and size <= last:
                return None
            note = signer.sign_checkpoint(Checkpoint(origin, int(size), bytes(root)))
            sealed_at = datetime.now(UTC).replace(tzinfo=None)
            conn.execute(insert(checkpoints).values(size=size, root=root, note=note,
                                                    sealed_at=sealed_at, sealed_by=sealed_by))
        return StoredCheckpoint(int(size), bytes(root), note, sealed_at, sealed_by)

    def latest_checkpoint(self) -> StoredCheckpoint | None:
        with self.engine.connect() as conn:
            row = conn.execute(
                select(checkpoints).order_by(checkpoints.c.size.desc()).limit(1)
            ).first()
        return _checkpoint(row) if row else None

    def checkpoint(self, size: int) -> StoredCheckpoint | None:
        with self.engine.connect() as conn:
            row = conn.execute(select(checkpoints).where(checkpoints.c.size == size)).first()
        return _checkpoint(row) if row else None

    def iter_checkpoints(self) -> Iterator[StoredCheckpoint]:
        with self.engine.connect() as conn:
            for row in conn.execute(select(checkpoints).order_by(checkpoints.c.size)):
                yield _checkpoint(row)

    def checkpoints_after(self, size: int) -> tuple[int, datetime | None, int]:
        """(how many checkpoints are larger than ``size``, the oldest one's seal time,
        the largest size) in one aggregate query."""
        with self.engine.connect() as conn:
            count, oldest, newest = conn.execute(
                select(func.count(), func.min(checkpoints.c.sealed_at),
                       func.max(checkpoints.c.size)).where(checkpoints.c.size > size)
            ).one()
        return int(count), oldest, int(newest) if newest is not None else size

    # --- identity and the leaves (their own modules; decision 0042) ---------------------

    def log_meta(self) -> LogMeta | None:
        return self.identity.log_meta()

    def create_log_meta(self, origin: str, verifier_key: str) -> LogMeta:
        return self.identity.create_log_meta(origin, verifier_key)

    def get_record(self, record_id: str) -> RecordRow | None:
        return self.mirror.get_record(record_id)

    def record_at(self, leaf_index: int) -> RecordRow | None:
        return self.mirror.record_at(leaf_index)

    def iter_records(self, start: int = 0, end: int | None = None,
                     batch: int = 5000) -> Iterator[RecordRow]:
        return self.mirror.iter_records(start, end, batch)

    def scan_records(self, start: int = 0, end: int | None = None,
                     batch: int = 5000) -> Iterator[ScannedRows]:
        return self.mirror.scan_records(start, end, batch)

    def next_row_from(self, index: int) -> int | None:
        return self.mirror.next_row_from(index)


def _sqlite_datetime(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f")


def _idempotent_receipt(record: LogLeaf, index: int, canonical: bytes) -> Receipt | Exception:
    if bytes(canonical) != record.canonical:
        return DuplicateRecordError(
            f"record id {record.record_id} is already used by another record"
        )
    return Receipt(record.record_id, int(index), record.leaf_hash)


@contextmanager
def _sqlite_write_transaction(engine: Engine) -> Iterator[sqlite3.Connection]:
    """A write transaction (``BEGIN IMMEDIATE``: SQLite's sequencer) on the sqlite3
    connection of a connection checked out of ``engine``'s pool, so the file guard and
    the pragmas still apply; committed when the block ends, rolled back if it raises."""
    pooled = engine.raw_connection()
    try:
        raw = pooled.driver_connection
        assert isinstance(raw, sqlite3.Connection)
        raw.execute("BEGIN IMMEDIATE")
        try:
            yield raw
            raw.commit()
        except BaseException:
            if raw.in_transaction:
                raw.rollback()
            raise
    finally:
        pooled.close()  # back to the pool (which rolls back anything left open)


def _read_nodes(conn: Connection, keys: Sequence[merkle.Node]) -> dict[merkle.Node, bytes]:
    mark = "%s" if conn.dialect.name == "postgresql" else "?"
    return _nodes_by_key(lambda sql, params: conn.exec_driver_sql(sql, tuple(params)).all(),
                         mark, keys)


def _nodes_by_key(run: _Run, mark: str, keys: Sequence[merkle.Node]
                  ) -> dict[merkle.Node, bytes]:
    """Fetch perfect-subtree hashes by (level, index) in one statement per 64 levels.

    Written as "(level = L AND idx IN (...)) OR ...", which SQLite and PostgreSQL both
    answer from the primary key (a row-value IN list made SQLite scan the table), and as
    plain SQL: building the expression with SQLAlchemy cost more than running it.
    """
    if not keys:
        return {}
    by_level: dict[int, list[int]] = {}
    for level, idx in keys:
        by_level.setdefault(level, []).append(idx)
    levels = list(by_level.items())
    found: dict[merkle.Node, bytes] = {}
    for start in range(0, len(levels), 64):
        clauses, params = [], []
        for level, idxs in levels[start : start + 64]:
            unique = sorted(set(idxs))
            clauses.append(f"(level = {mark} AND idx IN ({', '.join([mark] * len(unique))}))")
            params.extend([level, *unique])
        sql = "SELECT level, idx, hash FROM tree_nodes WHERE " + " OR ".join(clauses)
        for level, idx, node_hash in run(sql, params):
            found[(int(level), int(idx))] = stored_bytes(node_hash)
    return found


def _checkpoint(row: Any) -> StoredCheckpoint:
    return StoredCheckpoint(int(row.size), bytes(row.root), bytes(row.note), row.sealed_at,
                            row.sealed_by)


if TYPE_CHECKING:  # mypy holds the driver to every role's Protocol
    from ledger.store.identity import IdentityStore
    from ledger.store.log_api import Appender, CheckpointSealer, EvidenceLog, PublishableLog

    def _plays_every_role(ledger: SqlLedger) -> tuple[Appender, EvidenceLog, PublishableLog,
                                                       CheckpointSealer, IdentityStore]:
        return ledger, ledger, ledger, ledger, ledger
