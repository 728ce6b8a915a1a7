"""Completeness and faithfulness of the mirror: the rows an auditor queries are the log.

Every mirror row's canonical bytes are rehashed in leaf order and the root is rebuilt up
to a signed checkpoint's size: only if it equals the signed root do the rows' bytes form
the log (nothing missing, extra or altered). The bytes alone are not what auditors query,
though: the typed columns are. So every column is recomputed from the bytes
(``ledger.record.mirror_columns`` is the definition) and each disagreement is named by
row and column. The time range is taken from the records' own bytes.

Pure: rows come in as values; fetching them is the caller's business.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from hashlib import sha256
from typing import Any, NamedTuple, Protocol, TypeVar

from ledger import merkle
from ledger.canonical import parse_strict
from ledger.checkpoint import Checkpoint
from ledger.errors import LedgerError
from ledger.leaves.batch_layouts import BatchLayouts
from ledger.leaves.body_codec import unpack_body
from ledger.leaves.envelope import Leaf, envelope_bytes, is_envelope, tenant_tag
from ledger.leaves.environment import ENVIRONMENT_KIND, environment_columns
from ledger.leaves.kinds import open_leaf
from ledger.leaves.mirror import leaf_columns
from ledger.leaves.record_v2 import RECORD_KIND
from ledger.leaves.stream_link import StartFacts, named_start, stream_start_problem
from ledger.leaves.stream_start import STREAM_START_KIND
from ledger.record import AuditRecord, mirror_columns, validate_body

# Finding kinds (stable names, listed in the README):
COLUMN_MISMATCH = "column_mismatch"  # a typed column disagrees with the record's bytes
RECORD_UNPARSEABLE = "record_unparseable"  # stored bytes are not a canonical v1 record
ROWS_MISSING = "rows_missing"  # leaves the checkpoint or the log's size covers have no row
ROW_EXTRA = "row_extra"  # a mirror row beyond the log's size
ROOT_MISMATCH = "root_mismatch"  # the rebuilt root is not the signed one
# A stored value is not of its column's type (SQLite keeps whatever a tampering UPDATE
# gives a column): a leaf index 7.5 or 'x', a text body, a created_at that is no time.
ROW_MALFORMED = "row_malformed"
# An environments row disagrees with its environment leaf's bytes, is missing, names no
# environment leaf, or a v2 record names a leaf that is no environment.
ENVIRONMENT_MISMATCH = "environment_mismatch"
# A streamed v2 record names a stream start that is not in the log before it, or is
# another tenant's, or commits other content (decision 0050).
STREAM_START_MISMATCH = "stream_start_mismatch"


@dataclass(frozen=True)
class MirrorRow:
    """One mirror row as stored. ``columns``: every other typed column by name (None:
    the caller fetched only the bytes, and only record_id and created_at are checked)."""

    leaf_index: int
    record_id: str
    created_at: datetime  # the typed column, naive UTC
    canonical: bytes
    columns: Mapping[str, Any] | None = None
    body: bytes | None = None  # a v2 leaf's body (``canonical`` is its envelope)


@dataclass(frozen=True)
class AuditFinding:
    kind: str
    message: str
    leaf_index: int | None = None
    record_id: str | None = None
    column: str | None = None
    stored: str | None = None
    expected: str | None = None

    def __str__(self) -> str:
        return self.message

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class AuditReport:
    checkpoint_size: int
    in_range: int = 0
    uncovered: int = 0  # rows in range the checkpoint does not cover yet
    rows_checked: int = 0
    findings: list[AuditFinding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.findings


@functools.lru_cache(maxsize=1024)  # a batch's records share their time
def naive_utc(text: str) -> datetime:
    """RFC 3339 text as the mirror stores it: a naive UTC datetime."""
    moment = datetime.fromisoformat(text)
    return moment.astimezone(UTC).replace(tzinfo=None) if moment.tzinfo else moment


def _show(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.isoformat(timespec="microseconds") + ("" if value.tzinfo else "Z")
    return str(value)


def open_record(canonical: bytes, *, strict: bool = False) -> AuditRecord:
    """The record in a row's bytes, for recomputing its columns.

    ``strict`` also refuses bytes not in canonical form (re-serializing costs several
    times the rest); without it the bytes must still have exactly one meaning
    (``parse_strict``), which is all the columns depend on. ``audit`` proves the bytes
    are the log's by the root rebuild, and the log accepted only canonical records."""
    if strict:
        return AuditRecord.from_canonical(canonical)
    body = parse_strict(canonical)
    validate_body(body)
    return AuditRecord(body, canonical, b"")  # the leaf hash is not needed here


