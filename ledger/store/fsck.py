"""``fsck``: recompute the whole log from the stored bytes and report every divergence.

Checks, in leaf order: each mirror row's canonical bytes hash to the log's leaf and its
typed columns agree with its bytes (``ledger.audit.column_findings``); every stored tree
node equals the hash of its children; the committed root matches; every checkpoint is
signed and names the right root; every anchor's note is signed by the log key, is the
checkpoint stored at its size, and names the root the log had at that size (so all
anchors are prefixes of one log, each consistent with the next); and the latest
checkpoint an anchor says was sealed exists. Which checkpoint and anchor cover a row is
derived from their sizes, never stored on the row (decision 0029), so there is nothing
per row to police there.

Finding kinds (README "fsck" lists them): record_altered, record_missing, record_extra,
record_unparseable, row_malformed (a stored value is not of its column's type),
column_mismatch, node_mismatch, node_missing, root_mismatch,
checkpoint_signature, checkpoint_root_mismatch, checkpoint_beyond_log, checkpoint_missing,
anchor_signature, anchor_size_mismatch, anchor_checkpoint_missing,
anchor_checkpoint_mismatch, anchor_root_mismatch, anchor_beyond_log, anchor_order,
cosignature_malformed, cosignature_orphan, environment_mismatch (a v2 record names an
environment leaf that is not before it, has another hash, or is another engine's),
stream_start_mismatch (a streamed v2 record names a stream start that is not before it,
is another tenant's or commits other content: decision 0050).

Cosignature lines (the ``cosignatures`` table) must each be one well-formed signature
line naming its witness and belong to a stored checkpoint; whether a witness's signature
holds is for verifiers, who pin the witnesses' keys.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from ledger import merkle
from ledger.audit import QuickRows
from ledger.checkpoint import Checkpoint, NoteVerifier
from ledger.cosignature import well_formed_line
from ledger.errors import LedgerError
from ledger.leaves.batch_layouts import BatchLayouts
from ledger.leaves.envelope import Leaf
from ledger.leaves.stream_link import StartFacts
from ledger.store.fsck_row import Finding, link_findings, row_findings
from ledger.store.fsck_workers import Checked, Proven, RowWorkers, fsck_verdicts
from ledger.store.log_api import (
    MIN_LEAF_INDEX,
    AnchoredCheckpoint,
    EvidenceLog,
    RecordRow,
    RowScanner,
    ScannedRows,
    scanned,
)

__all__ = ["BATCH", "Finding", "FsckReport", "RowWorkers", "fsck"]

BATCH = 5000
LEAF_INDEX_END = 2**63  # one past the largest leaf index a BIGINT holds


@dataclass
class FsckReport:
    tree_size: int = 0
    records_checked: int = 0
    checkpoints_checked: int = 0
    anchors_checked: int = 0
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.findings

    @property
    def first(self) -> Finding | None:
        return self.findings[0] if self.findings else None


class WalkedLog(EvidenceLog, Protocol):
    """A log ``fsck`` walks: where the next stored leaf hash and mirror row are, so a
    stretch with nothing stored is skipped, not walked index by index (the stored tree
    size, like any stored value, can be set to anything: 2**63 - 1 must not hang it)."""

    def read_leaves(self, start: int, end: int) -> dict[int, bytes]: ...

    def next_leaf_from(self, index: int) -> int | None: ...

    def next_row_from(self, index: int) -> int | None: ...


def fsck(
    ledger: WalkedLog,
    verifier: NoteVerifier,
    progress: Callable[[int, int], None] | None = None,
    workers: RowWorkers | None = None,
) -> FsckReport:
    """``workers``: processes that check the rows by ranges (decision 0059), when the
    log has more than one range; the findings are the same either way."""
    size, stored_root = ledger.tree_head()
    report = FsckReport(tree_size=size)
    stored_checkpoints = list(ledger.iter_checkpoints())
    anchor_rows = list(ledger.anchors.iter_anchors())
    known_checkpoints = {c.size for c in stored_checkpoints}
    roots_at: dict[int, bytes] = {}
    wanted_sizes = {c.size for c in stored_checkpoints} | {a.size for a in anchor_rows}
    compact = merkle.CompactRange()
    rows = _RowChecks(ledger, verifier.name, report)
    items, judge = rows.source(workers)
    item = next(items, None)
    recomputed = True  # every leaf so far is in ``compact``: the tree can be recomputed

    walked = min(size, LEAF_INDEX_END)  # a stored size beyond any index: up to the last
    start = 0
    while start < walked:
        end = min(start + BATCH, walked)
        leaves = ledger.read_leaves(start, end)
        if not leaves and not _row_before(item, end):
            # Nothing stored in the whole batch: the stretch up to the next leaf hash or
            # row stored is one finding of each kind, and the tree beyond it is not
            # recomputed (its leaves are not there to recompute it from).
            resume = _next_stored(ledger, end, item, walked)
            _stretch_missing(report, start, resume)
            recomputed = False
            start = resume
            if progress:
                progress(start, size)
            continue
        if len(leaves) < end - start:
            # The batch ends early where nothing more is stored in it: what follows is
            # a stretch for the next batch to report as one.
            after = max(leaves) + 1
            if after < end and _stored_from(ledger, after) >= end:
                end = after
        created: list[tuple[merkle.Node, bytes]] = []
        present = iter(sorted(leaves))
        next_leaf = next(present, end)
        index = start
        while index < end:
            while item is not None and _row_before(item, index):  # rows the log lacks
                report.findings.append(Finding("record_extra", f"leaf {item[0]}",
                                               "mirror row with no log entry"))
                item = next(items, None)
            following = min(next_leaf, _row_at(item, end))
            if following > index + 1:
                # Indexes with neither a leaf hash nor a row: walked as one stretch, so
                # the work follows what is stored, never the indexes' values.
                _stretch_missing(report, index, following)
                recomputed = False
                index = following
                continue
            leaf = leaves.get(index)
            if leaf is None:
                report.findings.append(Finding("node_missing", f"leaf {index}", "no leaf hash"))
                leaf = bytes(32)
            else:
                next_leaf = next(present, end)
            if item is None or item[0] != index:
                report.findings.append(Finding("record_missing", f"leaf {index}",
                                               "log entry with no mirror row"))
            else:
                judge(item, leaf)
                report.records_checked += 1
                item = next(items, None)
            if recomputed:
                created.extend(node for node in compact.append(leaf) if node[0][0] > 0)
                if compact.size in wanted_sizes:
                    roots_at[compact.size] = compact.root()
            index += 1
        stored = ledger.read_nodes([key for key, _ in created])
        for key, expected in created:
            if stored.get(key) != expected:
                report.findings.append(Finding(
                    "node_mismatch" if key in stored else "node_missing",
                    f"node level {key[0]} index {key[1]}",
                    f"stored {stored[key].hex() if key in stored else 'nothing'}, "
                    f"recomputed {expected.hex()}",
                ))
        start = end
        if progress:
            progress(end, size)
    while item is not None:
        report.findings.append(Finding("record_extra", f"leaf {item[0]}",
                                       "mirror row beyond the log's size"))
        item = next(items, None)

    if recomputed and compact.root() != stored_root:
        report.findings.append(Finding("root_mismatch", f"tree size {size}",
                                       f"stored {stored_root.hex()}, "
                                       f"recomputed {compact.root().hex()}"))
    signed: dict[int, Checkpoint] = {}
    for checkpoint in stored_checkpoints:
        report.checkpoints_checked += 1
        where = f"checkpoint {checkpoint.size}"
        try:
            body = verifier.open_checkpoint(checkpoint.note)
        except LedgerError as exc:
            report.findings.append(Finding("checkpoint_signature", where, str(exc)))
            continue
        if body.size != checkpoint.size or body.root != checkpoint.root:
            report.findings.append(Finding("checkpoint_root_mismatch", where,
                                           "signed note disagrees with its stored row"))
        elif checkpoint.size > size:
            report.findings.append(Finding("checkpoint_beyond_log", where,
                                           f"log has only {size} entries"))
        elif _recomputed(roots_at, checkpoint.size) != body.root:
            report.findings.append(Finding(
                "checkpoint_root_mismatch", where,
                f"signed root {body.root.hex()}, "
                f"{_recomputed_text(roots_at, checkpoint.size)}"))
        signed[checkpoint.size] = body
    _check_anchors(anchor_rows, verifier, signed, known_checkpoints, roots_at, size, report)
    _check_cosignatures(ledger, known_checkpoints, report)

    # The newest checkpoint an anchor says was sealed must still be there (deleting it
    # would silently roll the log back; a deletion no anchor reveals is caught by an
    # audit that remembers the last checkpoint it saw).
    latest_named = max((a.size for a in anchor_rows), default=0)
    if latest_named and latest_named not in known_checkpoints:
        report.findings.append(Finding(
            "checkpoint_missing", f"checkpoint {latest_named}",
            "the latest checkpoint the anchors say was sealed is not in the "
            "checkpoints table"))
    return report


def _position(value: Any) -> float | None:
    """Where a stored leaf index places its row: an integer, or a real as SQLite keeps a
    tampered one (7.5, -inf: compared as numbers); None for text (reported as extra
    after the walk)."""
    if type(value) is int or (type(value) is float and not math.isnan(value)):
        return float(value) if type(value) is float else value
    return None


def _row_before(item: Any, end: int) -> bool:
    """Whether the next row (``item``) is one before leaf ``end``."""
    at = None if item is None else _position(item[0])
    return at is not None and at < end


def _row_at(item: Any, end: int) -> int:
    """The first leaf index at or after the next row's (``end`` if none before it); the
    rows before the walk's index are taken already, so this one is finite."""
    at = None if item is None else _position(item[0])
    if at is None or at >= end:
        return end
    first: int = math.ceil(at)
    return first


