"""``ledger.audit`` without a database: every mirror column is recomputed from the bytes."""

from __future__ import annotations

from datetime import datetime

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger import merkle
from ledger.audit import MirrorRow, audit_range, naive_utc
from ledger.checkpoint import Checkpoint, NoteSigner
from ledger.record import mirror_columns
from tests.records import make_record

SINCE, UNTIL = datetime(2026, 1, 1), datetime(2027, 1, 1)
COLUMNS = sorted(mirror_columns(make_record(0)))


def _rows(count: int = 6) -> list[MirrorRow]:
    rows = []
    for i in range(count):
        record = make_record(i)
        columns = mirror_columns(record)
        created = naive_utc(columns.pop("created_at"))
        rows.append(MirrorRow(i, columns.pop("record_id"), created, record.canonical, columns))
    return rows


def _checkpoint(rows: list[MirrorRow]) -> Checkpoint:
    signer = NoteSigner("test/log", Ed25519PrivateKey.generate())
    root = merkle.root_of(merkle.hash_leaf(r.canonical) for r in rows)
    return signer.verifier().open_checkpoint(
        signer.sign_checkpoint(Checkpoint("test/log", len(rows), root)))


def _edited(row: MirrorRow, column: str) -> MirrorRow:
    if column == "created_at":
        return MirrorRow(row.leaf_index, row.record_id, datetime(2026, 6, 1), row.canonical,
                         row.columns)
    if column == "record_id":
        return MirrorRow(row.leaf_index, "another-id", row.created_at, row.canonical,
                         row.columns)
    assert row.columns is not None
    return MirrorRow(row.leaf_index, row.record_id, row.created_at, row.canonical,
                     {**row.columns, column: "edited"})


def test_faithful_rows_pass() -> None:
    rows = _rows()
    report = audit_range(rows, _checkpoint(rows), SINCE, UNTIL, log_size=len(rows))
    assert report.ok and report.in_range == len(rows) and report.rows_checked == len(rows)


@pytest.mark.parametrize("column", COLUMNS)
def test_every_column_edit_is_named(column: str) -> None:
    rows = _rows()
    checkpoint = _checkpoint(rows)
    rows[3] = _edited(rows[3], column)
    report = audit_range(rows, checkpoint, SINCE, UNTIL, log_size=len(rows))
    assert [(f.kind, f.leaf_index, f.column) for f in report.findings] == [
        ("column_mismatch", 3, column)]
    finding = report.findings[0]
    assert finding.message.startswith(f"leaf 3 (record {rows[3].record_id}): column {column} "
                                      f"is {finding.stored!r}, the record says ")


def test_unparseable_bytes_are_named_and_break_the_root() -> None:
    rows = _rows()
    checkpoint = _checkpoint(rows)
    rows[2] = MirrorRow(2, rows[2].record_id, rows[2].created_at, b'{"a":1,"a":2}',
                        rows[2].columns)
    report = audit_range(rows, checkpoint, SINCE, UNTIL, log_size=len(rows))
    assert [f.kind for f in report.findings] == ["record_unparseable", "root_mismatch"]
    assert "duplicate" in report.findings[0].message


def test_rows_without_columns_check_record_id_and_created_at_only() -> None:
    rows = [MirrorRow(r.leaf_index, r.record_id, r.created_at, r.canonical) for r in _rows()]
    checkpoint = _checkpoint(rows)
    rows[1] = _edited(rows[1], "created_at")
    report = audit_range(rows, checkpoint, SINCE, UNTIL, log_size=len(rows))
    assert [(f.kind, f.column) for f in report.findings] == [("column_mismatch", "created_at")]
