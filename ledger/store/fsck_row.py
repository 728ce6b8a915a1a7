"""``log fsck``'s checks of one mirror row: what its bytes and columns alone say
(``row_findings``, which a worker over a range of rows can run), and what the leaf names,
judged by the leaves before it (``link_findings``, row after row in one process)."""

from __future__ import annotations

from dataclasses import dataclass

from ledger.audit import (
    ENVIRONMENT_MISMATCH,
    RECORD_UNPARSEABLE,
    STREAM_START_MISMATCH,
    compare_columns,
    environment_reference_problem,
    open_row,
    stream_link_problem,
)
from ledger.errors import LedgerError
from ledger.leaves.batch_layouts import BatchLayouts
from ledger.leaves.envelope import Leaf
from ledger.leaves.environment import ENVIRONMENT_KIND
from ledger.leaves.stream_link import StartFacts
from ledger.store.log_api import RecordRow


@dataclass(frozen=True)
class Finding:
    kind: str  # one of the kinds in the module docstring
    where: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind} at {self.where}: {self.detail}"



def row_findings(row: RecordRow, where: str, origin: str, layouts: BatchLayouts
                 ) -> tuple[list[Finding], Leaf | None]:
    """What the row's bytes and columns alone say is wrong with a row whose bytes hash
    to its leaf, and its leaf when nothing is and it is a v2 leaf (``link_findings``
    then judges what it names). Needs no other row: a worker over a range runs it."""
    body = row.body  # inflated once: the leaf is opened once for every check below
    try:
        opened = open_row(row.canonical, body, origin, strict=True, layouts=layouts)
    except LedgerError as exc:
        return [Finding(RECORD_UNPARSEABLE, where,
                        f"stored bytes are not a record: {exc}")], None
    stored = dict(row.columns, record_id=row.record_id, tenant=row.tenant,
                  created_at=row.created_at, environment_index=row.environment_index)
    found = compare_columns(row.leaf_index, row.record_id, opened, stored)
    if found or not isinstance(opened, Leaf):
        # a v1 record names no environment; a bad row is reported already
        return [Finding(f.kind, where, f.message.removeprefix(f"{where}: "))
                for f in found], None
    return [], opened


def link_findings(opened: Leaf, leaf_index: int, where: str,
                  environment_leaves: dict[int, Leaf], starts: dict[str, StartFacts]
                  ) -> list[Finding]:
    """What a leaf names (its environment, its stream start), judged by the leaves
    before it in leaf order; keeps an environment leaf or a stream start for the rows
    after it. Runs in one process, row after row."""
    if opened.kind == ENVIRONMENT_KIND:
        environment_leaves[leaf_index] = opened
        return []
    findings = []
    problem = environment_reference_problem(opened, environment_leaves)
    if problem is not None:
        findings.append(Finding(ENVIRONMENT_MISMATCH, where, problem))
    problem = stream_link_problem(opened, leaf_index, starts)
    if problem is not None:
        findings.append(Finding(STREAM_START_MISMATCH, where, problem))
    return findings
