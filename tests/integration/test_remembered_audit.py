"""Audits that remember: ``audit`` and ``log fsck`` hold the log against the checkpoint
they saw last, so an insider without the signing key who truncates the signed tail and
rewrites a record behind it is caught (a rollback), where a memoryless audit says
COMPLETE and fsck OK."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, delete, text, update

from audit_cli.main import main
from ledger import merkle
from ledger.anchor.local import LocalAnchor
from ledger.checkpoint import NoteSigner
from ledger.record import mirror_columns
from ledger.store.schema import anchors, checkpoints, cosignatures, records
from ledger.store.sql import SqlLedger
from tests.integration.conftest import ORIGIN
from tests.records import make_record

SEALS = (10, 20, 35, 40)


@pytest.fixture()
def log(ledger_url: str, signer: NoteSigner) -> str:
    with SqlLedger(ledger_url) as ledger:
        anchor = LocalAnchor(ledger, signer.verifier(), ORIGIN)
        for i in range(SEALS[-1]):
            ledger.append(make_record(i))
            if i + 1 in SEALS:
                sealed = ledger.seal_checkpoint(signer, ORIGIN)
                assert sealed is not None
                anchor.anchor(sealed.note)
    return ledger_url


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    code = main(list(argv))
    return code, json.loads(capsys.readouterr().out)


def _audit(capsys: Any, url: str, signer: NoteSigner, *state: str) -> tuple[int, dict[str, Any]]:
    return _run(capsys, "audit", "--json", "--db", url, "--from", "2026-01-01", "--to",
                "2027-01-01", "--log-key", signer.verifier().encode(), *state)


def _fsck(capsys: Any, url: str, signer: NoteSigner, *state: str) -> tuple[int, dict[str, Any]]:
    return _run(capsys, "log", "--json", "--db", url, "--log-key",
                signer.verifier().encode(), *state, "fsck")


def _insider_truncates_and_rewrites(url: str) -> None:
    """No signing key: drop what was signed above 35, rewrite record 37 and every tree
    node above it so the database agrees with itself again."""
    forged = make_record(37, padding=10)
    columns = mirror_columns(forged)
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(delete(checkpoints).where(checkpoints.c.size > 35))
        conn.execute(delete(anchors).where(anchors.c.size > 35))
        conn.execute(delete(cosignatures).where(cosignatures.c.checkpoint_size > 35))
        conn.execute(update(records).where(records.c.leaf_index == 37).values(
            canonical=forged.canonical, record_id=forged.record_id,
            input_commitment=columns["input_commitment"],
            output_commitment=columns["output_commitment"]))
        leaves = [merkle.hash_leaf(bytes(row[0])) for row in conn.execute(
            text("SELECT canonical FROM records ORDER BY leaf_index"))]
        tree = merkle.MemoryTree(leaves)
        conn.execute(text("DELETE FROM tree_nodes"))
        conn.execute(text("INSERT INTO tree_nodes (level, idx, hash) VALUES (:l, :i, :h)"),
                     [{"l": lv, "i": ix, "h": h} for (lv, ix), h in tree.nodes.items()])
        conn.execute(text("UPDATE tree_state SET root = :r WHERE id = 1"), {"r": tree.root()})
    engine.dispose()


def test_truncated_and_rewritten_tail_is_a_rollback(log: str, signer: NoteSigner,
                                                    tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    audit_state = ("--state", str(tmp_path / "audit.note"))
    fsck_state = ("--state", str(tmp_path / "fsck.note"))
    assert _audit(capsys, log, signer, *audit_state)[0] == 0  # remembers size 40
    assert _fsck(capsys, log, signer, *fsck_state)[0] == 0
    _insider_truncates_and_rewrites(log)

    # Without memory (the old behaviour) both are fooled.
    code, result = _audit(capsys, log, signer, "--no-state")
    assert code == 0 and result["complete"], result
    code, result = _fsck(capsys, log, signer, "--no-state")
    assert code == 0 and result["ok"], result

    code, result = _audit(capsys, log, signer, *audit_state)
    assert code == 1 and not result["complete"]
    assert result["findings"][0]["kind"] == "rollback"
    assert result["findings"][0]["message"] == ("rollback: this auditor saw the signed "
                                                "checkpoint of size 40; the log's newest is 35")
    code, result = _fsck(capsys, log, signer, *fsck_state)
    assert code == 1 and not result["ok"]
    assert result["findings"][0]["kind"] == "rollback"
    assert result["findings"][0]["where"] == "checkpoint 40"

