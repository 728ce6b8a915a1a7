"""Prove the mirror's rows are the log's entries, column by column, over a time range."""

from __future__ import annotations

import argparse

from audit_cli.evidence import add_key_option, pinned_verifier
from audit_cli.filters import parse_time
from audit_cli.options import print_json
from audit_cli.remembered import Memory, add_state_options
from ledger.errors import InvalidInputError


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", required=True, help="ledger database URL")
    parser.add_argument("--from", dest="since", required=True, help="RFC 3339, inclusive")
    parser.add_argument("--to", dest="until", required=True, help="RFC 3339, exclusive")
    parser.add_argument("--workers", type=int, default=None,
                        help="processes proving the rows by ranges (default: one per core, "
                             "at most 8; 1: all in this process)")
    add_key_option(parser)
    add_state_options(parser)


def run(args: argparse.Namespace) -> int:
    from ledger.audit import AuditFinding
    from ledger.store.log_audit import audit_log
    from ledger.store.range_workers import RowWorkers, default_workers
    from ledger.store.sql import SqlLedger

    if args.workers is not None and args.workers < 1:
        raise InvalidInputError("--workers", "give 1 or more")
    verifier = pinned_verifier(args)
    memory = Memory(args, verifier)
    since, until = parse_time(args.since, "--from"), parse_time(args.until, "--to")
    assert since is not None and until is not None
    if since.tzinfo is not None or until.tzinfo is not None:
        from datetime import UTC

        since = since.astimezone(UTC).replace(tzinfo=None) if since.tzinfo else since
        until = until.astimezone(UTC).replace(tzinfo=None) if until.tzinfo else until
    with SqlLedger(args.db) as ledger:
        latest = ledger.latest_checkpoint()
        if latest is None:
            raise InvalidInputError("--db", "the log has no checkpoint yet")
        checkpoint = verifier.open_checkpoint(latest.note, verifier.name)
        workers = RowWorkers(args.db, args.workers or default_workers())
        report = audit_log(ledger, checkpoint, since, until, workers)
        # A tail truncated or rewritten behind the checkpoint this auditor saw last.
        divergence = memory.check(ledger)
    if divergence is not None:
        report.findings.insert(0, AuditFinding(divergence.kind, divergence.message))
    elif report.ok:
        memory.advance(latest.note)
    if args.json:
        print_json({"complete": report.ok, "checkpoint_size": report.checkpoint_size,
                    "records_in_range": report.in_range, "not_yet_covered": report.uncovered,
                    "rows_checked": report.rows_checked,
                    "findings": [f.to_dict() for f in report.findings]})
    else:
        for finding in report.findings:
            print(f"  {finding}")
        verdict = "COMPLETE" if report.ok else "NOT COMPLETE"
        print(f"{verdict}: {report.in_range} records in [{args.since}, {args.until}) against "
              f"the signed checkpoint of size {report.checkpoint_size}; "
              f"{report.rows_checked} rows checked column by column"
              + (f"; {report.uncovered} newer records not yet covered" if report.uncovered
                 else ""))
    return 0 if report.ok else 1
