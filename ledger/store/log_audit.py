"""``audit`` of a stored log: its mirror rows read in leaf order here, or proved by
worker processes over ranges first (decision 0065), with the same findings."""

from __future__ import annotations

from contextlib import closing
from datetime import datetime
from typing import Any

from ledger.audit import ROW_EXTRA, AuditReport, MirrorRow, audit_answers, audit_scan
from ledger.checkpoint import Checkpoint
from ledger.store.audit_workers import audit_answers_of
from ledger.store.log_api import MIN_LEAF_INDEX, ScannedRows
from ledger.store.range_workers import RowWorkers
from ledger.store.sql import SqlLedger


def audit_log(ledger: SqlLedger, checkpoint: Checkpoint, since: datetime, until: datetime,
              workers: RowWorkers | None = None) -> AuditReport:
    """Every mirror row of ``ledger`` against ``checkpoint`` (signature-checked), the
    records of [since, until) counted; ``workers``: processes proving the rows by ranges
    when the log is large enough for them to pay (``RowWorkers.used``)."""
    log_size, _ = ledger.tree_head()
    environments = ledger.mirror.environments()
    # The workers' ranges follow the rows stored (``RowWorkers.ranges``), never the
    # stored tree size: that can be set to anything.
    ranges = workers.ranges(ledger.mirror.next_row_from) if workers is not None else []
    if workers is None or not workers.used(ranges):
        report = audit_scan(ledger.scan_records(MIN_LEAF_INDEX), _row_of, checkpoint,
                            since, until, log_size=log_size, environments=environments)
        return _appended_meanwhile(ledger, report)

    def reread(index: int) -> MirrorRow | None:
        for chunk in ledger.scan_records(index, index + 1):
            return _row_of(chunk, chunk.rows[0])
        return None

    reading = ledger.mirror.scanned(())  # how a worker's raw row is read, made once
    # Closed however the scan ends, so no worker outlives it.
    with closing(audit_answers_of(workers, ranges, checkpoint.origin, checkpoint.size,
                                  since, until)) as answers:
        report = audit_answers(answers, lambda raw: _row_of(reading, raw), reread,
                               checkpoint, since, until, log_size=log_size,
                               environments=environments)
    return _appended_meanwhile(ledger, report)


def _appended_meanwhile(ledger: SqlLedger, report: AuditReport) -> AuditReport:
    """``report`` without the extra rows the log has after all: the tree size was read
    before the rows, so a live log's appends since are no finding. Rows still beyond
    the size read now (or at a negative index) stay extra."""
    if not any(f.kind == ROW_EXTRA for f in report.findings):
        return report
    size, _ = ledger.tree_head()
    report.findings = [f for f in report.findings if not (
        f.kind == ROW_EXTRA and f.leaf_index is not None and 0 <= f.leaf_index < size)]
    return report


def _row_of(chunk: ScannedRows, raw: tuple[Any, ...]) -> MirrorRow:
    """A raw row with every typed column: the audit recomputes each one."""
    row = chunk.record_row(raw)
    return MirrorRow(row.leaf_index, row.record_id, row.created_at, row.canonical,
                     dict(row.columns, tenant=row.tenant,
                          environment_index=row.environment_index), row.body)
