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
record_unparseable, column_mismatch, node_mismatch, node_missing, root_mismatch,
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

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ledger import merkle
from ledger.audit import (
    ENVIRONMENT_MISMATCH,
    RECORD_UNPARSEABLE,
    STREAM_START_MISMATCH,
    QuickRows,
    compare_columns,
    environment_reference_problem,
    open_row,
    stream_link_problem,
)
from ledger.checkpoint import Checkpoint, NoteVerifier
from ledger.cosignature import well_formed_line
from ledger.errors import LedgerError
from ledger.leaves.batch_layouts import BatchLayouts
from ledger.leaves.envelope import Leaf
from ledger.leaves.environment import ENVIRONMENT_KIND
from ledger.leaves.stream_link import StartFacts
from ledger.store.log_api import (
    AnchoredCheckpoint,
    EvidenceLog,
    RecordRow,
    RowScanner,
    ScannedRows,
    scanned,
)

BATCH = 5000


@dataclass(frozen=True)
class Finding:
    kind: str  # one of the kinds in the module docstring
    where: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind} at {self.where}: {self.detail}"


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


def fsck(
    ledger: EvidenceLog,
    verifier: NoteVerifier,
    progress: Callable[[int, int], None] | None = None,
) -> FsckReport:
    size, stored_root = ledger.tree_head()
    report = FsckReport(tree_size=size)
    stored_checkpoints = list(ledger.iter_checkpoints())
    anchor_rows = list(ledger.anchors.iter_anchors())
    known_checkpoints = {c.size for c in stored_checkpoints}
    roots_at: dict[int, bytes] = {}
    wanted_sizes = {c.size for c in stored_checkpoints} | {a.size for a in anchor_rows}
    compact = merkle.CompactRange()
    rows = _raw_rows(ledger)
    row, chunk = next(rows, (None, None))
    environment_leaves: dict[int, Leaf] = {}  # those seen so far (rows in leaf order)
    starts: dict[str, StartFacts] = {}  # stream starts not yet completed, by record id
    layouts = BatchLayouts()  # opens most records by their batch's layout (same rules)
    # Proves most rows from their raw values; every other row takes ``_check_row``.
    quick = QuickRows(verifier.name, layouts, environment_leaves)

    for start in range(0, size, BATCH):
        end = min(start + BATCH, size)
        leaves = ledger.read_nodes([(0, i) for i in range(start, end)])
        created: list[tuple[merkle.Node, bytes]] = []
        for index in range(start, end):
            leaf = leaves.get((0, index))
            if leaf is None:
                report.findings.append(Finding("node_missing", f"leaf {index}", "no leaf hash"))
                leaf = bytes(32)
            while row is not None and row[0] < index:  # rows the log does not have
                report.findings.append(Finding("record_extra", f"leaf {row[0]}",
                                               "mirror row with no log entry"))
                row, chunk = next(rows, (None, None))
            if row is None or row[0] != index:
                report.findings.append(Finding("record_missing", f"leaf {index}",
                                               "log entry with no mirror row"))
            else:
                assert chunk is not None
                proven = quick.leaf_hash(row, chunk.typed, chunk.stored_time)
                if proven is None or proven[0] != leaf:
                    _check_row(chunk.record_row(row), leaf, report, verifier.name,
                               environment_leaves, starts, layouts)
                report.records_checked += 1
                row, chunk = next(rows, (None, None))
            created.extend(node for node in compact.append(leaf) if node[0][0] > 0)
            if compact.size in wanted_sizes:
                roots_at[compact.size] = compact.root()
        stored = ledger.read_nodes([key for key, _ in created])
        for key, expected in created:
            if stored.get(key) != expected:
                report.findings.append(Finding(
                    "node_mismatch" if key in stored else "node_missing",
                    f"node level {key[0]} index {key[1]}",
                    f"stored {stored[key].hex() if key in stored else 'nothing'}, "
                    f"recomputed {expected.hex()}",
                ))
        if progress:
            progress(end, size)
    while row is not None:
        report.findings.append(Finding("record_extra", f"leaf {row[0]}",
                                       "mirror row beyond the log's size"))
        row, chunk = next(rows, (None, None))

    if compact.root() != stored_root:
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
        elif roots_at.get(checkpoint.size, merkle.EMPTY_ROOT) != body.root:
            report.findings.append(Finding(
                "checkpoint_root_mismatch", where,
                f"signed root {body.root.hex()}, recomputed "
                f"{roots_at.get(checkpoint.size, merkle.EMPTY_ROOT).hex()}"))
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


def _raw_rows(ledger: EvidenceLog) -> Iterator[tuple[tuple[Any, ...], ScannedRows]]:
    """Every mirror row raw, in leaf order, with the chunk that converts it."""
    chunks = (ledger.scan_records(0, None, BATCH) if isinstance(ledger, RowScanner)
              else scanned(ledger.iter_records(0, None, BATCH), BATCH))
    for chunk in chunks:
        for raw in chunk.rows:
            yield raw, chunk


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
        elif roots_at.get(anchor.size, merkle.EMPTY_ROOT) != body.root:
            report.findings.append(Finding(
                "anchor_root_mismatch", where,
                f"anchored root {body.root.hex()}, recomputed "
                f"{roots_at.get(anchor.size, merkle.EMPTY_ROOT).hex()}"))


def _check_row(row: RecordRow, leaf: bytes, report: FsckReport, origin: str,
               environment_leaves: dict[int, Leaf], starts: dict[str, StartFacts],
               layouts: BatchLayouts) -> None:
    where = f"leaf {row.leaf_index} (record {row.record_id})"
    if merkle.hash_leaf(row.canonical) != leaf:
        report.findings.append(Finding("record_altered", where,
                                       "canonical bytes do not hash to the log's leaf"))
        return
    body = row.body  # inflated once: the leaf is opened once for every check below
    try:
        opened = open_row(row.canonical, body, origin, strict=True, layouts=layouts)
    except LedgerError as exc:
        report.findings.append(Finding(RECORD_UNPARSEABLE, where,
                                       f"stored bytes are not a record: {exc}"))
        return
    stored = dict(row.columns, record_id=row.record_id, tenant=row.tenant,
                  created_at=row.created_at, environment_index=row.environment_index)
    findings = compare_columns(row.leaf_index, row.record_id, opened, stored)
    for found in findings:
        report.findings.append(Finding(found.kind, where,
                                       found.message.removeprefix(f"{where}: ")))
    if findings or not isinstance(opened, Leaf):
        return  # a v1 record names no environment; a bad row is reported already
    if opened.kind == ENVIRONMENT_KIND:
        environment_leaves[row.leaf_index] = opened
        return
    problem = environment_reference_problem(opened, environment_leaves)
    if problem is not None:
        report.findings.append(Finding(ENVIRONMENT_MISMATCH, where, problem))
    problem = stream_link_problem(opened, row.leaf_index, starts)
    if problem is not None:
        report.findings.append(Finding(STREAM_START_MISMATCH, where, problem))
