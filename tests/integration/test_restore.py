"""Restore: a log database rebuilt from its published tiles, proven against the
witnessed checkpoint (and any trusted one kept elsewhere) before it may be served."""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit_cli.main import main
from ledger.checkpoint import Checkpoint, NoteSigner
from ledger.cosignature import Cosigner
from ledger.publish.directory import DirectorySink
from ledger.publish.worker import open_sink, publish_latest
from ledger.store.sql import SqlLedger
from tests.integration.conftest import ORIGIN
from tests.records import make_record
from tests.s3_server import s3_client, s3_server

COUNT = 300
BASE = datetime(2026, 11, 3, 8, 0, 0)


@pytest.fixture()
def witness() -> Cosigner:
    return Cosigner("witness.test", Ed25519PrivateKey.generate())


@pytest.fixture()
def published(ledger_url: str, signer: NoteSigner, witness: Cosigner, tmp_path: Path
              ) -> tuple[Path, bytes]:
    """A log of 300 records sealed at 200 and 300, 300 cosigned, published to a folder;
    returns the folder and the note of 200 (kept elsewhere, e.g. anchored)."""
    with SqlLedger(ledger_url) as ledger:
        for i in range(COUNT):
            stamp = (BASE + timedelta(seconds=i)).strftime("%Y-%m-%dT%H:%M:%S.000Z")
            ledger.append(make_record(i, tenant=f"bank-{i % 3}", created_at=stamp))
            if i + 1 == 200:
                early = ledger.seal_checkpoint(signer, ORIGIN)
        sealed = ledger.seal_checkpoint(signer, ORIGIN)
        assert early is not None and sealed is not None
        body = Checkpoint.peek(sealed.note).body()
        line = witness.cosign(body, 1_790_000_000)
        ledger.cosignatures.store(COUNT, witness.name, line, 1_790_000_000)
        publish_latest(ledger, DirectorySink(tmp_path / "tlog"))
    return tmp_path / "tlog", early.note


def _restore(capsys: pytest.CaptureFixture[str], source: str, url: str, signer: NoteSigner,
             *extra: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["restore", "--from", source, "--db", url, "--log-key",
                 signer.verifier().encode(), *extra])
    out, err = capsys.readouterr()
    return code, out, err


def _rows(url: str) -> list[tuple[Any, ...]]:
    with SqlLedger(url) as ledger:
        return [(r.leaf_index, r.record_id, r.created_at, r.tenant, r.canonical,
                 dict(r.columns)) for r in ledger.iter_records()]


