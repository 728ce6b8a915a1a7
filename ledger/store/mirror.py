"""The mirror: the log's leaves as rows an auditor can filter (decision 0042).

Derived from the log and rebuildable from it; ``audit`` checks it against the leaves'
bytes. The queries here read the ``records`` and ``environments`` tables; which checkpoint
and which anchor cover a row are computed from their sizes (decision 0029), never stored
per row.
"""

from __future__ import annotations

import base64
import bisect
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import Engine, and_, func, or_, select
from sqlalchemy.engine import Connection

from ledger.errors import InvalidInputError
from ledger.leaves.mirror import LOG_WIDE_TENANT
from ledger.store.log_api import MIN_LEAF_INDEX, RecordRow, ScannedRows
from ledger.store.schema import anchors, checkpoints, environments, records

QUERY_FILTERS = ("tenant", "model_digest", "accelerator_model", "driver_version",
                 "service_revision")
# Filters a v2 record answers through its environment (``environments``).
ENVIRONMENT_FILTERS = frozenset(QUERY_FILTERS) - {"tenant"} | {"model_name"}
# Exact filters the mirror answers: the API's, and the model's name (the console's).
EXACT_FILTERS = (*QUERY_FILTERS, "model_name")
# Names searched by a part of them (``contains``): case-insensitive, and a value's own
# ``%`` and ``_`` match only themselves.
PARTIAL_FILTERS = ("model_name", "accelerator_model", "driver_version", "service_revision")
# Orders of a page of the mirror: log order, or by time (oldest or newest first), the
# leaf index breaking ties so that every cursor names one place in the order.
PAGE_ORDERS = ("leaf", "time", "-time")


class MirrorPages(Protocol):
    """Pages of the mirror's rows by time window, exact filters and parts of names: what
    a bundle's or a report's records are chosen from."""

    def page(self, *, since: datetime | None = None, until: datetime | None = None,
             limit: int = 100, cursor: str | None = None, order: str = "leaf",
             filters: Mapping[str, str | None] | None = None,
             contains: Mapping[str, str] | None = None) -> MirrorPage: ...


