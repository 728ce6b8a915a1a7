"""Whole-log scans over values an insider with database access set to anything: a tree
size far beyond the leaves stored, a row or leaf hash at a huge index, a leaf index
SQLite keeps as a real or text, a body or created_at of another type. ``log fsck`` ends
(it walked every index up to the stored size: at 2**63 - 1, for ever) and ``audit``
names each one as a finding (it said COMPLETE, read leaf 7.5 as leaf 7, or crashed),
with worker processes or without, alike."""

from __future__ import annotations

import threading
from datetime import datetime
from pathlib import Path

import pytest

from ledger.audit import AuditReport
from ledger.checkpoint import NoteSigner
from ledger.leaves.envelope import Leaf
from ledger.leaves.record_v2 import EnvironmentRef, build_records_v2
from ledger.store.fsck import FsckReport, RowWorkers, fsck
from ledger.store.log_audit import audit_log
from ledger.store.migrate import upgrade
from ledger.store.sql import SqlLedger
from tests.integration.conftest import ORIGIN
from tests.integration.test_scan_layouts import BATCHES, ROWS, _build, _facts, _sql

SIZE = 2 + BATCHES * ROWS  # leaves 0 and 1 are environments
EVERYTHING = (datetime(2000, 1, 1), datetime(2100, 1, 1))
HANG_BOUND_S = 300  # an overall bound only: without the fix the walk never ends


@pytest.fixture(autouse=True)
def verifier_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUDIT_LEDGER_HOME", str(tmp_path / "home"))


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """SQLite only: it keeps whatever type a tampering UPDATE gives a column."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    upgrade(url)
    return url


def _fsck(url: str, signer: NoteSigner, workers: RowWorkers | None) -> FsckReport:
    """``fsck`` in a thread, bounded: a walk that never ends fails the test."""
    outcome: list[FsckReport | BaseException] = []

    def run() -> None:
        try:
            with SqlLedger(url) as ledger:
                outcome.append(fsck(ledger, signer.verifier(), workers=workers))
        except BaseException as exc:  # noqa: BLE001 - the test reads what ended it
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG_BOUND_S)
    assert outcome, "fsck did not end"
    assert isinstance(outcome[0], FsckReport), outcome
    return outcome[0]


def _one_more_batch(declared: Leaf, batch_id: str) -> list[Leaf]:
    """A batch of records after ``_build``'s, naming its environment leaf ``declared``."""
    return build_records_v2(
        origin=ORIGIN, engine="engine-0", environment=EnvironmentRef(0, declared.leaf_hash),
        batch_id=batch_id, padded_length=ROWS, padding_side="left",
        generation={"max_new_tokens": 24, "temperature": 0}, timings_ms={"forward": 1.0},
        rows=[_facts(row) for row in range(ROWS)])


def _forge_copy(url: str, at: int, assignments: str) -> None:
    """Insert a copy of the row at leaf ``at`` with ``assignments`` (SQL SET clauses)."""
    with SqlLedger(url) as ledger, ledger.engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE TEMP TABLE copied AS SELECT * FROM records "
                             f"WHERE leaf_index = {int(at)}")
        conn.exec_driver_sql(f"UPDATE copied SET {assignments}")
        conn.exec_driver_sql("INSERT INTO records SELECT * FROM copied")


def _fsck_both(url: str, signer: NoteSigner) -> list[tuple[str, str, str]]:
    alone = _fsck(url, signer, None)
    spread = _fsck(url, signer, RowWorkers(url, workers=2, rows_per_range=5))
    found = [(f.kind, f.where, f.detail) for f in alone.findings]
    assert [(f.kind, f.where, f.detail) for f in spread.findings] == found
    return found


def _audit(url: str, signer: NoteSigner, workers: RowWorkers | None) -> AuditReport:
    with SqlLedger(url) as ledger:
        latest = ledger.latest_checkpoint()
        assert latest is not None
        checkpoint = signer.verifier().open_checkpoint(latest.note, signer.verifier().name)
        return audit_log(ledger, checkpoint, *EVERYTHING, workers)


def _audit_both(url: str, signer: NoteSigner) -> list[tuple[str, int | None, str]]:
    alone = _audit(url, signer, None)
    assert _audit(url, signer, RowWorkers(url, workers=3, rows_per_range=5)) == alone
    return [(f.kind, f.leaf_index, f.message) for f in alone.findings]