def open_row(canonical: bytes, body: bytes | None, origin: str, *, strict: bool = False,
             layouts: BatchLayouts | None = None) -> AuditRecord | Leaf:
    """A row's leaf: a v1 record (``open_record``), or a v2 envelope opened with its body
    (decision 0026). ``layouts``: a scan's, to open most v2 records by their batch's
    layout (``open_leaf``)."""
    if is_envelope(canonical):
        if body is None:
            raise LedgerError("the leaf is a v2 envelope and the row holds no body")
        return open_leaf(canonical, body, origin, strict=strict, layouts=layouts)
    if body is not None:
        raise LedgerError("a v1 record's row holds a body")
    return open_record(canonical, strict=strict)


def expected_columns(opened: AuditRecord | Leaf) -> dict[str, Any]:
    """Every typed column of a row, as its leaf's bytes define them."""
    if isinstance(opened, Leaf):
        return leaf_columns(opened)
    return {**mirror_columns(opened), "environment_index": None}


def column_findings(leaf_index: int, record_id: str, canonical: bytes,
                    stored: Mapping[str, Any], *, all_columns: bool = True,
                    strict: bool = False, body: bytes | None = None, origin: str = ""
                    ) -> list[AuditFinding]:
    """Every typed column of one row recomputed from its bytes; one finding per column
    that disagrees (``stored`` maps column names to the row's values). With
    ``all_columns`` False only the columns present in ``stored`` are compared.
    ``body``/``origin``: a v2 leaf's body and the log's origin (its tenant tag)."""
    try:
        record = open_row(canonical, body, origin, strict=strict)
    except LedgerError as exc:
        return [AuditFinding(RECORD_UNPARSEABLE, f"leaf {leaf_index} (record {record_id}): "
                             f"stored bytes are not a record: {exc}", leaf_index, record_id)]
    return compare_columns(leaf_index, record_id, record, stored, all_columns=all_columns)


def compare_columns(leaf_index: int, record_id: str, record: AuditRecord | Leaf,
                    stored: Mapping[str, Any], *, all_columns: bool = True
                    ) -> list[AuditFinding]:
    columns = expected_columns(record)
    said_at = columns["created_at"]
    try:
        stored_at: Any = naive_utc(said_at)
    except (TypeError, ValueError):
        stored_at = said_at  # an unparseable time can equal no stored datetime
    if all_columns and stored == {**columns, "created_at": stored_at}:
        return []  # every column at once (the usual row); else each is named below
    findings = []
    for name, said in columns.items():
        if not all_columns and name not in stored:
            continue
        value = stored.get(name)
        expected = stored_at if name == "created_at" else said
        if value != expected:
            findings.append(AuditFinding(
                COLUMN_MISMATCH, f"leaf {leaf_index} (record {record_id}): column {name} "
                f"is {_show(value)!r}, the record says {said!r}",
                leaf_index, record_id, name, _show(value), _show(said)))
    return findings


# The columns ``leaf_columns`` gives every v2 record as NULL (its environment's are in
# the environments table, its commitments stay in the body).
_NULL_COLUMNS = frozenset(name for name, value in leaf_columns(Leaf(
    b"", b"", b"", RECORD_KIND, {"record_id": "", "created_at": "", "tenant": ""})).items()
    if value is None) - {"environment_index"}
# The environment a v2 record names: (leaf index, leaf hash in hex, the record's engine).
EnvironmentKey = tuple[int, str, str]
_ENVELOPE_START = b'{"body":"sha256:'
_DIGEST_AT, _DIGEST_END = len(_ENVELOPE_START), len(_ENVELOPE_START) + 64  # the body's


