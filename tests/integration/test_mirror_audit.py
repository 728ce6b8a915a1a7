"""The mirror audited column by column, fsck of anchors, the derived coverage, and
`log consistency` against the signed notes; on SQLite and PostgreSQL alike.

Each tampering is done with plain SQL, as an operator with database access would.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import create_engine, delete, update

from ledger.anchor.local import LocalAnchor
from ledger.checkpoint import Checkpoint, NoteSigner
from ledger.store.fsck import fsck
from ledger.store.schema import anchors, checkpoints, records
from ledger.store.sql import SqlLedger
from tests.cli_runs import cli_text
from tests.integration.conftest import ORIGIN
from tests.records import make_record

SEALS = (10, 20, 30)  # checkpoint sizes, each anchored locally


def _build(url: str, signer: NoteSigner) -> None:
    with SqlLedger(url) as ledger:
        anchor = LocalAnchor(ledger, signer.verifier(), ORIGIN)
        for i in range(SEALS[-1] + 3):  # 3 rows beyond the last checkpoint
            ledger.append(make_record(i))
            if i + 1 in SEALS:
                sealed = ledger.seal_checkpoint(signer, ORIGIN)
                assert sealed is not None
                anchor.anchor(sealed.note)


def _execute(url: str, *statements: Any) -> None:
    engine = create_engine(url)
    with engine.begin() as conn:
        for statement in statements:
            conn.execute(statement)
    engine.dispose()


def _row(url: str, leaf: int) -> Any:
    with SqlLedger(url) as ledger:
        row = ledger.record_at(leaf)
    assert row is not None
    return row


def _fsck(url: str, signer: NoteSigner) -> list[tuple[str, str]]:
    with SqlLedger(url) as ledger:
        report = fsck(ledger, signer.verifier())
    return [(f.kind, f.where) for f in report.findings]


def _audit(capsys: pytest.CaptureFixture[str], url: str, signer: NoteSigner,
           *extra: str) -> tuple[int, str]:
    code, out, _ = cli_text(capsys, "audit", "--db", url, "--from", "2026-01-01",
                        "--to", "2027-01-01", "--log-key", signer.verifier().encode(), *extra)
    return code, out


@pytest.fixture()
def log(ledger_url: str, signer: NoteSigner) -> str:
    _build(ledger_url, signer)
    return ledger_url


def test_clean_log_passes_audit_and_fsck(log: str, signer: NoteSigner,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _audit(capsys, log, signer, "--json")
    result = json.loads(out)
    assert code == 0, result
    assert result["complete"] and result["findings"] == []
    assert (result["records_in_range"], result["rows_checked"], result["not_yet_covered"]) == (
        30, 33, 3)
    with SqlLedger(log) as ledger:
        report = fsck(ledger, signer.verifier())
    assert report.ok, report.findings
    assert (report.records_checked, report.checkpoints_checked, report.anchors_checked) == (
        33, 3, 3)


# A column edited to a value that keeps the row inside the audited range and leaves the
# canonical bytes (hence the root) alone: only recomputing the column from the bytes shows it.
COLUMN_EDITS = [
    ("tenant", "bank-z", "bank-z", "bank-a"),
    ("model_digest", "sha256:" + "00" * 32, "sha256:" + "00" * 32, "sha256:" + "ab" * 32),
    ("created_at", datetime(2026, 11, 13, 11, 0, 12), "2026-11-13T11:00:12.000000Z",
     "2026-11-13T10:00:12.000Z"),
]


@pytest.mark.parametrize(("column", "value", "stored", "expected"), COLUMN_EDITS,
                         ids=[c[0] for c in COLUMN_EDITS])
def test_edited_mirror_column_named_by_audit_and_fsck(
    log: str, signer: NoteSigner, capsys: pytest.CaptureFixture[str],
    column: str, value: Any, stored: str, expected: str,
) -> None:
    row = _row(log, 12)
    _execute(log, update(records).where(records.c.leaf_index == 12).values({column: value}))

    code, out = _audit(capsys, log, signer, "--json")
    result = json.loads(out)
    assert code == 1 and not result["complete"]
    assert result["findings"] == [{
        "kind": "column_mismatch", "leaf_index": 12, "record_id": row.record_id,
        "column": column, "stored": stored, "expected": expected,
        "message": f"leaf 12 (record {row.record_id}): column {column} is {stored!r}, "
                   f"the record says {expected!r}",
    }]
    code, out = _audit(capsys, log, signer)
    assert code == 1
    assert f"leaf 12 (record {row.record_id}): column {column} is {stored!r}" in out
    assert "NOT COMPLETE" in out
    assert _fsck(log, signer) == [("column_mismatch", f"leaf 12 (record {row.record_id})")]


def _coverage(url: str) -> list[tuple[int | None, str | None]]:
    """Each row's covering checkpoint and anchor, as the full scan and as one row read
    them (the two computations must agree)."""
    with SqlLedger(url) as ledger:
        scanned = [(row.checkpoint_size, row.anchor_ref) for row in ledger.iter_records()]
        single = []
        for leaf in range(len(scanned)):
            row = ledger.record_at(leaf)
            assert row is not None
            single.append((row.checkpoint_size, row.anchor_ref))
        page, _ = ledger.mirror.query(limit=1000)
    assert single == scanned == [(r.checkpoint_size, r.anchor_ref) for r in page]
    return scanned


def test_coverage_is_derived_from_the_checkpoint_and_anchor_sizes(log: str) -> None:
    assert _coverage(log) == ([(10, "local:10")] * 10 + [(20, "local:20")] * 10
                              + [(30, "local:30")] * 10 + [(None, None)] * 3)
    # A lost anchor: the next one covers its rows, and nothing stored can disagree.
    _execute(log, delete(anchors).where(anchors.c.size == 20))
    assert _coverage(log) == ([(10, "local:10")] * 10 + [(20, "local:30")] * 10
                              + [(30, "local:30")] * 10 + [(None, None)] * 3)
    _execute(log, delete(anchors))
    assert _coverage(log) == [(10, None)] * 10 + [(20, None)] * 10 + [(30, None)] * 10 \
        + [(None, None)] * 3


def test_anchor_note_signed_by_another_key_is_named(log: str, signer: NoteSigner) -> None:
    with SqlLedger(log) as ledger:
        stored = ledger.checkpoint(20)
    assert stored is not None
    other = NoteSigner(ORIGIN, Ed25519PrivateKey.generate())
    forged = other.sign_checkpoint(Checkpoint(ORIGIN, 20, stored.root))
    _execute(log, update(anchors).where(anchors.c.size == 20).values(note=forged))
    with SqlLedger(log) as ledger:
        report = fsck(ledger, signer.verifier())
    assert [(f.kind, f.where) for f in report.findings] == [
        ("anchor_signature", "anchor 20 (local:20)")]
    assert "no signature by key" in report.findings[0].detail


def test_anchor_of_a_forged_root_is_named(log: str, signer: NoteSigner) -> None:
    # The insider holds the log key: the note verifies, but no stored checkpoint and no
    # prefix of the log has that root.
    forged = signer.sign_checkpoint(Checkpoint(ORIGIN, 20, bytes(32)))
    _execute(log, update(anchors).where(anchors.c.size == 20).values(note=forged))
    assert _fsck(log, signer) == [("anchor_checkpoint_mismatch", "anchor 20 (local:20)"),
                                  ("anchor_root_mismatch", "anchor 20 (local:20)")]


def test_anchor_dated_before_a_smaller_one_is_named(log: str, signer: NoteSigner) -> None:
    _execute(log, update(anchors).where(anchors.c.size == 20)
             .values(anchored_at=datetime(2000, 1, 1)))
    assert _fsck(log, signer) == [("anchor_order", "anchor 20 (local:20)")]


def test_anchor_whose_checkpoint_is_gone_is_named(log: str, signer: NoteSigner) -> None:
    _execute(log, delete(checkpoints).where(checkpoints.c.size == 20))
    assert _fsck(log, signer) == [("anchor_checkpoint_missing", "anchor 20 (local:20)")]


def test_latest_checkpoint_deleted_is_named(log: str, signer: NoteSigner) -> None:
    _execute(log, delete(checkpoints).where(checkpoints.c.size == 30))
    with SqlLedger(log) as ledger:
        report = fsck(ledger, signer.verifier())
    assert [(f.kind, f.where) for f in report.findings] == [
        ("anchor_checkpoint_missing", "anchor 30 (local:30)"),
        ("checkpoint_missing", "checkpoint 30"),
    ]
    assert report.findings[1].detail == ("the latest checkpoint the anchors say was sealed "
                                         "is not in the checkpoints table")


def test_log_fsck_cli_names_anchor_findings(log: str, signer: NoteSigner,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    key = signer.verifier().encode()
    code, out, _ = cli_text(capsys, "log", "--json", "--db", log, "--log-key", key, "fsck")
    assert code == 0 and json.loads(out)["anchors_checked"] == 3
    _execute(log, delete(checkpoints).where(checkpoints.c.size == 10))
    code, out, _ = cli_text(capsys, "log", "--json", "--db", log, "--log-key", key, "fsck")
    result = json.loads(out)
    assert code == 1 and not result["ok"]
    assert [(f["kind"], f["where"]) for f in result["findings"]] == [
        ("anchor_checkpoint_missing", "anchor 10 (local:10)")]


# --- log consistency A B checks the signed notes -----------------------------------------


def _consistency(capsys: pytest.CaptureFixture[str], url: str, signer: NoteSigner,
                 first: int, second: int, *json: str) -> tuple[int, str, str]:
    return cli_text(capsys, "log", *json, "--db", url, "--log-key", signer.verifier().encode(),
                "consistency", str(first), str(second))


def test_consistency_verified_against_signed_notes(log: str, signer: NoteSigner,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _consistency(capsys, log, signer, 10, 30, "--json")
    result = json.loads(out)
    assert code == 0 and result["verified"] is True and result["proof"]
    # The root column is not what is checked: editing it changes nothing.
    _execute(log, update(checkpoints).where(checkpoints.c.size == 10).values(root=bytes(32)))
    code, out, _ = _consistency(capsys, log, signer, 10, 30, "--json")
    assert code == 0 and json.loads(out)["verified"] is True


def test_consistency_with_a_note_of_another_key_fails_naming_it(
    log: str, signer: NoteSigner, capsys: pytest.CaptureFixture[str]
) -> None:
    with SqlLedger(log) as ledger:
        stored = ledger.checkpoint(10)
    assert stored is not None
    other = NoteSigner(ORIGIN, Ed25519PrivateKey.generate())
    _execute(log, update(checkpoints).where(checkpoints.c.size == 10)
             .values(note=other.sign_checkpoint(Checkpoint(ORIGIN, 10, stored.root))))
    code, out, err = _consistency(capsys, log, signer, 10, 30)
    assert code == 1
    assert "checkpoint 10: note carries no signature by key" in err + out


def test_consistency_of_a_forged_root_fails(log: str, signer: NoteSigner,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    forged = signer.sign_checkpoint(Checkpoint(ORIGIN, 10, bytes(32)))
    _execute(log, update(checkpoints).where(checkpoints.c.size == 10).values(note=forged))
    code, out, err = _consistency(capsys, log, signer, 10, 30)
    assert code == 1
    assert "the signed checkpoints 10 and 30 are not consistent" in err + out


def test_consistency_of_an_unsealed_size_is_a_usage_error(
    log: str, signer: NoteSigner, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _consistency(capsys, log, signer, 15, 30)
    assert code == 2
    assert "first: the log has no signed checkpoint of size 15" in err + out