def test_fsck_ends_on_a_tree_size_set_to_the_largest_bigint(
        ledger_url: str, signer: NoteSigner) -> None:
    _build(ledger_url, signer)
    _sql(ledger_url, "UPDATE tree_state SET size = :s", s=2**63 - 1)
    span = f"leaves {SIZE}..{2**63 - 2}"
    assert _fsck_both(ledger_url, signer) == [
        ("node_missing", span, "no leaf hash for any of them"),
        ("record_missing", span, "log entries with no mirror row")]


def test_fsck_skips_to_a_leaf_and_row_stored_far_beyond_and_checks_them(
        ledger_url: str, signer: NoteSigner) -> None:
    """Nothing stored between the log's end and a leaf hash and row moved to 2**62: one
    finding for the stretch, then the moved row is checked against its leaf hash."""
    _build(ledger_url, signer)
    far = 2**62
    _sql(ledger_url, "UPDATE tree_state SET size = :s", s=far + 3)
    _sql(ledger_url, "UPDATE tree_nodes SET idx = :to WHERE level = 0 AND idx = :at",
         to=far, at=SIZE - 1)
    _sql(ledger_url, "UPDATE records SET leaf_index = :to WHERE leaf_index = :at",
         to=far, at=SIZE - 1)
    last, tail = SIZE - 1, f"leaves {far + 1}..{far + 2}"
    found = _fsck_both(ledger_url, signer)
    assert found[:4] == [
        ("node_missing", f"leaves {last}..{far - 1}", "no leaf hash for any of them"),
        ("record_missing", f"leaves {last}..{far - 1}", "log entries with no mirror row"),
        # the moved row was judged against the leaf hash moved with it: no finding
        ("node_missing", tail, "no leaf hash for any of them"),
        ("record_missing", tail, "log entries with no mirror row")]
    # the checkpoint and anchor at the log's size: its last leaf is not where it was
    assert [(kind, where, detail.endswith("not recomputed: leaves before it are missing"))
            for kind, where, detail in found[4:]] == [
        ("checkpoint_root_mismatch", f"checkpoint {SIZE}", True),
        ("anchor_root_mismatch", f"anchor {SIZE} (local:{SIZE})", True)]


def test_audit_owes_rows_for_leaves_beyond_the_checkpoint(
        ledger_url: str, signer: NoteSigner) -> None:
    """Rows the checkpoint does not cover yet must still be there: a deleted one is
    ``rows_missing`` (audit said COMPLETE)."""
    unsealed = _one_more_batch(_build(ledger_url, signer)[0], "ff" * 16)
    with SqlLedger(ledger_url).start() as ledger:
        for leaf in unsealed:
            ledger.append(leaf)
    _sql(ledger_url, "DELETE FROM records WHERE leaf_index = :at", at=SIZE + 3)
    assert _audit_both(ledger_url, signer) == [
        ("rows_missing", SIZE + 3, f"mirror rows missing for leaves {SIZE + 3}..{SIZE + 3}")]


@pytest.mark.parametrize(("statement", "expected"), [
    ("UPDATE records SET leaf_index = 7.5 WHERE leaf_index = 7",
     ("row_malformed", None, "its leaf index is stored as 7.5, not an integer")),
    ("UPDATE records SET body = 'abc' WHERE leaf_index = 8",
     ("row_malformed", 8, "a stored value is not of its column's type")),
    ("UPDATE records SET canonical = 'abc' WHERE leaf_index = 8",
     ("row_malformed", 8, "a stored value is not of its column's type")),
    ("UPDATE records SET created_at = 'not a time' WHERE leaf_index = 8",
     ("row_malformed", 8, "a stored value is not of its column's type")),
], ids=["a real leaf index", "a text body", "a text envelope", "a created_at no time"])
def test_audit_names_a_value_of_another_type(
        statement: str, expected: tuple[str, int | None, str], sqlite_url: str,
        signer: NoteSigner) -> None:
    """A leaf index 7.5 passed as leaf 7; the others ended the audit with an internal
    error (exit 4). Each is now one ``row_malformed`` finding that ends the scan."""
    _build(sqlite_url, signer)
    _sql(sqlite_url, statement)
    found = _audit_both(sqlite_url, signer)
    assert len(found) == 1, found
    kind, index, message = found[0]
    assert (kind, index) == expected[:2]
    assert expected[2] in message, message