def _next_stored(ledger: WalkedLog, index: int, item: Any, size: int) -> int:
    """Where something is stored again from ``index`` on: the next leaf hash or the next
    row (``item``), at most ``size``."""
    return max(index, min(size, _row_at(item, size),
                          ledger.next_leaf_from(index) or size))


def _stored_from(ledger: WalkedLog, index: int) -> int | float:
    """The lowest index at or after ``index`` with a leaf hash or a row stored (inf:
    none)."""
    found = [at for at in (ledger.next_leaf_from(index), ledger.next_row_from(index))
             if at is not None]
    return min(found, default=float("inf"))


def _stretch_missing(report: FsckReport, start: int, end: int) -> None:
    """Leaves [start, end) with neither a leaf hash nor a row: one finding of each kind."""
    if end - start == 1:
        report.findings.append(Finding("node_missing", f"leaf {start}", "no leaf hash"))
        report.findings.append(Finding("record_missing", f"leaf {start}",
                                       "log entry with no mirror row"))
        return
    span = f"leaves {start}..{end - 1}"
    report.findings.append(Finding("node_missing", span, "no leaf hash for any of them"))
    report.findings.append(Finding("record_missing", span, "log entries with no mirror row"))


def _raw_rows(ledger: EvidenceLog, start: int = 0, end: int | None = None
              ) -> Iterator[tuple[int, tuple[Any, ...], ScannedRows]]:
    """Every mirror row raw, in leaf order, with the chunk that converts it."""
    chunks = (ledger.scan_records(start, end, BATCH) if isinstance(ledger, RowScanner)
              else scanned(ledger.iter_records(start, end, BATCH), BATCH))
    for chunk in chunks:
        for raw in chunk.rows:
            yield raw[0], raw, chunk