class QuickRows:
    """Proves the usual row of a whole-log scan right from its raw values, or leaves it
    to the full path (``open_row`` and the column comparison), for ``log fsck`` and
    ``audit`` alike.

    A row is proven when its body inflates, its batch's layout reads it (``BatchLayouts``:
    canonical bytes, every rule of ``validate_record_v2``), its envelope is byte for byte
    the one the writer makes for that body (a canonical ``audit-record/v2`` envelope
    naming its digest, time and tenant tag), it names no stream start, every typed column
    equals what ``leaf_columns`` says (the NULL ones NULL, the rest equal values), and
    the environment it names passed ``environment_reference_problem`` before (a verdict
    that cannot change as the scan goes on: an index's environment leaf is set once).
    Such a row gets no finding from the full path and changes no state of the scan; any
    other row is handed to the full path, which says what is wrong with it."""

    def __init__(self, origin: str, layouts: BatchLayouts,
                 environment_leaves: Mapping[int, Leaf]) -> None:
        self._origin = origin
        self._layouts = layouts
        self._environment_leaves = environment_leaves
        self._named: set[EnvironmentKey] = set()  # those that passed
        self._keys: dict[EnvironmentKey, EnvironmentKey] = {}  # one object per key
        self._times: dict[Any, datetime] = {}  # stored created_at -> its datetime
        self._tails: dict[tuple[str, str], bytes | None] = {}  # (time, tenant) -> tail

    def _envelope_tail(self, created_at: str, tenant: str) -> bytes | None:
        """What follows the body's digest in the envelope the writer makes for a record
        of this time and tenant (``envelope_bytes``: the body enters only through that
        digest), so a row's envelope is compared without building it; None if it has
        no such envelope."""
        key = (created_at, tenant)
        if key not in self._tails:
            if len(self._tails) >= 4096:
                self._tails.clear()
            try:
                empty = envelope_bytes(RECORD_KIND, created_at,
                                       tenant_tag(self._origin, tenant), b"")
            except LedgerError:
                empty = b""
            digest = _ENVELOPE_START + sha256(b"").hexdigest().encode()
            self._tails[key] = empty[_DIGEST_END:] if empty.startswith(digest) else None
        return self._tails[key]

    def leaf_hash(self, raw: Sequence[Any], typed: Sequence[str],
                  stored_time: Callable[[Any], datetime]) -> tuple[bytes, datetime] | None:
        """The row's leaf hash and time if ``raw`` (``ScannedRows``' tuple; ``typed``:
        the names of its columns from the eighth on) is proven right; else None."""
        proof = self.proof(raw, typed, stored_time)
        if proof is None or not self.environment_passes(proof[2]):
            return None
        return proof[0], proof[1]

    def proof(self, raw: Sequence[Any], typed: Sequence[str],
              stored_time: Callable[[Any], datetime]
              ) -> tuple[bytes, datetime, EnvironmentKey | None] | None:
        """``leaf_hash`` but for the environment's verdict: the leaf hash, the time and
        the environment the row names (``environment_passes`` judges it), or None. A
        worker over a range of rows proves them so, without the leaves before them."""
        (_, record_id, created_at, tenant, envelope, stored_body, environment_index,
         *columns) = raw
        if (stored_body is None or not envelope.startswith(_ENVELOPE_START)
                or any(value is not None for value in columns)
                or len(typed) != len(_NULL_COLUMNS) or not _NULL_COLUMNS.issuperset(typed)):
            return None
        try:
            body = unpack_body(bytes(stored_body))
        except LedgerError:
            return None
        content = self._layouts.read(body)
        if (content is None or "stream" in content or content["record_id"] != record_id
                or content["tenant"] != tenant):
            return None
        envelope = bytes(envelope)
        tail = self._envelope_tail(content["created_at"], content["tenant"])
        if (tail is None or envelope[_DIGEST_AT:_DIGEST_END] != sha256(body).hexdigest().encode()
                or envelope[_DIGEST_END:] != tail):
            return None
        moment = self._times.get(created_at)
        if moment is None:
            if len(self._times) >= 4096:
                self._times.clear()
            moment = self._times[created_at] = stored_time(created_at)
        if moment != naive_utc(content["created_at"]):
            return None
        named = content.get("environment")
        if named is None:
            return None if environment_index is not None else (merkle.hash_leaf(envelope),
                                                               moment, None)
        key = (named["leaf_index"], named["leaf_hash"], content["engine"])
        if environment_index != key[0]:
            return None
        return merkle.hash_leaf(envelope), moment, self._keys.setdefault(key, key)

    def environment_passes(self, key: EnvironmentKey | None) -> bool:
        """Whether a proven row naming ``key`` (or none) gets no finding from
        ``environment_reference_problem`` given the environment leaves seen so far."""
        if key is None or key in self._named:
            return True
        if named_environment_problem(*key, self._environment_leaves) is not None:
            return False
        self._named.add(key)
        return True