@pytest.mark.parametrize("stored", ["7.5", "'x'"], ids=["a real", "text"])
def test_fsck_names_a_leaf_index_of_another_type(stored: str, sqlite_url: str,
                                                  signer: NoteSigner) -> None:
    """The last row's index made text stayed the next row while leaves remained, and
    comparing it with a leaf index raised TypeError."""
    _build(sqlite_url, signer)
    last = SIZE - 1
    moved = stored.strip("'")
    _sql(sqlite_url, f"UPDATE records SET leaf_index = {stored} WHERE leaf_index = :at",
         at=7 if moved == "7.5" else last)
    left = 7 if moved == "7.5" else last
    found = _fsck_both(sqlite_url, signer)
    assert ("record_missing", f"leaf {left}", "log entry with no mirror row") in found
    assert [kind for kind, _, _ in found].count("record_extra") == 1
    assert any(kind == "record_extra" and where == f"leaf {moved}"
               for kind, where, _ in found), found


@pytest.mark.parametrize("statement", [
    "UPDATE records SET body = 'abc' WHERE leaf_index = 8",
    "UPDATE records SET canonical = 'abc' WHERE leaf_index = 8",
    "UPDATE records SET created_at = 'not a time' WHERE leaf_index = 8",
], ids=["a text body", "a text envelope", "a created_at no time"])
def test_fsck_names_a_row_value_of_another_type(statement: str, sqlite_url: str,
                                                signer: NoteSigner) -> None:
    """Each ended ``log fsck`` with an internal error (TypeError, ValueError)."""
    _build(sqlite_url, signer)
    _sql(sqlite_url, statement)
    found = _fsck_both(sqlite_url, signer)
    assert [(kind, where.split(" (")[0]) for kind, where, _ in found] == [
        ("row_malformed", "leaf 8")], found
    assert "a stored value is not of its column's type" in found[0][2]


def test_fsck_reads_a_text_leaf_hash_as_a_wrong_one(sqlite_url: str,
                                                    signer: NoteSigner) -> None:
    """A leaf hash stored as text made reading the tree raise TypeError."""
    _build(sqlite_url, signer)
    _sql(sqlite_url, "UPDATE tree_nodes SET hash = 'abc' WHERE level = 0 AND idx = 8")
    found = _fsck_both(sqlite_url, signer)
    assert [kind for kind, _, _ in found][:2] == ["record_altered", "node_mismatch"]
    assert found[0][1].startswith("leaf 8 (record ")


def _fsck_ends(url: str, signer: NoteSigner) -> list[tuple[str, str, str]]:
    """Both paths end with the same findings and at least one (no internal error)."""
    found = _fsck_both(url, signer)
    assert found
    return found


def test_fsck_ends_on_an_infinite_leaf_index(sqlite_url: str, signer: NoteSigner) -> None:
    """Found by review: SQLite keeps 9e999 as +inf, and ``int(inf)`` raised
    OverflowError where the code before named the row as extra."""
    _build(sqlite_url, signer)
    last = SIZE - 1
    _sql(sqlite_url, "UPDATE records SET leaf_index = 9e999 WHERE leaf_index = :at", at=last)
    _sql(sqlite_url, "DELETE FROM tree_nodes WHERE level = 0 AND idx = :at", at=last)
    found = _fsck_ends(sqlite_url, signer)
    assert ("record_extra", "leaf inf", "mirror row beyond the log's size") in found
    assert ("record_missing", f"leaf {last}", "log entry with no mirror row") in found


def test_fsck_ends_on_a_tree_size_beyond_any_leaf_index(sqlite_url: str,
                                                         signer: NoteSigner) -> None:
    """A size of 1e30 and a leaf hash near 2**63: the batch after it ran past the largest
    BIGINT and binding its end raised OverflowError."""
    _build(sqlite_url, signer)
    _sql(sqlite_url, "UPDATE tree_state SET size = 1e30")
    _sql(sqlite_url, "INSERT INTO tree_nodes (level, idx, hash) VALUES "
         "(0, 9223372036854775707, zeroblob(32))")
    found = _fsck_ends(sqlite_url, signer)
    assert ("node_missing", f"leaves {SIZE}..9223372036854775706",
            "no leaf hash for any of them") in found