class _RowChecks:
    """The rows' checks in leaf order, and what they keep for the rows after them."""

    def __init__(self, ledger: WalkedLog, origin: str, report: FsckReport) -> None:
        self.ledger, self.origin, self.report = ledger, origin, report
        self.environment_leaves: dict[int, Leaf] = {}  # those seen so far
        self.starts: dict[str, StartFacts] = {}  # stream starts not yet completed
        self.layouts = BatchLayouts()  # opens most records by their batch's layout
        # Proves most rows from their raw values; every other row takes ``check``.
        self.quick = QuickRows(origin, self.layouts, self.environment_leaves)

    def source(self, workers: RowWorkers | None
               ) -> tuple[Iterator[Any], Callable[[Any, bytes], None]]:
        """The rows in leaf order (each item's first value its leaf index), and how one
        is judged against its stored leaf: read here, or the workers' verdicts."""
        if workers is not None:
            ranges = workers.ranges(self.ledger.next_row_from)
            if workers.used(ranges):
                return fsck_verdicts(workers, self.origin, ranges), self.judge_verdict
        return _raw_rows(self.ledger, MIN_LEAF_INDEX), self.judge_raw

    def judge_raw(self, item: tuple[int, tuple[Any, ...], ScannedRows], leaf: bytes) -> None:
        """A row read here (``_raw_rows``)."""
        _, raw, chunk = item
        try:
            proven = self.quick.leaf_hash(raw, chunk.typed, chunk.stored_time)
        except Exception:  # noqa: BLE001 - a malformed row: the full path names it
            proven = None
        if proven is None or proven[0] != leaf:
            self.check_raw(raw, chunk, leaf)

    def judge_verdict(self, item: Proven | Checked, leaf: bytes) -> None:
        """A worker's verdict on a row (``RowWorkers``): what ``judge_raw`` would find."""
        if isinstance(item, Proven):
            if item.leaf_hash != leaf or not self.quick.environment_passes(item.environment):
                self.repeat(item.leaf_index, leaf)
        elif item.findings is None:
            self.repeat(item.leaf_index, leaf)
        elif item.leaf_hash != leaf:
            self.report.findings.append(_altered(item.leaf_index, item.record_id))
        else:
            self.report.findings.extend(item.findings)
            if item.leaf is not None:
                where = f"leaf {item.leaf_index} (record {item.record_id})"
                self.report.findings.extend(link_findings(
                    item.leaf, item.leaf_index, where, self.environment_leaves, self.starts))

    def repeat(self, index: int, leaf: bytes) -> None:
        """The full path for a row a worker left to this process, read as a scan reads
        it (``record_at`` joins other tables)."""
        for _, raw, chunk in _raw_rows(self.ledger, index, index + 1):
            self.check_raw(raw, chunk, leaf)
            return
        self.report.findings.append(Finding("record_missing", f"leaf {index}",
                                            "log entry with no mirror row"))  # deleted since

    def check_raw(self, raw: tuple[Any, ...], chunk: ScannedRows, leaf: bytes) -> None:
        """``check`` of a raw row, which may hold a value of another type than its
        column's (SQLite keeps whatever a tampering UPDATE gives it: a text body, a
        created_at that is no time): that is a ``row_malformed`` finding, never a crash."""
        try:
            self.check(chunk.record_row(raw), leaf)
        except Exception as exc:  # noqa: BLE001 - named by its type: its text may quote values
            self.report.findings.append(Finding(
                "row_malformed", f"leaf {raw[0]} (record {raw[1]})",
                f"a stored value is not of its column's type ({type(exc).__name__})"))

    def check(self, row: RecordRow, leaf: bytes) -> None:
        """The full path: every check of the row, worded."""
        if merkle.hash_leaf(row.canonical) != leaf:
            self.report.findings.append(_altered(row.leaf_index, row.record_id))
            return
        where = f"leaf {row.leaf_index} (record {row.record_id})"
        findings, opened = row_findings(row, where, self.origin, self.layouts)
        self.report.findings.extend(findings)
        if opened is not None:
            self.report.findings.extend(link_findings(
                opened, row.leaf_index, where, self.environment_leaves, self.starts))