def _check_row(row: MirrorRow, report: AuditReport, origin: str,
               environments: Mapping[int, Mapping[str, Any]] | None,
               environment_leaves: dict[int, Leaf], starts: dict[str, StartFacts],
               layouts: BatchLayouts) -> datetime | None:
    """Compare the row's columns with its bytes; returns the record's own time."""
    stored = dict(row.columns or {}, record_id=row.record_id, created_at=row.created_at)
    try:
        record = open_row(row.canonical, row.body, origin, layouts=layouts)
    except LedgerError as exc:
        report.findings.append(AuditFinding(
            RECORD_UNPARSEABLE, f"leaf {row.leaf_index} (record {row.record_id}): stored "
            f"bytes are not a record: {exc}", row.leaf_index, row.record_id))
        return None
    report.findings.extend(compare_columns(row.leaf_index, row.record_id, record, stored,
                                           all_columns=row.columns is not None))
    if environments is not None and isinstance(record, Leaf):
        _check_environment(row, record, environments, environment_leaves, report)
    if isinstance(record, Leaf):
        problem = stream_link_problem(record, row.leaf_index, starts)
        if problem is not None:
            report.findings.append(AuditFinding(
                STREAM_START_MISMATCH, f"leaf {row.leaf_index} (record {row.record_id}): "
                f"{problem}", row.leaf_index, row.record_id))
    try:
        return naive_utc(record.created_at)
    except ValueError:
        return None


def _check_environment(row: MirrorRow, leaf: Leaf,
                       environments: Mapping[int, Mapping[str, Any]],
                       environment_leaves: dict[int, Leaf],
                       report: AuditReport) -> None:
    """An environment leaf's ``environments`` row is recomputed from its bytes; a v2
    record must name an environment leaf before it (rows come in leaf order)."""
    where = f"leaf {row.leaf_index} (record {row.record_id})"
    if leaf.kind == ENVIRONMENT_KIND:
        expected = environment_columns(leaf.content)
        environment_leaves[row.leaf_index] = leaf
        stored = environments.get(row.leaf_index)
        if stored is None:
            report.findings.append(AuditFinding(
                ENVIRONMENT_MISMATCH, f"{where}: the environment leaf has no environments "
                "row", row.leaf_index, row.record_id))
            return
        for name, said in expected.items():
            if stored.get(name) != said:
                report.findings.append(AuditFinding(
                    ENVIRONMENT_MISMATCH, f"{where}: environments column {name} is "
                    f"{_show(stored.get(name))!r}, the environment leaf says {said!r}",
                    row.leaf_index, row.record_id, name, _show(stored.get(name)), said))
        return
    problem = environment_reference_problem(leaf, environment_leaves)
    if problem is not None:
        report.findings.append(AuditFinding(
            ENVIRONMENT_MISMATCH, f"{where}: {problem}", row.leaf_index, row.record_id,
            "environment_index"))


def environment_reference_problem(leaf: Leaf, environment_leaves: Mapping[int, Leaf]
                                  ) -> str | None:
    """What is wrong with the environment a v2 record names, or None: it must be an
    environment leaf before it (``environment_leaves``: those seen so far, by index),
    with the named leaf hash, of the record's own engine. Shared by ``audit`` and
    ``log fsck``."""
    named = leaf.content.get("environment")
    if named is None:
        return None
    return named_environment_problem(named["leaf_index"], named["leaf_hash"],
                                     leaf.content["engine"], environment_leaves)


def named_environment_problem(index: int, leaf_hash: str, engine: str,
                              environment_leaves: Mapping[int, Leaf]) -> str | None:
    """``environment_reference_problem`` for a record of ``engine`` naming leaf ``index``
    with ``leaf_hash`` (hex)."""
    environment = environment_leaves.get(index)
    if environment is None:
        problem = "which is no environment leaf before it"
    elif environment.leaf_hash.hex() != leaf_hash:
        problem = (f"but that leaf hashes to {environment.leaf_hash.hex()}, not the "
                   f"{leaf_hash} the record names")
    elif environment.content["engine"] != engine:
        problem = f"which is {environment.content['engine']}'s, not {engine}'s"
    else:
        return None
    return f"the record names leaf {index} as its environment, {problem}"


