"""``log fsck`` with its row checks spread over worker processes (decision 0059) finds
exactly what one process finds, in the same order and words: defects of every kind
planted in different ranges, including ones that depend on rows in an earlier range (an
environment named, a stream start) and one in the last range."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from ledger.checkpoint import NoteSigner
from ledger.store.fsck import RowWorkers, fsck
from ledger.store.sql import SqlLedger
from tests.cli_runs import cli_json
from tests.integration.conftest import ORIGIN
from tests.integration.test_scan_layouts import (
    ROWS,
    _build,
    _edit_body_byte,
    _sql,
    shadow_copy,
)

# Leaves: 0 and 1 environments, then batches of ROWS: 2..9 streamed (naming starts the
# log lacks), 10..17 plain, 18..25 naming leaf 0 with leaf 1's hash. Ranges of 5 rows.
LAST = 2 + 3 * ROWS - 1


@pytest.fixture(autouse=True)
def verifier_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUDIT_LEDGER_HOME", str(tmp_path / "home"))


def _used(workers: RowWorkers) -> bool:
    """Whether ``workers`` would run for the log at their URL (more than one range)."""
    with SqlLedger(workers.url) as ledger:
        return workers.used(workers.ranges(ledger.next_row_from))


def _ranges(url: str, workers: RowWorkers) -> list[tuple[int, int | None]]:
    with SqlLedger(url) as ledger:
        return workers.ranges(ledger.next_row_from)


def _findings(url: str, signer: NoteSigner, workers: RowWorkers | None
              ) -> list[tuple[str, str, str]]:
    with SqlLedger(url) as ledger:
        report = fsck(ledger, signer.verifier(), workers=workers)
    assert report.records_checked > 0
    return [(f.kind, f.where, f.detail) for f in report.findings]


def test_defects_across_ranges_are_found_as_by_one_process(
        ledger_url: str, signer: NoteSigner) -> None:
    _build(ledger_url, signer, forged_batch=2, streamed_batch=0)
    _sql(ledger_url, "UPDATE records SET tenant = 'tenant-7' WHERE leaf_index = 3")
    _sql(ledger_url, "DELETE FROM records WHERE leaf_index = 7")
    # a proven row whose stored leaf hash is another's (the parent repeats the row)
    _sql(ledger_url, "UPDATE tree_nodes SET hash = :h WHERE level = 0 AND idx = 12",
         h=b"\x07" * 32)
    _edit_body_byte(ledger_url)  # leaf 16
    # the last range: its last row moved beyond the log's size
    _sql(ledger_url, "UPDATE records SET leaf_index = :to WHERE leaf_index = :at",
         to=LAST + 15, at=LAST)
    workers = RowWorkers(ledger_url, workers=3, rows_per_range=5)
    assert _used(workers)

    alone = _findings(ledger_url, signer, None)
    spread = _findings(ledger_url, signer, workers)

    assert spread == alone
    kinds = [kind for kind, _, _ in alone]
    assert kinds[:2] == ["stream_start_mismatch", "column_mismatch"]  # leaves 2 and 3
    assert {"record_missing", "record_altered", "node_mismatch", "record_unparseable",
            "environment_mismatch", "record_extra", "root_mismatch"} <= set(kinds)
    assert ("record_extra", f"leaf {LAST + 15}", "mirror row beyond the log's size") in alone
    assert ("record_missing", f"leaf {LAST}", "log entry with no mirror row") in alone
    assert sum(kind == "environment_mismatch" for kind in kinds) == ROWS - 1


def test_a_clean_log_passes_with_workers(ledger_url: str, signer: NoteSigner) -> None:
    _build(ledger_url, signer)
    assert _findings(ledger_url, signer, RowWorkers(ledger_url, 2, rows_per_range=7)) == []


def test_one_worker_or_one_range_is_checked_in_this_process() -> None:
    def rows(stored: range) -> Callable[[int], int | None]:
        return lambda index: next((at for at in stored if at >= index), None)

    one_worker = RowWorkers("sqlite:///x.db", workers=1, rows_per_range=5)
    assert not one_worker.used(one_worker.ranges(rows(range(100))))
    four = RowWorkers("sqlite:///x.db", workers=4, rows_per_range=5)
    assert not four.used(four.ranges(rows(range(5))))
    assert RowWorkers("sqlite:///x.db", workers=2, rows_per_range=5).ranges(
        rows(range(11))) == [(-(2**63), 5), (5, 10), (10, None)]


def test_ranges_follow_the_rows_stored_not_their_indexes_values() -> None:
    """Ranges start at stored rows: a stretch with no row, even up to the largest
    BIGINT, costs no empty ranges (placed by numbers alone, 2**63 - 1 made a list
    that raised MemoryError)."""
    stored = [*range(0, 12), 1000, 1001, 2**63 - 2]

    def next_row_from(index: int) -> int | None:
        return next((at for at in stored if at >= index), None)

    assert RowWorkers("sqlite:///x.db", workers=2, rows_per_range=5).ranges(
        next_row_from) == [(-(2**63), 5), (5, 10), (10, 1000), (1000, 2**63 - 2),
                           (2**63 - 2, None)]


def test_the_cli_takes_a_worker_count_and_refuses_none(
        ledger_url: str, signer: NoteSigner, capsys: pytest.CaptureFixture[str]) -> None:
    _build(ledger_url, signer)
    key = signer.verifier().encode()
    command = ("log", "--db", ledger_url, "--log-key", key, "--no-state", "fsck")
    code, said = cli_json(capsys, *command, "--workers", "2")
    assert code == 0 and said["ok"] and said["records_checked"] == 2 + 3 * ROWS
    code, said = cli_json(capsys, *command, "--workers", "0")
    assert code != 0 and "--workers: give 1 or more" in str(said)


def test_a_worker_killed_mid_range_fails_fsck_instead_of_hanging(
        ledger_url: str, signer: NoteSigner) -> None:
    """A worker ended by the kernel (out of memory) or a signal: fsck concludes nothing
    and says so (exit 3 from the CLI); a multiprocessing.Pool waited for its lost range
    for ever. The kill comes once the first range has answered, with ranges still out."""
    import multiprocessing
    import os
    import signal
    import threading

    from ledger.store.fsck_workers import WorkerLostError, fsck_verdicts

    _build(ledger_url, signer)
    workers = RowWorkers(ledger_url, workers=2, rows_per_range=1)
    outcome: list[BaseException | str] = []

    def run() -> None:
        verdicts = fsck_verdicts(workers, ORIGIN, _ranges(ledger_url, workers))
        try:
            next(verdicts)  # the pool is up and a range answered
            for child in multiprocessing.active_children():
                os.kill(child.pid or 0, signal.SIGKILL)
            for _ in verdicts:
                pass
            outcome.append("finished")
        except BaseException as exc:  # noqa: BLE001 - the test reads what ended it
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(120)  # an overall bound: without the fix the loop never ends
    assert outcome, "fsck's workers hung after one was killed"
    assert isinstance(outcome[0], WorkerLostError), outcome
    assert "nothing is concluded" in str(outcome[0])


def test_workers_read_the_tables_the_parent_reads_whatever_the_url_options(  # type: ignore[no-untyped-def]
        make_pg_database, signer: NoteSigner) -> None:
    """Found by review of ``audit``'s workers, which share this pool: a URL setting a
    search path reached only the workers, so they checked another schema's rows."""
    from ledger.store.migrate import upgrade

    url = str(make_pg_database())
    upgrade(url)
    _build(url, signer)
    shadowed = shadow_copy(url)
    _sql(url, "UPDATE records SET tenant = 'tenant-7' WHERE leaf_index = 12")
    workers = RowWorkers(shadowed, workers=3, rows_per_range=5)
    assert _used(workers)
    alone = _findings(shadowed, signer, None)
    assert _findings(shadowed, signer, workers) == alone
    assert [kind for kind, _, _ in alone] == ["column_mismatch"]
