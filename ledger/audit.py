"""Completeness: the mirror rows in a time range are exactly the log's entries in it.

Every mirror row's canonical bytes are rehashed in leaf order and the root is rebuilt
up to a signed checkpoint's size: only if it equals the signed root is the mirror the
log (nothing missing, extra or altered). The time range is then taken from the records'
own bytes, and compared with what the typed columns (what auditors' queries use) say.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from ledger import merkle
from ledger.checkpoint import Checkpoint


@dataclass(frozen=True)
class MirrorRow:
    leaf_index: int
    record_id: str
    created_at: datetime  # the typed column, naive UTC
    canonical: bytes


@dataclass
class AuditReport:
    checkpoint_size: int
    in_range: int = 0
    uncovered: int = 0  # rows in range the checkpoint does not cover yet
    findings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.findings


def _record_time(canonical: bytes) -> datetime | None:
    try:
        text = json.loads(canonical)["created_at"]
        moment = datetime.fromisoformat(text)
        return moment.replace(tzinfo=None) if moment.tzinfo else moment
    except (ValueError, KeyError, TypeError):
        return None


def audit_range(rows: Iterable[MirrorRow], checkpoint: Checkpoint, since: datetime,
                until: datetime, log_size: int | None = None) -> AuditReport:
    """``log_size``: how many entries the log holds (rows beyond it are not in the log)."""
    report = AuditReport(checkpoint.size)
    compact = merkle.CompactRange()
    expected = 0
    for row in rows:
        if row.leaf_index >= checkpoint.size:
            if log_size is not None and row.leaf_index >= log_size:
                report.findings.append(f"extra mirror row at leaf {row.leaf_index} (record "
                                       f"{row.record_id}): the log has {log_size} entries")
            elif since <= row.created_at < until:
                report.uncovered += 1
            continue
        if row.leaf_index != expected:
            report.findings.append(
                f"mirror rows missing for leaves {expected}..{row.leaf_index - 1}")
            return report
        compact.append(merkle.hash_leaf(row.canonical))
        expected += 1
        moment = _record_time(row.canonical)
        inside_by_bytes = moment is not None and since <= moment < until
        inside_by_column = since <= row.created_at < until
        if inside_by_bytes:
            report.in_range += 1
        if inside_by_bytes != inside_by_column:
            report.findings.append(
                f"leaf {row.leaf_index} (record {row.record_id}): created_at column "
                f"{row.created_at.isoformat()} disagrees with the record's own time")
    if expected < checkpoint.size:
        report.findings.append(f"mirror rows missing for leaves {expected}.."
                               f"{checkpoint.size - 1}")
        return report
    if compact.root() != checkpoint.root:
        report.findings.append(
            f"rebuilt root {compact.root().hex()} differs from the signed root "
            f"{checkpoint.root.hex()} at size {checkpoint.size}: a row was altered or "
            "replaced")
    return report