def test_restore_rebuilds_the_log_and_mirror_proven_by_the_witness(
        ledger_url: str, published: Any, signer: NoteSigner, witness: Cosigner,
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder, early = published
    (tmp_path / "anchored.note").write_bytes(early)
    url = f"sqlite:///{tmp_path / 'restored.db'}"
    code, out, err = _restore(capsys, str(folder), url, signer, "--witness",
                              witness.witness_key.encode(), "--checkpoint",
                              str(tmp_path / "anchored.note"))
    assert code == 0, err
    assert "restored 300 leaves" in out and "trusted checkpoints 200" in out
    with SqlLedger(url) as restored, SqlLedger(ledger_url) as original:
        assert restored.tree_head() == original.tree_head()
        assert restored.latest_checkpoint().note == original.latest_checkpoint().note
        assert restored.log_meta().origin == ORIGIN
    assert [r[:5] for r in _rows(url)] == [r[:5] for r in _rows(ledger_url)]
    # The rebuilt database passes fsck against the pinned key.
    capsys.readouterr()
    assert main(["log", "--db", url, "--log-key", signer.verifier().encode(), "--no-state",
                 "fsck"]) == 0, capsys.readouterr()


def test_a_restore_that_cannot_prove_the_log_leaves_nothing_to_serve(
        published: Any, signer: NoteSigner, witness: Cosigner, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    folder, _ = published
    target = tmp_path / "restored.db"
    url = f"sqlite:///{target}"
    # A trusted checkpoint the tiles do not reach is named.
    longer = signer.sign_checkpoint(Checkpoint(ORIGIN, 400, b"\x01" * 32))
    (tmp_path / "longer.note").write_bytes(longer)
    code, _, err = _restore(capsys, str(folder), url, signer, "--checkpoint",
                            str(tmp_path / "longer.note"))
    assert code == 1 and "trusted checkpoint of size 400: the published tiles end at " \
                         "300" in err
    # Unwitnessed and nothing else vouching: refused.
    code, _, err = _restore(capsys, str(folder), url, signer)
    assert code == 1 and "nothing vouches for the published checkpoint" in err
    # One published leaf rewritten: the rebuilt root is not the signed one.
    bundle = folder / "tile/entries/000"
    data = bytearray(bundle.read_bytes())
    at = data.index(b"bank-1")
    data[at:at + 6] = b"bank-9"
    os.chmod(bundle, 0o644)
    bundle.write_bytes(bytes(data))
    code, _, err = _restore(capsys, str(folder), url, signer, "--witness",
                            witness.witness_key.encode())
    assert code == 1 and "root mismatch" in err
    assert not target.exists()  # no database for a service to start on


def test_restore_from_a_bucket(ledger_url: str, signer: NoteSigner, witness: Cosigner,
                               tmp_path: Path, capsys: pytest.CaptureFixture[str],
                               monkeypatch: pytest.MonkeyPatch) -> None:
    with SqlLedger(ledger_url) as ledger:
        for i in range(20):
            ledger.append(make_record(i))
        sealed = ledger.seal_checkpoint(signer, ORIGIN)
        assert sealed is not None
        with s3_server(tmp_path) as endpoint:
            for name, value in (("AWS_ENDPOINT_URL", endpoint), ("AWS_REGION", "us-east-1"),
                                ("AWS_ACCESS_KEY_ID", "test"),
                                ("AWS_SECRET_ACCESS_KEY", "test")):
                monkeypatch.setenv(name, value)
            s3_client(endpoint).create_bucket(Bucket="backup", ObjectLockEnabledForBucket=True)
            publish_latest(ledger, open_sink("s3://backup/log", 1))
            state = tmp_path / "seen.note"  # a verifier's state file: a trusted checkpoint
            state.write_bytes(sealed.note)
            url = f"sqlite:///{tmp_path / 'restored.db'}"
            code, out, err = _restore(capsys, "s3://backup/log", url, signer, "--json",
                                      "--checkpoint", str(state))
    assert code == 0, err
    assert json.loads(out) == {"restored_size": 20, "root": sealed.root.hex(),
                               "proven_against": [20]}


@pytest.fixture()
def mixed(signer: NoteSigner, witness: Cosigner, tmp_path: Path) -> tuple[str, Path]:
    """A log of 40 v1 records then 560 v2 leaves (two environments, two tenants),
    appended by the writer, sealed, cosigned and published with its bodies."""
    from tests.mixed_log import append_all, mixed_leaves, seal_cosigned

    url = f"sqlite:///{tmp_path / 'mixed.db'}"
    append_all(url, mixed_leaves(ORIGIN, 600, lambda i: BASE + timedelta(seconds=i), v1=40,
                                 switch=300))
    with SqlLedger(url) as ledger:
        seal_cosigned(ledger, ORIGIN, signer, witness, 600)
        publish_latest(ledger, DirectorySink(tmp_path / "tlog"))
    return url, tmp_path / "tlog"


def _bodies_and_environments(url: str) -> tuple[list[Any], list[Any]]:
    from sqlalchemy import text

    with SqlLedger(url) as ledger, ledger.engine.connect() as conn:
        bodies = conn.execute(text("SELECT leaf_index, body, environment_index FROM records "
                                   "ORDER BY leaf_index")).all()
        envs = conn.execute(text("SELECT * FROM environments ORDER BY leaf_index")).all()
    return [tuple(r) for r in bodies], [tuple(r) for r in envs]


def test_restore_of_a_mixed_v1_v2_log_rebuilds_bodies_environments_and_mirror(
        mixed: tuple[str, Path], signer: NoteSigner, witness: Cosigner, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    source, folder = mixed
    url = f"sqlite:///{tmp_path / 'restored.db'}"
    code, out, err = _restore(capsys, str(folder), url, signer, "--witness",
                              witness.witness_key.encode())
    assert code == 0, err
    assert "restored 600 leaves" in out
    assert _rows(url) == _rows(source)  # the mirror: v2 rows' columns via environments
    bodies, envs = _bodies_and_environments(url)
    assert (bodies, envs) == _bodies_and_environments(source)
    assert [e[0] for e in envs] == [40, 300] and bodies[41][2] == 40
    with SqlLedger(url) as restored:
        from tests.mixed_log import MODEL_B
        found, _ = restored.mirror.query(model_digest=MODEL_B, limit=1000)
        assert sorted(r.leaf_index for r in found) == list(range(301, 600))
    capsys.readouterr()
    assert main(["log", "--db", url, "--log-key", signer.verifier().encode(), "--no-state",
                 "fsck"]) == 0, capsys.readouterr()


def test_restore_of_v2_leaves_names_the_body_file_it_lacks(
        mixed: tuple[str, Path], signer: NoteSigner, witness: Cosigner, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    from ledger.leaves.envelope import tenant_tag

    _, folder = mixed
    missing = f"bodies/{tenant_tag(ORIGIN, 'bank-b')[len('sha256:'):]}/001"
    (folder / missing).unlink()
    url = f"sqlite:///{tmp_path / 'r.db'}"
    code, _, err = _restore(capsys, str(folder), url, signer, "--witness",
                            witness.witness_key.encode())
    assert code == 1 and f"{missing} is not published: the bodies of leaves 257.. cannot " \
                         "be restored" in err
    assert not (tmp_path / "r.db").exists()
