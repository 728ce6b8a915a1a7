"""``fsck``: recompute the whole log from the stored bytes and report every divergence.

Checks, in leaf order: each mirror row's canonical bytes hash to the log's leaf, its typed
columns agree with its bytes (``ledger.audit.column_findings``), its ``checkpoint_size``
names the first checkpoint that covers it and its ``anchor_ref`` the first anchor that
covers it; every stored tree node equals the hash of its children; the committed root
matches; every checkpoint is signed and names the right root; every anchor's note is
signed by the log key, is the checkpoint stored at its size, and names the root the log
had at that size (so all anchors are prefixes of one log, each consistent with the
next); and the latest checkpoint that rows or anchors say was sealed exists.

Finding kinds (README "fsck" lists them): record_altered, record_missing, record_extra,
record_unparseable, column_mismatch, node_mismatch, node_missing, root_mismatch,
checkpoint_signature, checkpoint_root_mismatch, checkpoint_beyond_log, checkpoint_missing,
checkpoint_size_mismatch, anchor_signature, anchor_size_mismatch, anchor_checkpoint_missing,
anchor_checkpoint_mismatch, anchor_root_mismatch, anchor_beyond_log, anchor_order,
anchor_ref_missing, anchor_ref_mismatch, cosignature_malformed, cosignature_orphan.

Cosignature lines (the ``cosignatures`` table) must each be one well-formed signature
line naming its witness and belong to a stored checkpoint; whether a witness's signature
holds is for verifiers, who pin the witnesses' keys.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import select

from ledger import merkle
from ledger.audit import column_findings
from ledger.checkpoint import Checkpoint, NoteVerifier
from ledger.cosignature import well_formed_line
from ledger.errors import LedgerError
from ledger.store.schema import anchors, cosignatures
from ledger.store.sql import RecordRow, SqlLedger

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


@dataclass(frozen=True)
class _Anchor:
    size: int
    note: bytes
    kind: str
    ref: str
    anchored_at: datetime


class _Coverage:
    """What a row's ``checkpoint_size`` and ``anchor_ref`` must say: the first checkpoint
    and the first anchor whose size exceeds its leaf index (NULL when none does yet)."""

    def __init__(self, checkpoint_sizes: list[int], anchor_rows: list[_Anchor]) -> None:
        self.checkpoint_sizes = sorted(checkpoint_sizes)
        self.known_checkpoints = set(checkpoint_sizes)
        self.anchor_sizes = [a.size for a in anchor_rows]
        self.anchor_refs = [a.ref for a in anchor_rows]
        self.known_refs = {a.ref: a for a in anchor_rows}

    def checkpoint_for(self, leaf: int) -> int | None:
        at = bisect.bisect_right(self.checkpoint_sizes, leaf)
        return self.checkpoint_sizes[at] if at < len(self.checkpoint_sizes) else None

    def anchor_for(self, leaf: int) -> str | None:
        at = bisect.bisect_right(self.anchor_sizes, leaf)
        return self.anchor_refs[at] if at < len(self.anchor_refs) else None


class _Runs:
    """Consecutive rows with the same finding become one finding ("leaves 10..24"): a
    deleted anchor or checkpoint would otherwise yield one line per row it covered."""

    def __init__(self, report: FsckReport) -> None:
        self.report = report
        self.open: dict[str, tuple[int, int, str, str]] = {}  # kind -> first, last, id, detail

    def add(self, kind: str, leaf: int, record_id: str, detail: str) -> None:
        run = self.open.get(kind)
        if run is not None and run[1] == leaf - 1 and run[3] == detail:
            self.open[kind] = (run[0], leaf, run[2], detail)
            return
        self._flush(kind)
        self.open[kind] = (leaf, leaf, record_id, detail)

    def _flush(self, kind: str) -> None:
        run = self.open.pop(kind, None)
        if run is None:
            return
        first, last, record_id, detail = run
        where = (f"leaf {first} (record {record_id})" if first == last
                 else f"leaves {first}..{last}")
        self.report.findings.append(Finding(kind, where, detail))

    def close(self) -> None:
        for kind in list(self.open):
            self._flush(kind)


def read_anchors(ledger: SqlLedger) -> list[_Anchor]:
    with ledger.engine.connect() as conn:
        return [_Anchor(int(r.size), bytes(r.note), str(r.kind), str(r.ref), r.anchored_at)
                for r in conn.execute(select(anchors).order_by(anchors.c.size))]


def fsck(
    ledger: SqlLedger,
    verifier: NoteVerifier,
    progress: Callable[[int, int], None] | None = None,
) -> FsckReport:
    size, stored_root = ledger.tree_head()
    report = FsckReport(tree_size=size)
    stored_checkpoints = list(ledger.iter_checkpoints())
    anchor_rows = read_anchors(ledger)
    coverage = _Coverage([c.size for c in stored_checkpoints], anchor_rows)
    runs = _Runs(report)
    named_sealed = 0  # the largest checkpoint size a row names
    roots_at: dict[int, bytes] = {}
    wanted_sizes = {c.size for c in stored_checkpoints} | {a.size for a in anchor_rows}
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
                _check_row(row, leaf, report, verifier.name)
                _check_coverage(row, coverage, runs)
                if row.checkpoint_size is not None:
                    named_sealed = max(named_sealed, int(row.checkpoint_size))
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
    runs.close()
    while row is not None:
        report.findings.append(Finding("record_extra", f"leaf {row.leaf_index}",
                                       "mirror row beyond the log's size"))
        row = next(rows, None)

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
    _check_anchors(anchor_rows, verifier, signed, coverage, roots_at, size, report)
    _check_cosignatures(ledger, coverage, report)

    # The newest checkpoint the log claims to have sealed must still be there (deleting
    # it would silently roll the log back). A log that never sealed (a writer killed
    # before its first seal) names none, and is not a finding.
    latest_named = max([named_sealed, *(a.size for a in anchor_rows)])
    if latest_named and latest_named not in coverage.known_checkpoints:
        report.findings.append(Finding(
            "checkpoint_missing", f"checkpoint {latest_named}",
            "the latest checkpoint the rows or anchors say was sealed is not in the "
            "checkpoints table"))
    return report


def _check_cosignatures(ledger: SqlLedger, coverage: _Coverage, report: FsckReport) -> None:
    with ledger.engine.connect() as conn:
        rows = conn.execute(select(cosignatures.c.checkpoint_size, cosignatures.c.witness,
                                   cosignatures.c.line)
                            .order_by(cosignatures.c.checkpoint_size, cosignatures.c.witness))
        for size, witness, line in rows:
            where = f"cosignature of checkpoint {size} by {witness}"
            text = str(line)
            if not well_formed_line(text) or text.split(" ")[1:2] != [str(witness)]:
                report.findings.append(Finding(
                    "cosignature_malformed", where,
                    f"not one signature line in the witness's name: {text[:60]!r} (left "
                    "out of served notes)"))
            elif int(size) not in coverage.known_checkpoints:
                report.findings.append(Finding("cosignature_orphan", where,
                                               "no checkpoint of that size is stored"))


def _check_anchors(anchor_rows: list[_Anchor], verifier: NoteVerifier,
                   signed: dict[int, Checkpoint], coverage: _Coverage,
                   roots_at: dict[int, bytes], size: int, report: FsckReport) -> None:
    previous: _Anchor | None = None
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
        if anchor.size not in coverage.known_checkpoints:
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


def _check_coverage(row: RecordRow, coverage: _Coverage, runs: _Runs) -> None:
    leaf, record_id = row.leaf_index, row.record_id
    want_size = coverage.checkpoint_for(leaf)
    got_size = None if row.checkpoint_size is None else int(row.checkpoint_size)
    if got_size != want_size:
        first = (f"the first checkpoint covering it is {want_size}" if want_size is not None
                 else "no checkpoint covers it yet")
        if got_size is None:
            said = "checkpoint_size is NULL"
        elif got_size not in coverage.known_checkpoints:
            said = f"checkpoint_size names checkpoint {got_size}, which is not stored"
        else:
            said = f"checkpoint_size is {got_size}"
        runs.add("checkpoint_size_mismatch", leaf, record_id, f"{said}; {first}")
    want_ref = coverage.anchor_for(leaf)
    got_ref = row.anchor_ref
    if got_ref == want_ref:
        return
    named = coverage.known_refs.get(got_ref) if got_ref is not None else None
    if named is not None and named.kind == "fabric" and named.size > leaf:
        # Anchoring moved onto a channel: the first Fabric anchor stamps every row it
        # covers (it cannot know the local anchors), and that is a true statement.
        return
    if got_ref is None:
        runs.add("anchor_ref_missing", leaf, record_id,
                 f"anchor_ref is NULL although anchor {want_ref} covers it")
        return
    first = (f"the first anchor covering it is {want_ref}" if want_ref is not None
             else "no anchor covers it")
    if got_ref not in coverage.known_refs:
        said = f"anchor_ref {got_ref!r} names no anchor in the anchors table"
    else:
        said = f"anchor_ref is {got_ref!r}"
    runs.add("anchor_ref_mismatch", leaf, record_id, f"{said}; {first}")


def _check_row(row: RecordRow, leaf: bytes, report: FsckReport, origin: str) -> None:
    where = f"leaf {row.leaf_index} (record {row.record_id})"
    if merkle.hash_leaf(row.canonical) != leaf:
        report.findings.append(Finding("record_altered", where,
                                       "canonical bytes do not hash to the log's leaf"))
        return
    stored = dict(row.columns, record_id=row.record_id, tenant=row.tenant,
                  created_at=row.created_at, environment_index=row.environment_index)
    for found in column_findings(row.leaf_index, row.record_id, row.canonical, stored,
                                 strict=True, body=row.body, origin=origin):
        report.findings.append(Finding(found.kind, where,
                                       found.message.removeprefix(f"{where}: ")))