def stream_link_problem(leaf: Leaf, leaf_index: int, starts: dict[str, StartFacts]
                        ) -> str | None:
    """For leaves read in leaf order: a stream start is kept in ``starts`` (by record
    id) until the record that completes it names it; that record's link is judged
    (``stream_start_problem``) and the start let go, so only unfinished streams stay
    held and a second record naming one start finds none. Shared by ``audit`` and
    ``log fsck``."""
    if leaf.kind == STREAM_START_KIND:
        starts[leaf.record_id] = StartFacts.of(leaf, leaf_index)
        return None
    named = named_start(leaf)
    if named is None:
        return None
    return stream_start_problem(leaf, leaf_index, starts.pop(named, None))


class RawChunk(Protocol):
    """Consecutive mirror rows raw, as a whole-log scan reads them (the store's
    ``ScannedRows``): each row (leaf_index, record_id, created_at as stored, tenant,
    canonical, body as stored, environment_index, then the columns named in ``typed``);
    ``stored_time`` makes a stored created_at the datetime the row holds."""

    @property
    def rows(self) -> Sequence[tuple[Any, ...]]: ...

    @property
    def typed(self) -> tuple[str, ...]: ...

    @property
    def stored_time(self) -> Callable[[Any], datetime]: ...


ChunkT = TypeVar("ChunkT", bound=RawChunk)


def audit_range(rows: Iterable[MirrorRow], checkpoint: Checkpoint, since: datetime,
                until: datetime, log_size: int | None = None,
                environments: Mapping[int, Mapping[str, Any]] | None = None) -> AuditReport:
    """``rows`` in leaf order; ``log_size``: how many entries the log holds (rows beyond
    it are not in the log). ``checkpoint`` must already be signature-checked (its origin
    is the log's, which v2 tenant tags depend on). ``environments``: the stored
    ``environments`` rows by leaf index, each recomputed from its leaf's bytes (None:
    not checked)."""
    scan = _AuditScan(checkpoint, since, until, log_size, environments)
    for row in rows:
        if not scan.check(row):
            return scan.report
    return scan.finish()


def audit_scan(chunks: Iterable[ChunkT], row_of: Callable[[ChunkT, tuple[Any, ...]], MirrorRow],
               checkpoint: Checkpoint, since: datetime, until: datetime,
               log_size: int | None = None,
               environments: Mapping[int, Mapping[str, Any]] | None = None) -> AuditReport:
    """``audit_range`` over raw rows (``RawChunk``), with the same findings: a covered
    row next in leaf order that ``QuickRows`` proves is counted as the full path would
    count it; every other row is made a ``MirrorRow`` (``row_of``) and takes the full
    path."""
    scan = _AuditScan(checkpoint, since, until, log_size, environments)
    quick = QuickRows(checkpoint.origin, scan.layouts, scan.environment_leaves)
    for chunk in chunks:
        typed, stored_time = chunk.typed, chunk.stored_time
        for raw in chunk.rows:
            if raw[0] == scan.expected and raw[0] < checkpoint.size:  # covered, in order
                try:
                    proven = quick.leaf_hash(raw, typed, stored_time)
                except Exception:  # noqa: BLE001 - a malformed row: the full path names it
                    proven = None
                if proven is not None:
                    scan.proven(*proven)
                    continue
            row = scan.read(raw, lambda: row_of(chunk, raw))  # noqa: B023 - called at once
            if row is None or not scan.check(row):
                return scan.report
    return scan.finish()


class ProvenRun(NamedTuple):
    """Consecutive covered rows a worker proved (``QuickRows.proof``) as it scanned a
    range of the mirror, all naming the same environment (which only a scan in leaf
    order can judge): the first's leaf index, their leaf hashes concatenated, and how
    many of them have their own time in the audit's range."""

    first: int
    leaf_hashes: bytes
    in_range: int
    environment: EnvironmentKey | None