def _recomputed(roots_at: dict[int, bytes], size: int) -> bytes | None:
    """The root recomputed at ``size``; None: leaves before it are missing, so it was
    not recomputed (``fsck`` stops the tree at a stretch with nothing stored)."""
    return roots_at.get(size, merkle.EMPTY_ROOT if size == 0 else None)


def _recomputed_text(roots_at: dict[int, bytes], size: int) -> str:
    root = _recomputed(roots_at, size)
    if root is None:
        return "not recomputed: leaves before it are missing"
    return f"recomputed {root.hex()}"


def _altered(index: int, record_id: str) -> Finding:
    return Finding("record_altered", f"leaf {index} (record {record_id})",
                   "canonical bytes do not hash to the log's leaf")


def _check_cosignatures(ledger: EvidenceLog, known_checkpoints: set[int],
                        report: FsckReport) -> None:
    for stored in ledger.cosignatures.iter_cosignatures():
        where = f"cosignature of checkpoint {stored.checkpoint_size} by {stored.witness}"
        text = stored.line
        if not well_formed_line(text) or text.split(" ")[1:2] != [stored.witness]:
            report.findings.append(Finding(
                "cosignature_malformed", where,
                f"not one signature line in the witness's name: {text[:60]!r} (left "
                "out of served notes)"))
        elif stored.checkpoint_size not in known_checkpoints:
            report.findings.append(Finding("cosignature_orphan", where,
                                           "no checkpoint of that size is stored"))