class SqlMirror:
    """The mirror tables of one ledger database, read through ``engine``."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def get_record(self, record_id: str) -> RecordRow | None:
        """A mirror row; a v2 record's filter columns are its environment's."""
        with self.engine.connect() as conn:
            row = conn.execute(_with_coverage(_mirror_select())
                               .where(records.c.record_id == record_id)).first()
        return _record_row(row) if row else None

    def record_at(self, leaf_index: int) -> RecordRow | None:
        with self.engine.connect() as conn:
            row = conn.execute(_with_coverage(_mirror_select())
                               .where(records.c.leaf_index == leaf_index)).first()
        return _record_row(row) if row else None

    def next_row_from(self, index: int) -> int | None:
        """The lowest leaf index of a mirror row at or after ``index`` (an index seek);
        None if there is none, or if it is stored as no integer (as SQLite lets a
        tampered row hold): whole-log scans place their ranges by it."""
        if index >= 2**63:  # beyond any BIGINT
            return None
        with self.engine.connect() as conn:
            found = conn.execute(select(func.min(records.c.leaf_index))
                                 .where(records.c.leaf_index >= index)).scalar()
        return found if type(found) is int else None

    def environments(self) -> dict[int, dict[str, Any]]:
        """Every ``environments`` row by its leaf index, as stored (``audit`` checks them
        against the leaves' bytes)."""
        with self.engine.connect() as conn:
            return {int(row.leaf_index): {k: v for k, v in row._mapping.items()
                                          if k != "leaf_index"}
                    for row in conn.execute(select(environments))}

    def query(
        self,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = 100,
        cursor: str | None = None,
        **filters: str | None,
    ) -> tuple[list[RecordRow], str | None]:
        """Rows matching every given filter, by leaf index; returns (rows, next cursor).

        ``since`` is inclusive and ``until`` exclusive (UTC). Filters: tenant, model_name,
        model_digest, accelerator_model, driver_version, service_revision.
        """
        found = self.page(since=since, until=until, limit=limit, cursor=cursor,
                          filters=filters)
        return found.rows, found.next_cursor

    def page(
        self,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = 100,
        cursor: str | None = None,
        order: str = "leaf",
        filters: Mapping[str, str | None] | None = None,
        contains: Mapping[str, str] | None = None,
    ) -> MirrorPage:
        """One page of the rows matching the exact ``filters`` and the parts of names in
        ``contains``, in ``order`` (``PAGE_ORDERS``), after or before the cursor's place,
        with the cursors of the next and the previous page. A cursor of another order is
        refused (field cursor)."""
        if order not in PAGE_ORDERS:
            raise InvalidInputError("order", f"must be one of {', '.join(PAGE_ORDERS)}")
        if not 1 <= limit <= 10_000:
            raise InvalidInputError("limit", "must be between 1 and 10000")
        place = None if cursor is None else decode_position(cursor)
        if place is not None and place.order != order:
            raise InvalidInputError("cursor", "belongs to another sort order")
        backward = place is not None and place.backward
        keys = _order_keys(order)
        statement = mirror_filter(_with_coverage(_mirror_select()), since=since, until=until,
                                  filters=filters, contains=contains)
        if place is not None:
            statement = statement.where(_beyond(keys, place, order))
        ascending = (order != "-time") != backward
        statement = statement.order_by(*(k.asc() if ascending else k.desc() for k in keys))
        with self.engine.connect() as conn:
            rows = [_record_row(r) for r in conn.execute(statement.limit(limit + 1))]
        more = len(rows) > limit
        rows = rows[:limit]
        if backward:
            rows.reverse()
        if not rows:
            return MirrorPage([], None, None)
        after = (backward or more) and Position(order, False, rows[-1].created_at,
                                                 rows[-1].leaf_index)
        before = ((more if backward else place is not None)
                  and Position(order, True, rows[0].created_at, rows[0].leaf_index))
        return MirrorPage(rows, after.encode() if after else None,
                          before.encode() if before else None)

    def count(self, *, since: datetime | None = None, until: datetime | None = None,
              filters: Mapping[str, str | None] | None = None,
              contains: Mapping[str, str] | None = None) -> int:
        """How many mirror rows ``page`` with these filters would return in all."""
        statement = mirror_filter(select(func.count()).select_from(_mirror_from()),
                                  since=since, until=until, filters=filters, contains=contains)
        with self.engine.connect() as conn:
            return int(conn.execute(statement).scalar() or 0)

    def known_values(self, tenant: str | None = None) -> dict[str, list[str]]:
        """The distinct model names and digests, accelerators, drivers and service
        revisions of the records (of ``tenant`` only, when given), sorted: the console's
        pick-lists. Environment leaves are the log's, not a tenant's records."""
        names = ("model_name", "model_digest", "accelerator_model", "driver_version",
                 "service_revision")
        statement = (select(*(func.coalesce(records.c[n], environments.c[n]).label(n)
                              for n in names))
                     .select_from(_mirror_from()).distinct()
                     .where(records.c.tenant != LOG_WIDE_TENANT))
        if tenant is not None:
            statement = statement.where(records.c.tenant == tenant)
        with self.engine.connect() as conn:
            found = conn.execute(statement).all()
        return {n: sorted({str(v) for v in (row._mapping[n] for row in found)
                           if v is not None}) for n in names}

    def anchor_lags(self, since: datetime, until: datetime) -> list[tuple[datetime, float]]:
        """Seconds from sealing each checkpoint to anchoring it, for the anchors made in
        [since, until) (the console's plot)."""
        statement = (select(anchors.c.anchored_at, checkpoints.c.sealed_at)
                     .join(checkpoints, checkpoints.c.size == anchors.c.size)
                     .where(anchors.c.anchored_at >= since, anchors.c.anchored_at < until)
                     .order_by(anchors.c.anchored_at))
        with self.engine.connect() as conn:
            return [(row.anchored_at,
                     max(0.0, (row.anchored_at - row.sealed_at).total_seconds()))
                    for row in conn.execute(statement)]

    def iter_records(self, start: int = 0, end: int | None = None,
                     batch: int = 5000) -> Iterator[RecordRow]:
        """Every mirror row with ``start <= leaf_index < end``, in index order.

        The covering checkpoint and anchor of a batch's rows come from the checkpoints
        and anchors in its leaf range (and the first one past it), by bisect: a scan of
        the whole log reads each checkpoint and anchor once.
        """
        position = start
        while True:
            with self.engine.connect() as conn:
                # Plain SQL through the driver, each value converted by its column
                # type's own processor: SQLAlchemy's row objects cost more than the rest
                # of a full scan's reading.
                mark = "%s" if conn.dialect.name == "postgresql" else "?"
                sql = (f"SELECT {', '.join(c.name for c in _SCAN_COLUMNS)} FROM records "
                       f"WHERE leaf_index >= {mark}"
                       + (f" AND leaf_index < {mark}" if end is not None else "")
                       + f" ORDER BY leaf_index LIMIT {int(batch)}")
                found = conn.exec_driver_sql(
                    sql, (position,) if end is None else (position, end)).fetchall()
                convert = [(at, process) for at, column in enumerate(_SCAN_COLUMNS)
                           if (process := column.type.dialect_impl(conn.dialect)
                                                .result_processor(conn.dialect, None))]
                coverage = _Coverage.read(conn, int(found[0][0]),
                                          int(found[-1][0])) if found else None
            rows = [_scanned_row(r, convert, coverage) for r in found]
            yield from rows
            if len(rows) < batch:
                return
            position = rows[-1].leaf_index + 1

    def scan_records(self, start: int = 0, end: int | None = None,
                     batch: int = 5000) -> Iterator[ScannedRows]:
        """``iter_records``'s rows raw, ``batch`` at a time, on the driver's own cursor:
        a whole-log scan converts only the values it needs (``ScannedRows``)."""
        dialect = self.engine.dialect
        eager, record_row, stored_time = self._raw_reading()
        mark = "%s" if dialect.name == "postgresql" else "?"
        bound = f" AND leaf_index < {mark}" if end is not None else ""
        columns = ", ".join(c.name for c in _SCAN_COLUMNS)
        # The next page starts after the last value read, as stored: a tampered index
        # SQLite keeps as a real or as text pages on as the order places it. From
        # MIN_LEAF_INDEX the first page has no lower bound (SQLite orders -1e19 below it).
        first, following = (
            f"SELECT {columns} FROM records WHERE leaf_index {op} {mark}{bound} "
            f"ORDER BY leaf_index LIMIT {int(batch)}" for op in (">=", ">"))
        if start <= MIN_LEAF_INDEX:
            first = (f"SELECT {columns} FROM records WHERE 1 = 1{bound} "
                     f"ORDER BY leaf_index LIMIT {int(batch)}")
        sql, position = first, start
        while True:
            pooled = self.engine.raw_connection()
            try:
                cursor = pooled.cursor()
                values = () if sql is first and start <= MIN_LEAF_INDEX else (position,)
                cursor.execute(sql, values if end is None else (*values, end))
                found = cursor.fetchall()
                cursor.close()
                pooled.rollback()  # a read: nothing to keep, no transaction left open
            finally:
                pooled.close()
            if found and eager:
                found = [_converted(row, eager) for row in found]
            if found:
                yield ScannedRows(found, _TYPED_COLUMNS, record_row, stored_time)
            if len(found) < batch:
                return
            sql, position = following, found[-1][0]

    def scanned(self, rows: Sequence[tuple[Any, ...]]) -> ScannedRows:
        """Rows as ``scan_records`` of this database yields them raw (read by another
        process: a worker of a whole-log scan), as that scan hands them out."""
        _, record_row, stored_time = self._raw_reading()
        return ScannedRows(rows, _TYPED_COLUMNS, record_row, stored_time)

    def _raw_reading(self) -> tuple[list[tuple[int, Any]],
                                    Callable[[tuple[Any, ...]], RecordRow],
                                    Callable[[Any], datetime]]:
        """How a raw row is read: the values converted at once (with SQLite and
        PostgreSQL none needs it), so the raw row holds what ``iter_records`` would; how
        it becomes a ``RecordRow``; and its time, converted only on demand
        (``stored_time``: the rows of a batch share it)."""
        dialect = self.engine.dialect
        convert = [(at, process) for at, column in enumerate(_SCAN_COLUMNS)
                   if (process := column.type.dialect_impl(dialect)
                       .result_processor(dialect, None))]
        timed = _SCAN_COLUMNS.index(records.c.created_at)
        times = dict(convert).get(timed)
        eager = [(at, process) for at, process in convert if at != timed]
        lazy = [(timed, times)] if times is not None else []

        def record_row(raw: tuple[Any, ...]) -> RecordRow:
            return _scanned_row(raw, lazy, None)

        def stored_time(value: Any) -> datetime:
            if times is None:
                return value  # type: ignore[no-any-return]
            return times(value)  # type: ignore[return-value]

        return eager, record_row, stored_time


def _mirror_select() -> Any:
    """The mirror as auditors read it: a v2 record's filter columns (NULL in its own row)
    are filled from the environment it names."""
    names = [c.name for c in environments.c if c.name != "leaf_index"]
    return select(
        *[c for c in records.c if c.name not in names],
        *[func.coalesce(records.c[n], environments.c[n]).label(n) for n in names],
    ).select_from(_mirror_from())


def _mirror_from() -> Any:
    return records.outerjoin(environments,
                             environments.c.leaf_index == records.c.environment_index)


def mirror_filter(statement: Any, *, since: datetime | None, until: datetime | None,
                  filters: Mapping[str, str | None] | None = None,
                  contains: Mapping[str, str] | None = None) -> Any:
    """``statement`` (over the mirror: records joined to their environments) narrowed to
    the time range, the exact ``filters`` and the parts of names in ``contains``."""
    filters = filters or {}
    unknown = (set(filters) - set(EXACT_FILTERS)) | (set(contains or {}) - set(PARTIAL_FILTERS))
    if unknown:
        raise InvalidInputError(sorted(unknown)[0], "is not a known filter")
    if since is not None:
        statement = statement.where(records.c.created_at >= _naive_utc(since))
    if until is not None:
        statement = statement.where(records.c.created_at < _naive_utc(until))
    for name, value in filters.items():
        if value is None:
            continue
        if name in ENVIRONMENT_FILTERS:  # a v1 row's own column, or a v2 row's environment's
            statement = statement.where(or_(
                records.c[name] == value,
                records.c.environment_index.in_(
                    select(environments.c.leaf_index).where(environments.c[name] == value))))
        else:
            statement = statement.where(records.c[name] == value)
    for name, part in (contains or {}).items():
        # autoescape: the auditor's "%" or "_" is a character, never a wildcard.
        statement = statement.where(func.coalesce(records.c[name], environments.c[name])
                                    .icontains(part, autoescape=True))
    return statement


@dataclass(frozen=True)
class MirrorPage:
    rows: list[RecordRow]
    next_cursor: str | None
    previous_cursor: str | None


@dataclass(frozen=True)
class Position:
    """A place in a page order: after (or before) the row at ``created_at, leaf_index``."""

    order: str
    backward: bool
    created_at: datetime
    leaf_index: int

    def encode(self) -> str:
        if self.order == "leaf" and not self.backward:
            return encode_cursor(self.leaf_index)  # the API's cursor, as it always was
        micros = (self.created_at - _EPOCH) // timedelta(microseconds=1)
        text = (f"{'before' if self.backward else 'after'}:{self.order}:{micros}:"
                f"{self.leaf_index}")
        return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


_EPOCH = datetime(1970, 1, 1)
_MAX_MICROS = (datetime(9999, 12, 31) - _EPOCH) // timedelta(microseconds=1)


def decode_position(cursor: str) -> Position:
    """A cursor from ``MirrorPage``; anything else is refused (field cursor)."""
    bad = InvalidInputError("cursor", "is not a cursor this service issued")
    if _DECIMAL_CURSOR.fullmatch(cursor):
        return Position("leaf", False, _EPOCH, int(cursor))
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad from exc
    parts = text.split(":")
    if len(parts) == 2:
        return Position("leaf", False, _EPOCH, decode_cursor(cursor))
    if (len(parts) != 4 or parts[0] not in ("after", "before") or parts[1] not in PAGE_ORDERS
            or not _ASCII_INTEGER.fullmatch(parts[2]) or not _ASCII_INTEGER.fullmatch(parts[3])
            or not 0 <= int(parts[2]) <= _MAX_MICROS):
        raise bad
    if int(parts[3]) > MAX_CURSOR_LEAF:
        raise bad
    return Position(parts[1], parts[0] == "before",
                    _EPOCH + timedelta(microseconds=int(parts[2])), int(parts[3]))


def _order_keys(order: str) -> tuple[Any, ...]:
    return (records.c.leaf_index,) if order == "leaf" else (records.c.created_at,
                                                            records.c.leaf_index)


def _beyond(keys: tuple[Any, ...], place: Position, order: str) -> Any:
    """Rows past ``place`` in the direction read: later in the order, or earlier."""
    later = (order != "-time") != place.backward
    if order == "leaf":
        return keys[0] > place.leaf_index if later else keys[0] < place.leaf_index
    at = place.created_at
    if later:
        return or_(keys[0] > at, and_(keys[0] == at, keys[1] > place.leaf_index))
    return or_(keys[0] < at, and_(keys[0] == at, keys[1] < place.leaf_index))


def _with_coverage(statement: Any) -> Any:
    """``statement`` (a mirror select) plus the checkpoint that first covers each row and
    the anchor that covers it, computed from their sizes (decision 0029): each one
    primary-key lookup. Scans use ``_Coverage`` instead."""
    return statement.add_columns(
        select(func.min(checkpoints.c.size)).where(checkpoints.c.size > records.c.leaf_index)
        .scalar_subquery().label("checkpoint_size"),
        select(anchors.c.ref).where(anchors.c.size > records.c.leaf_index)
        .order_by(anchors.c.size).limit(1).scalar_subquery().label("anchor_ref"))



class _Coverage:
    """The checkpoints and anchors that cover a range of leaves: each leaf's first
    covering one is the first whose size exceeds its index (decision 0029)."""

    def __init__(self, checkpoint_sizes: list[int], anchor_sizes: list[int],
                 anchor_refs: list[str]) -> None:
        self.checkpoint_sizes = checkpoint_sizes
        self.anchor_sizes, self.anchor_refs = anchor_sizes, anchor_refs

    @classmethod
    def read(cls, conn: Connection, first: int, last: int) -> _Coverage:
        """Those covering leaves ``first..last``: the ones in that range and the first
        one past it."""
        sizes = [int(size) for (size,) in conn.execute(
            select(checkpoints.c.size).where(checkpoints.c.size > first,
                                             checkpoints.c.size <= last + 1)
            .order_by(checkpoints.c.size))]
        if not sizes or sizes[-1] <= last:
            beyond = conn.execute(select(func.min(checkpoints.c.size))
                                  .where(checkpoints.c.size > last)).scalar()
            if beyond is not None:
                sizes.append(int(beyond))
        anchored = [(int(size), str(ref)) for size, ref in conn.execute(
            select(anchors.c.size, anchors.c.ref).where(anchors.c.size > first,
                                                        anchors.c.size <= last + 1)
            .order_by(anchors.c.size))]
        if not anchored or anchored[-1][0] <= last:
            beyond_anchor = conn.execute(
                select(anchors.c.size, anchors.c.ref).where(anchors.c.size > last)
                .order_by(anchors.c.size).limit(1)).first()
            if beyond_anchor is not None:
                anchored.append((int(beyond_anchor.size), str(beyond_anchor.ref)))
        return cls(sizes, [size for size, _ in anchored], [ref for _, ref in anchored])

    def checkpoint_for(self, leaf: int) -> int | None:
        at = bisect.bisect_right(self.checkpoint_sizes, leaf)
        return self.checkpoint_sizes[at] if at < len(self.checkpoint_sizes) else None

    def anchor_for(self, leaf: int) -> str | None:
        at = bisect.bisect_right(self.anchor_sizes, leaf)
        return self.anchor_refs[at] if at < len(self.anchor_refs) else None


def _record_row(row: Any, coverage: _Coverage | None = None) -> RecordRow:
    """A mirror row; its covering checkpoint and anchor come from the row (computed by
    ``_mirror_select``) or from ``coverage``."""
    mapping = dict(row._mapping)
    leaf_index = int(mapping.pop("leaf_index"))
    checkpoint_size = mapping.pop("checkpoint_size", None)
    anchor_ref = mapping.pop("anchor_ref", None)
    if coverage is not None:
        checkpoint_size = coverage.checkpoint_for(leaf_index)
        anchor_ref = coverage.anchor_for(leaf_index)
    return RecordRow(
        leaf_index=leaf_index,
        record_id=mapping.pop("record_id"),
        created_at=mapping.pop("created_at"),
        tenant=mapping.pop("tenant"),
        canonical=bytes(mapping.pop("canonical")),
        checkpoint_size=None if checkpoint_size is None else int(checkpoint_size),
        anchor_ref=anchor_ref,
        stored_body=None if (body := mapping.pop("body")) is None else bytes(body),
        environment_index=mapping.pop("environment_index"),
        columns=mapping,
    )


# ``iter_records``'s columns: the row's own first, then the typed ones (``columns``).
_OWN_COLUMNS = ("leaf_index", "record_id", "created_at", "tenant", "canonical", "body",
                "environment_index")
_TYPED_COLUMNS = tuple(c.name for c in records.c if c.name not in _OWN_COLUMNS)
_SCAN_COLUMNS = tuple(records.c[name] for name in (*_OWN_COLUMNS, *_TYPED_COLUMNS))


def _scanned_row(row: Any, convert: Sequence[tuple[int, Callable[[Any], Any]]],
                 coverage: _Coverage | None) -> RecordRow:
    """A driver's row of ``_SCAN_COLUMNS``, each value passed through its column's
    processor in ``convert`` (by position)."""
    if convert:
        row = list(row)
        for at, process in convert:
            row[at] = process(row[at])
    leaf_index, record_id, created_at, tenant, canonical, body, environment_index = row[:7]
    leaf_index = int(leaf_index)
    return RecordRow(
        leaf_index=leaf_index, record_id=record_id, created_at=created_at, tenant=tenant,
        canonical=bytes(canonical),
        checkpoint_size=coverage.checkpoint_for(leaf_index) if coverage else None,
        anchor_ref=coverage.anchor_for(leaf_index) if coverage else None,
        stored_body=None if body is None else bytes(body),
        environment_index=environment_index,
        columns=dict(zip(_TYPED_COLUMNS, row[7:], strict=True)),
    )


def _converted(row: Sequence[Any], convert: Sequence[tuple[int, Callable[[Any], Any]]]
               ) -> tuple[Any, ...]:
    values = list(row)
    for at, process in convert:
        values[at] = process(values[at])
    return tuple(values)


def _naive_utc(moment: datetime) -> datetime:
    if moment.tzinfo is not None:
        return moment.astimezone(UTC).replace(tzinfo=None)
    return moment


CURSOR_PATTERN = "^[0-9]{1,15}$"  # what the API document promises (below 2**53, as JSON)
_DECIMAL_CURSOR = re.compile(CURSOR_PATTERN)
MAX_CURSOR_LEAF = 2**53 - 1  # a forged cursor must not overflow a SQL integer
# Every cursor ``page`` issues: the decimal one (log order, forward), or a Position's
# URL-safe base64 (another order, or backward).
PAGE_CURSOR_PATTERN = "^(?:[0-9]{1,15}|[A-Za-z0-9_-]{8,96})$"
_ASCII_INTEGER = re.compile("[0-9]{1,19}")  # str.isdigit() takes '²' and other scripts' digits


def encode_cursor(leaf_index: int) -> str:
    """The leaf index after which the next page starts, in decimal: a cursor grants
    nothing (every page is filtered and scoped anew), so it need not be opaque, and a
    plain pattern lets the API document say exactly which cursors it takes."""
    return str(leaf_index)


def decode_cursor(cursor: str) -> int:
    if _DECIMAL_CURSOR.fullmatch(cursor):
        return int(cursor)
    try:  # the base64 "after:N" cursors this service issued before
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        prefix, _, number = text.partition(":")
        if (prefix != "after" or not _ASCII_INTEGER.fullmatch(number)
                or int(number) > MAX_CURSOR_LEAF):
            raise ValueError(text)
        return int(number)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidInputError("cursor", "is not a cursor this service issued") from exc


if TYPE_CHECKING:  # mypy holds the mirror to the Protocol its readers take
    def _plays_the_role(mirror: SqlMirror) -> MirrorPages:
        return mirror