def test_fsck_findings_follow_the_leaves_stored_not_the_stretches_between(
        ledger_url: str, signer: NoteSigner) -> None:
    """Found by review: two leaf hashes at the edges of each batch of 5,000 indexes made
    fsck walk and report every index between them (200,002 findings from 40 rows). Each
    stretch with nothing stored is now one finding, whatever its length."""
    _build(ledger_url, signer)
    _sql(ledger_url, "UPDATE tree_state SET size = :s", s=2**63 - 1)
    planted = [(0, k * 10**15 + at, bytes(32)) for k in range(1, 21) for at in (0, 4999)]
    with SqlLedger(ledger_url) as ledger, ledger.engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO tree_nodes (level, idx, hash) VALUES "
            + ", ".join(["(%s, %s, %s)" if ledger.is_postgres else "(?, ?, ?)"]
                        * len(planted)), tuple(v for row in planted for v in row))
    found = _fsck_ends(ledger_url, signer)
    assert len(found) <= 6 * len(planted), len(found)


def test_a_text_leaf_index_ending_a_page_is_read_alike_with_workers(
        sqlite_url: str, signer: NoteSigner) -> None:
    """Found by review: 5,000 rows at text indexes filled a read page, and paging on by
    ``int(last index) + 1`` raised ValueError in a worker (exit 4) where one process
    named the first as ``row_malformed``."""
    _build(sqlite_url, signer)
    with SqlLedger(sqlite_url) as ledger, ledger.engine.begin() as conn:
        conn.exec_driver_sql("CREATE TEMP TABLE copied AS SELECT * FROM records "
                             "WHERE leaf_index = 25")
        conn.exec_driver_sql(
            "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < 4999) "
            "INSERT INTO records SELECT 'x' || printf('%04d', i), 'rid-' || i, created_at, "
            "tenant, model_name, model_digest, accelerator, accelerator_model, "
            "driver_version, torch_version, torch_commit, service_revision, "
            "input_commitment, output_commitment, canonical, body, environment_index "
            "FROM copied, n")
    found = _audit_both(sqlite_url, signer)
    assert [(kind, message) for kind, _, message in found] == [
        ("row_malformed", "a mirror row (record rid-0): its leaf index is stored as "
         "'x0000', not an integer")]
    assert sum(kind == "record_extra" for kind, _, _ in _fsck_ends(sqlite_url, signer)) \
        == 5000


def test_a_row_forged_at_a_negative_index_is_found(ledger_url: str,
                                                   signer: NoteSigner) -> None:
    """Found by review: both scans started at leaf 0, so a forged row at -1, which the
    mirror serves first and as covered by the checkpoint, was checked by neither."""
    _build(ledger_url, signer)
    _forge_copy(ledger_url, 8, "leaf_index = -1, record_id = 'forged-1'")
    assert [(kind, index) for kind, index, _ in _audit_both(ledger_url, signer)] == [
        ("row_extra", -1)]
    assert _fsck_ends(ledger_url, signer) == [
        ("record_extra", "leaf -1", "mirror row with no log entry")]


def test_rows_appended_while_audit_reads_are_not_extra(ledger_url: str,
                                                       signer: NoteSigner) -> None:
    """Found by review: the tree size is read before the rows, so a live log's appends
    in between were ``row_extra`` findings on an honest log."""
    appended = _one_more_batch(_build(ledger_url, signer)[0], "ee" * 16)
    with SqlLedger(ledger_url) as ledger:
        read_size = ledger.tree_head

        def size_then_appends() -> tuple[int, bytes]:
            head = read_size()
            if appended:
                with SqlLedger(ledger_url).start() as writer:
                    for leaf in appended:
                        writer.append(leaf)
                appended.clear()
            return head

        ledger.tree_head = size_then_appends  # type: ignore[method-assign]
        latest = ledger.latest_checkpoint()
        assert latest is not None
        checkpoint = signer.verifier().open_checkpoint(latest.note, signer.verifier().name)
        report = audit_log(ledger, checkpoint, *EVERYTHING, None)
    assert report.ok, report.findings
    assert report.rows_checked == SIZE  # the log as its size was read: later rows wait


@pytest.mark.parametrize("stored", ["-1e19", "-9e999"], ids=["below any bigint", "-inf"])
def test_a_row_forged_below_any_bigint_is_found(stored: str, sqlite_url: str,
                                                signer: NoteSigner) -> None:
    """Found by review: SQLite orders a real below -2**63, so scans from there read
    neither -1e19 nor -inf, and a forged row there passed both commands."""
    _build(sqlite_url, signer)
    _forge_copy(sqlite_url, 5, f"leaf_index = {stored}, record_id = 'forged-0000'")
    assert [kind for kind, _, _ in _audit_both(sqlite_url, signer)] == ["row_malformed"]
    found = _fsck_ends(sqlite_url, signer)
    assert [(kind, detail) for kind, _, detail in found] == [
        ("record_extra", "mirror row with no log entry")]