def _check_anchors(anchor_rows: list[AnchoredCheckpoint], verifier: NoteVerifier,
                   signed: dict[int, Checkpoint], known_checkpoints: set[int],
                   roots_at: dict[int, bytes], size: int, report: FsckReport) -> None:
    previous: AnchoredCheckpoint | None = None
    for anchor in anchor_rows:
        report.anchors_checked += 1
        where = f"anchor {anchor.size} ({anchor.ref})"
        if previous is not None and anchor.anchored_at < previous.anchored_at:
            report.findings.append(Finding(
                "anchor_order", where, f"anchored at {anchor.anchored_at.isoformat()}, before "
                f"the smaller anchor {previous.size} ({previous.anchored_at.isoformat()})"))
        previous = anchor
        try:
            body = verifier.open_checkpoint(anchor.note)
        except LedgerError as exc:
            report.findings.append(Finding("anchor_signature", where, str(exc)))
            continue
        if body.size != anchor.size:
            report.findings.append(Finding("anchor_size_mismatch", where,
                                           f"the anchored note is for size {body.size}"))
            continue
        if anchor.size not in known_checkpoints:
            report.findings.append(Finding("anchor_checkpoint_missing", where,
                                           f"no checkpoint of size {anchor.size} is stored"))
        elif anchor.size in signed and signed[anchor.size] != body:
            report.findings.append(Finding(
                "anchor_checkpoint_mismatch", where,
                f"anchored root {body.root.hex()} (origin {body.origin!r}), stored checkpoint "
                f"root {signed[anchor.size].root.hex()} (origin {signed[anchor.size].origin!r})"))
        if anchor.size > size:
            report.findings.append(Finding("anchor_beyond_log", where,
                                           f"log has only {size} entries"))
        elif _recomputed(roots_at, anchor.size) != body.root:
            report.findings.append(Finding(
                "anchor_root_mismatch", where,
                f"anchored root {body.root.hex()}, "
                f"{_recomputed_text(roots_at, anchor.size)}"))
