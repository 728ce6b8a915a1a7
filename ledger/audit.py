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
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from ledger import merkle
from ledger.canonical import parse_strict
from ledger.checkpoint import Checkpoint
from ledger.errors import LedgerError
from ledger.leaves.batch_layouts import BatchLayouts
from ledger.leaves.envelope import Leaf, is_envelope
from ledger.leaves.environment import ENVIRONMENT_KIND, environment_columns
from ledger.leaves.kinds import open_leaf
from ledger.leaves.mirror import leaf_columns
from ledger.leaves.stream_link import StartFacts, named_start, stream_start_problem
from ledger.leaves.stream_start import STREAM_START_KIND
from ledger.record import AuditRecord, mirror_columns, validate_body

# Finding kinds (stable names, listed in the README):
COLUMN_MISMATCH = "column_mismatch"  # a typed column disagrees with the record's bytes
RECORD_UNPARSEABLE = "record_unparseable"  # stored bytes are not a canonical v1 record
ROWS_MISSING = "rows_missing"  # leaves the checkpoint covers have no mirror row
ROW_EXTRA = "row_extra"  # a mirror row beyond the log's size
ROOT_MISMATCH = "root_mismatch"  # the rebuilt root is not the signed one
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
    environment = environment_leaves.get(named["leaf_index"])
    if environment is None:
        problem = "which is no environment leaf before it"
    elif environment.leaf_hash.hex() != named["leaf_hash"]:
        problem = (f"but that leaf hashes to {environment.leaf_hash.hex()}, not the "
                   f"{named['leaf_hash']} the record names")
    elif environment.content["engine"] != leaf.content["engine"]:
        problem = (f"which is {environment.content['engine']}'s, not "
                   f"{leaf.content['engine']}'s")
    else:
        return None
    return f"the record names leaf {named['leaf_index']} as its environment, {problem}"


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


def audit_range(rows: Iterable[MirrorRow], checkpoint: Checkpoint, since: datetime,
                until: datetime, log_size: int | None = None,
                environments: Mapping[int, Mapping[str, Any]] | None = None) -> AuditReport:
    """``rows`` in leaf order; ``log_size``: how many entries the log holds (rows beyond
    it are not in the log). ``checkpoint`` must already be signature-checked (its origin
    is the log's, which v2 tenant tags depend on). ``environments``: the stored
    ``environments`` rows by leaf index, each recomputed from its leaf's bytes (None:
    not checked)."""
    report = AuditReport(checkpoint.size)
    environment_leaves: dict[int, Leaf] = {}
    starts: dict[str, StartFacts] = {}  # stream starts not yet completed, by record id
    layouts = BatchLayouts()  # opens most records by their batch's layout (same rules)
    compact = merkle.CompactRange()
    expected = 0
    for row in rows:
        if log_size is not None and row.leaf_index >= max(log_size, checkpoint.size):
            report.findings.append(AuditFinding(
                ROW_EXTRA, f"extra mirror row at leaf {row.leaf_index} (record "
                f"{row.record_id}): the log has {log_size} entries",
                row.leaf_index, row.record_id))
            continue
        report.rows_checked += 1
        # Columns are checked on every row, covered or not: they must say what the
        # bytes say whether or not a checkpoint vouches for the bytes yet.
        moment = _check_row(row, report, checkpoint.origin, environments, environment_leaves,
                            starts, layouts)
        if row.leaf_index >= checkpoint.size:
            if since <= row.created_at < until:
                report.uncovered += 1
            continue
        if row.leaf_index != expected:
            report.findings.append(AuditFinding(
                ROWS_MISSING, f"mirror rows missing for leaves {expected}..{row.leaf_index - 1}",
                expected))
            return report
        compact.append(merkle.hash_leaf(row.canonical))
        expected += 1
        if moment is not None and since <= moment < until:
            report.in_range += 1
    for index in sorted(set(environments or {}) - set(environment_leaves)):
        report.findings.append(AuditFinding(
            ENVIRONMENT_MISMATCH, f"environments row {index} names no environment leaf",
            index))
    if expected < checkpoint.size:
        report.findings.append(AuditFinding(
            ROWS_MISSING, f"mirror rows missing for leaves {expected}..{checkpoint.size - 1}",
            expected))
        return report
    if compact.root() != checkpoint.root:
        report.findings.append(AuditFinding(
            ROOT_MISMATCH,
            f"rebuilt root {compact.root().hex()} differs from the signed root "
            f"{checkpoint.root.hex()} at size {checkpoint.size}: a row was altered or "
            "replaced", stored=compact.root().hex(), expected=checkpoint.root.hex()))
    return report