def audit_answers(answers: Iterable[ProvenRun | tuple[Any, ...]],
                  row_of: Callable[[tuple[Any, ...]], MirrorRow],
                  reread: Callable[[int], MirrorRow | None], checkpoint: Checkpoint,
                  since: datetime, until: datetime, log_size: int | None = None,
                  environments: Mapping[int, Mapping[str, Any]] | None = None
                  ) -> AuditReport:
    """``audit_scan`` over what workers found scanning the mirror by ranges (decision
    0065), in leaf order: a ``ProvenRun`` for covered rows they proved, the raw row
    (``row_of`` makes it a ``MirrorRow``) for any other. The findings are
    ``audit_scan``'s: a run's rows are counted as it counts them when the run starts at
    the row next in leaf order and the environment it names passes here; else each of
    its rows is read again (``reread``; None: the row is gone since) and takes the full
    path, as ``audit_scan`` gives every row that fails those tests."""
    scan = _AuditScan(checkpoint, since, until, log_size, environments)
    quick = QuickRows(checkpoint.origin, scan.layouts, scan.environment_leaves)
    for answer in answers:
        if type(answer) is ProvenRun:
            count, rest = divmod(len(answer.leaf_hashes), 32)
            if rest or not 0 <= answer.in_range <= count or type(answer.first) is not int:
                raise ValueError("a worker answered a malformed run of proven rows")
            if (answer.first == scan.expected and scan.expected + count <= checkpoint.size
                    and quick.environment_passes(answer.environment)):
                scan.counted_run(answer.leaf_hashes, count, answer.in_range)
                continue
            for index in range(answer.first, answer.first + count):
                try:
                    row = reread(index)
                except Exception as exc:  # noqa: BLE001 - named as one process names it
                    scan.malformed(index, None, _unreadable(exc))
                    return scan.report
                if row is None:
                    scan.report.findings.append(AuditFinding(
                        ROWS_MISSING, f"the mirror row of leaf {index} was removed during "
                        "the audit", index))
                    return scan.report
                if not scan.check(row):
                    return scan.report
        else:
            row = scan.read(answer, lambda: row_of(answer))  # noqa: B023 - called at once
            if row is None or not scan.check(row):
                return scan.report
    return scan.finish()


def _unreadable(exc: Exception) -> str:
    """A conversion's failure, by its type only: its text can quote stored values."""
    return f"a stored value is not of its column's type ({type(exc).__name__})"


