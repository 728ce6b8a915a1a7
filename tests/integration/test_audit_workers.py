"""``audit`` with its row proofs spread over worker processes (decision 0065) reports
exactly what one process reports: the same findings in the same order and words, the
same counts of rows checked, in range and not yet covered. Defects are planted in
different ranges, including ones only a scan in leaf order can judge (an environment
named with another leaf's hash, a stream start the log lacks) and rows beyond the
checkpoint and beyond the log."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from ledger.audit import AuditReport
from ledger.checkpoint import NoteSigner
from ledger.store.log_audit import audit_log
from ledger.store.range_workers import RowWorkers
from ledger.store.sql import SqlLedger
from tests.cli_runs import cli_json
from tests.integration.test_scan_layouts import (
    BATCHES,
    ROWS,
    _build,
    _edit_body_byte,
    _environment,
    _sql,
    shadow_copy,
)

SIZE = 2 + BATCHES * ROWS  # leaves 0 and 1 are environments
EVERYTHING = (datetime(2000, 1, 1), datetime(2100, 1, 1))


@pytest.fixture(autouse=True)
def verifier_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUDIT_LEDGER_HOME", str(tmp_path / "home"))


def _audit(url: str, signer: NoteSigner, workers: RowWorkers | None,
           window: tuple[datetime, datetime] = EVERYTHING) -> AuditReport:
    with SqlLedger(url) as ledger:
        latest = ledger.latest_checkpoint()
        assert latest is not None
        checkpoint = signer.verifier().open_checkpoint(latest.note, signer.verifier().name)
        return audit_log(ledger, checkpoint, *window, workers)


def _used(workers: RowWorkers) -> bool:
    """Whether ``workers`` would run for the log at their URL (more than one range)."""
    with SqlLedger(workers.url) as ledger:
        return workers.used(workers.ranges(ledger.next_row_from))


def _both(url: str, signer: NoteSigner, window: tuple[datetime, datetime] = EVERYTHING
          ) -> AuditReport:
    workers = RowWorkers(url, workers=3, rows_per_range=5)
    assert _used(workers)
    alone, spread = _audit(url, signer, None, window), _audit(url, signer, workers, window)
    assert spread == alone
    return alone


def test_defects_across_ranges_are_found_as_by_one_process(
        ledger_url: str, signer: NoteSigner) -> None:
    _build(ledger_url, signer, forged_batch=2, streamed_batch=0)
    with SqlLedger(ledger_url) as ledger:  # beyond the checkpoint: not yet covered
        for name in ("NVIDIA L4", "NVIDIA L40S"):
            ledger.append(_environment(name))
    _sql(ledger_url, "UPDATE records SET tenant = 'tenant-7' WHERE leaf_index = 3")
    _edit_body_byte(ledger_url)  # leaf 16
    _sql(ledger_url, "UPDATE records SET leaf_index = :to WHERE leaf_index = :at",
         to=SIZE + 20, at=SIZE + 1)  # the last range: a row beyond the log

    report = _both(ledger_url, signer)

    kinds = [finding.kind for finding in report.findings]
    assert kinds[:2] == ["stream_start_mismatch", "column_mismatch"]  # leaves 2 and 3
    assert {"record_unparseable", "environment_mismatch", "row_extra"} <= set(kinds)
    # batch 2, and the environments row of the moved leaf
    assert sum(kind == "environment_mismatch" for kind in kinds) == ROWS + 1
    assert sum(kind == "stream_start_mismatch" for kind in kinds) == ROWS  # batch 0
    assert report.uncovered == 1 and report.rows_checked == SIZE + 1


def test_a_deleted_row_stops_both_at_the_same_leaf(ledger_url: str, signer: NoteSigner
                                                    ) -> None:
    _build(ledger_url, signer)
    _sql(ledger_url, "DELETE FROM records WHERE leaf_index = 12")
    report = _both(ledger_url, signer)
    assert [(f.kind, f.leaf_index) for f in report.findings] == [("rows_missing", 12)]


def test_a_clean_log_counts_the_same_records_in_a_window(ledger_url: str,
                                                         signer: NoteSigner) -> None:
    leaves = _build(ledger_url, signer)
    assert _both(ledger_url, signer).ok
    with SqlLedger(ledger_url) as ledger:
        times = sorted({row.created_at for row in ledger.iter_records()})
    # a window holding some of the records' times and not others
    window = (times[len(times) // 2], datetime(2100, 1, 1)) if len(times) > 1 else \
        (times[0], datetime(2100, 1, 1))
    report = _both(ledger_url, signer, window)
    assert report.ok and report.rows_checked == len(leaves)
    assert 0 < report.in_range <= len(leaves)


def test_the_cli_takes_a_worker_count_and_refuses_none(
        ledger_url: str, signer: NoteSigner, capsys: pytest.CaptureFixture[str]) -> None:
    _build(ledger_url, signer)
    command = ("audit", "--db", ledger_url, "--from", "2000-01-01", "--to", "2100-01-01",
               "--log-key", signer.verifier().encode(), "--no-state")
    code, said = cli_json(capsys, *command, "--workers", "2")
    assert code == 0 and said["complete"] and said["rows_checked"] == SIZE
    code, said = cli_json(capsys, *command, "--workers", "0")
    assert code != 0 and "--workers: give 1 or more" in str(said)


# --- found by review: each of these failed (or crashed) with workers before its fix ---


def test_workers_read_the_tables_the_parent_reads_whatever_the_url_options(  # type: ignore[no-untyped-def]
        make_pg_database, signer: NoteSigner) -> None:
    """A URL (or PGOPTIONS) setting a search path reached only the workers: the parent's
    session options replace it. With an untampered copy of the records in another
    schema, the workers proved the copy and the audit said COMPLETE over a tampered
    table."""
    from ledger.store.migrate import upgrade

    url = str(make_pg_database())
    upgrade(url)
    _build(url, signer)
    shadowed = shadow_copy(url)
    _sql(url, "UPDATE records SET tenant = 'tenant-7' WHERE leaf_index = 12")
    report = _both(shadowed, signer)
    assert [(f.kind, f.leaf_index, f.column) for f in report.findings] == [
        ("column_mismatch", 12, "tenant")]


def test_a_tree_size_far_beyond_the_rows_costs_no_empty_ranges_and_is_a_finding(
        ledger_url: str, signer: NoteSigner, capsys: pytest.CaptureFixture[str]) -> None:
    """The database's owner can set the tree size to anything: the workers' ranges
    follow the rows stored (at 2**63 - 1 the list of ranges raised MemoryError), and
    the leaves that size names with no row are owed rows, a finding (the audit said
    COMPLETE)."""
    _build(ledger_url, signer)
    _sql(ledger_url, "UPDATE tree_state SET size = :s", s=2**63 - 1)
    command = ("audit", "--db", ledger_url, "--from", "2000-01-01", "--to", "2100-01-01",
               "--log-key", signer.verifier().encode(), "--no-state", "--workers")
    alone, spread = cli_json(capsys, *command, "1"), cli_json(capsys, *command, "2")
    assert spread == alone
    assert alone[0] == 1 and alone[1]["rows_checked"] == SIZE
    assert [(f["kind"], f["leaf_index"], f["message"]) for f in alone[1]["findings"]] == [
        ("rows_missing", SIZE, f"mirror rows missing for leaves {SIZE}..{2**63 - 2}: the "
         f"log's stored size is {2**63 - 1}")]


def test_a_row_no_worker_can_read_is_left_to_the_parent(tmp_path: Path,
                                                        signer: NoteSigner) -> None:
    """SQLite keeps a text body in a BLOB column: a worker's proof raised on it and
    failed its whole range, where one process stops first at a deleted row before it."""
    from ledger.store.migrate import upgrade

    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    upgrade(url)
    _build(url, signer)
    _sql(url, "DELETE FROM records WHERE leaf_index = 6")
    _sql(url, "UPDATE records SET body = 'abc' WHERE leaf_index = 8")
    report = _both(url, signer)
    assert [(f.kind, f.leaf_index) for f in report.findings] == [("rows_missing", 6)]


def test_workers_open_an_sqlite_uri_as_the_parent_does(tmp_path: Path,
                                                      signer: NoteSigner) -> None:
    from ledger.store.migrate import upgrade

    path = tmp_path / "ledger.db"
    upgrade(f"sqlite:///{path}")
    _build(f"sqlite:///{path}", signer)
    assert _both(f"sqlite:///file:{path}?uri=true", signer).ok


@pytest.mark.parametrize("stored", [7.5, "'x'"], ids=["a real", "text"])
def test_a_leaf_index_sqlite_keeps_as_no_integer_is_read_as_by_one_process(
        stored: object, tmp_path: Path, signer: NoteSigner) -> None:
    """SQLite keeps whatever a tampering UPDATE gives a column. A row at 7.5 broke the
    workers' runs (TypeError); a text index broke the end of their ranges (ValueError).
    Both are now the parent's to read, row by row, as one process reads them."""
    from ledger.store.migrate import upgrade

    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    upgrade(url)
    _build(url, signer)
    _sql(url, f"UPDATE records SET leaf_index = {stored} WHERE leaf_index = 7")
    _both(url, signer)
