"""``fsck``: recompute the whole log from the stored bytes and report every divergence.

Checks, in leaf order: each mirror row's canonical bytes hash to the log's leaf, its typed
columns agree with its bytes, every stored tree node equals the hash of its children,
the committed root matches, and every checkpoint is signed and names the right root.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ledger import merkle
from ledger.checkpoint import NoteVerifier
from ledger.errors import LedgerError
from ledger.record import AuditRecord, mirror_columns
from ledger.store.sql import RecordRow, SqlLedger, parse_timestamp

BATCH = 5000


@dataclass(frozen=True)
class Finding:
    kind: str  # record_altered, record_missing, record_extra, column_mismatch,
    # record_unparseable, node_mismatch, node_missing, root_mismatch,
    # checkpoint_signature, checkpoint_root_mismatch, checkpoint_beyond_log
    where: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind} at {self.where}: {self.detail}"


@dataclass
class FsckReport:
    tree_size: int = 0
    records_checked: int = 0
    checkpoints_checked: int = 0
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.findings

    @property
    def first(self) -> Finding | None:
        return self.findings[0] if self.findings else None


def fsck(
    ledger: SqlLedger,
    verifier: NoteVerifier,
    progress: Callable[[int, int], None] | None = None,
) -> FsckReport:
    size, stored_root = ledger.tree_head()
    report = FsckReport(tree_size=size)
    stored_checkpoints = list(ledger.iter_checkpoints())
    roots_at: dict[int, bytes] = {}
    wanted_sizes = {c.size for c in stored_checkpoints}
    compact = merkle.CompactRange()
    rows = ledger.iter_records(0, None, BATCH)
    row = next(rows, None)

    for start in range(0, size, BATCH):
        end = min(start + BATCH, size)
        leaves = ledger.read_nodes([(0, i) for i in range(start, end)])
        created: list[tuple[merkle.Node, bytes]] = []
        for index in range(start, end):
            leaf = leaves.get((0, index))
            if leaf is None:
                report.findings.append(Finding("node_missing", f"leaf {index}", "no leaf hash"))
                leaf = bytes(32)
            while row is not None and row.leaf_index < index:  # rows the log does not have
                report.findings.append(Finding("record_extra", f"leaf {row.leaf_index}",
                                               "mirror row with no log entry"))
                row = next(rows, None)
            if row is None or row.leaf_index != index:
                report.findings.append(Finding("record_missing", f"leaf {index}",
                                               "log entry with no mirror row"))
            else:
                _check_row(row, leaf, report)
                report.records_checked += 1
                row = next(rows, None)
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
        report.findings.append(Finding("record_extra", f"leaf {row.leaf_index}",
                                       "mirror row beyond the log's size"))
        row = next(rows, None)

    if compact.root() != stored_root:
        report.findings.append(Finding("root_mismatch", f"tree size {size}",
                                       f"stored {stored_root.hex()}, "
                                       f"recomputed {compact.root().hex()}"))
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
    return report


def _check_row(row: RecordRow, leaf: bytes, report: FsckReport) -> None:
    where = f"leaf {row.leaf_index} (record {row.record_id})"
    if merkle.hash_leaf(row.canonical) != leaf:
        report.findings.append(Finding("record_altered", where,
                                       "canonical bytes do not hash to the log's leaf"))
        return
    try:
        record = AuditRecord.from_canonical(row.canonical)
    except LedgerError as exc:
        report.findings.append(Finding("record_unparseable", where, str(exc)))
        return
    expected = mirror_columns(record)
    expected["created_at"] = parse_timestamp(expected["created_at"])
    actual = dict(row.columns, record_id=row.record_id, tenant=row.tenant,
                  created_at=row.created_at)
    for name, value in expected.items():
        if actual.get(name) != value:
            report.findings.append(Finding(
                "column_mismatch", where,
                f"column {name} is {actual.get(name)!r}, the record says {value!r}"))