class _AuditScan:
    """``audit_range``'s state, row by row in leaf order."""

    def __init__(self, checkpoint: Checkpoint, since: datetime, until: datetime,
                 log_size: int | None,
                 environments: Mapping[int, Mapping[str, Any]] | None) -> None:
        self.checkpoint, self.since, self.until = checkpoint, since, until
        self.log_size, self.environments = log_size, environments
        self.report = AuditReport(checkpoint.size)
        self.environment_leaves: dict[int, Leaf] = {}
        self.starts: dict[str, StartFacts] = {}  # stream starts not yet completed
        self.layouts = BatchLayouts()  # opens most records by their batch's layout
        self.compact = merkle.CompactRange()
        self.expected = 0
        self.uncovered_end = checkpoint.size  # one past the last row beyond the checkpoint

    def read(self, raw: Sequence[Any], make: Callable[[], MirrorRow]) -> MirrorRow | None:
        """The row ``make`` reads from ``raw`` (leaf index, record id, ...), or None
        after a ``row_malformed`` finding that ends the scan: a value not of its column's
        type is named, never read as another (a leaf index 7.5 as leaf 7) nor a crash."""
        if type(raw[0]) is not int:
            self.malformed(None, raw[1], f"its leaf index is stored as {raw[0]!r}, not "
                           "an integer")
            return None
        try:
            return make()
        except Exception as exc:  # noqa: BLE001 - any value the driver cannot convert
            self.malformed(raw[0], raw[1], _unreadable(exc))
            return None

    def malformed(self, index: int | None, record_id: Any, problem: str) -> None:
        where = f"leaf {index}" if index is not None else "a mirror row"
        named = f" (record {record_id})" if isinstance(record_id, str) else ""
        self.report.findings.append(AuditFinding(
            ROW_MALFORMED, f"{where}{named}: {problem}", index,
            record_id if isinstance(record_id, str) else None))

    def proven(self, leaf_hash: bytes, moment: datetime) -> None:
        """A covered row next in leaf order with no finding (``QuickRows``)."""
        self.counted(leaf_hash, self.since <= moment < self.until)

    def counted(self, leaf_hash: bytes, in_range: bool) -> None:
        """``proven``, its time already placed in the range or not."""
        self.report.rows_checked += 1
        self.compact.append(leaf_hash)
        self.expected += 1
        if in_range:
            self.report.in_range += 1

    def counted_run(self, leaf_hashes: bytes, count: int, in_range: int) -> None:
        """``counted`` for ``count`` rows in a row (``ProvenRun``)."""
        self.report.rows_checked += count
        self.compact.extend(leaf_hashes)
        self.expected += count
        self.report.in_range += in_range

    def check(self, row: MirrorRow) -> bool:
        """The full path for one row; False once rows are missing or a row cannot be
        read (the scan stops)."""
        try:
            return self._check(row)
        except Exception as exc:  # noqa: BLE001 - a value of another type (text bytes)
            self.malformed(row.leaf_index, row.record_id, _unreadable(exc))
            return False

    def _check(self, row: MirrorRow) -> bool:
        checkpoint, report = self.checkpoint, self.report
        if row.leaf_index < 0:  # a forged row a scan from 0 never read
            report.findings.append(AuditFinding(
                ROW_EXTRA, f"extra mirror row at leaf {row.leaf_index} (record "
                f"{row.record_id}): no leaf has a negative index", row.leaf_index,
                row.record_id))
            return True
        if self.log_size is not None and row.leaf_index >= max(self.log_size,
                                                                checkpoint.size):
            report.findings.append(AuditFinding(
                ROW_EXTRA, f"extra mirror row at leaf {row.leaf_index} (record "
                f"{row.record_id}): the log has {self.log_size} entries",
                row.leaf_index, row.record_id))
            return True
        report.rows_checked += 1
        # Columns are checked on every row, covered or not: they must say what the
        # bytes say whether or not a checkpoint vouches for the bytes yet.
        moment = _check_row(row, report, checkpoint.origin, self.environments,
                            self.environment_leaves, self.starts, self.layouts)
        if row.leaf_index >= checkpoint.size:
            if self.expected == checkpoint.size and row.leaf_index > self.uncovered_end:
                # Not covered yet, but the log has these leaves: their rows are owed.
                report.findings.append(AuditFinding(
                    ROWS_MISSING, f"mirror rows missing for leaves {self.uncovered_end}.."
                    f"{row.leaf_index - 1}", self.uncovered_end))
            self.uncovered_end = max(self.uncovered_end, row.leaf_index + 1)
            if self.since <= row.created_at < self.until:
                report.uncovered += 1
            return True
        if row.leaf_index != self.expected:
            report.findings.append(AuditFinding(
                ROWS_MISSING,
                f"mirror rows missing for leaves {self.expected}..{row.leaf_index - 1}",
                self.expected))
            return False
        self.compact.append(merkle.hash_leaf(row.canonical))
        self.expected += 1
        if moment is not None and self.since <= moment < self.until:
            report.in_range += 1
        return True

    def finish(self) -> AuditReport:
        checkpoint, report, expected = self.checkpoint, self.report, self.expected
        for index in sorted(set(self.environments or {}) - set(self.environment_leaves)):
            report.findings.append(AuditFinding(
                ENVIRONMENT_MISMATCH, f"environments row {index} names no environment leaf",
                index))
        if expected < checkpoint.size:
            report.findings.append(AuditFinding(
                ROWS_MISSING,
                f"mirror rows missing for leaves {expected}..{checkpoint.size - 1}",
                expected))
            return report
        if self.log_size is not None and self.uncovered_end < self.log_size:
            # The stored tree size names leaves no row stands for (at its tail): owed,
            # whatever that size says (it can be set to anything).
            report.findings.append(AuditFinding(
                ROWS_MISSING, f"mirror rows missing for leaves {self.uncovered_end}.."
                f"{self.log_size - 1}: the log's stored size is {self.log_size}",
                self.uncovered_end))
        root = self.compact.root()
        if root != checkpoint.root:
            report.findings.append(AuditFinding(
                ROOT_MISMATCH,
                f"rebuilt root {root.hex()} differs from the signed root "
                f"{checkpoint.root.hex()} at size {checkpoint.size}: a row was altered or "
                "replaced", stored=root.hex(), expected=checkpoint.root.hex()))
        return report
