"""Restore reads a batch's usual v2 records through the batch's layout (decision 0060):
a leaf planted in the published tiles is refused, or let through, exactly as the full
path (``open_row`` without layouts) does, with the same error."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit_cli.main import main
from ledger import body_bundles, tiles
from ledger.audit import open_row
from ledger.checkpoint import NoteSigner
from ledger.cosignature import Cosigner
from ledger.errors import LedgerError
from ledger.leaves import kinds
from ledger.leaves.commitments import row_commitments
from ledger.leaves.envelope import Leaf, envelope_bytes, tenant_tag
from ledger.leaves.record_v2 import RECORD_KIND, EnvironmentRef, build_record_v2, row_data
from ledger.publish.directory import DirectorySink
from ledger.publish.worker import publish_latest
from ledger.store import restore as restore_module
from ledger.store.sql import SqlLedger
from tests.integration.conftest import ORIGIN
from tests.mixed_log import DRIVER_A, MODEL_A, append_all, environment, seal_cosigned, stamp
from tests.vectors.make_leaf_vectors import INPUTS

BASE = datetime(2026, 11, 3, 8, 0, 0)
COUNT = 300
BATCH = 32
PLANTED = 201  # a bank-b record inside its batch: its layout was learnt before it


def _record(i: int, env: Leaf) -> Leaf:
    """Record ``i`` as the service writes it: batches of 32, each with its own id and
    time, sealed together (the first leaf, 0, is the environment)."""
    rec: dict[str, Any] = INPUTS["record"]
    batch, row = divmod(i - 1, BATCH)
    commitments = row_commitments(
        input_salt=bytes.fromhex(rec["input_salt"]), output_salt=bytes.fromhex(
            rec["output_salt"]), prompt=f"prompt {i}", input_ids=rec["input_ids"],
        output=f"output {i}", output_ids=rec["output_ids"])
    return build_record_v2(
        origin=ORIGIN, tenant="bank-b" if i % 2 else "bank-a", engine="engine-0",
        environment=EnvironmentRef(0, env.leaf_hash), commitments=commitments,
        data=row_data(input_token_count=5, output_token_count=2, truncated=False,
                      finish_reason="stop", rows=BATCH, padded_length=7,
                      padding_side="left", padding_count=2, generation=rec["generation"]),
        batch={"id": f"{batch:032x}", "size": BATCH, "row": row},
        timings_ms=rec["timings_ms"], gpu_sample=None,
        record_id=f"0192f0c0-0000-7000-8000-{i:012d}",
        created_at=stamp(BASE + timedelta(seconds=batch)))


@pytest.fixture(scope="module")
def log() -> tuple[list[Leaf], NoteSigner, Cosigner]:
    """An environment leaf, then v2 records in batches of 32; the keys that vouch."""
    env = environment(0, BASE, MODEL_A, DRIVER_A)
    leaves = [env, *(_record(i, env) for i in range(1, COUNT))]
    signer = NoteSigner(ORIGIN, Ed25519PrivateKey.generate())
    witness = Cosigner("witness.test", Ed25519PrivateKey.generate())
    return leaves, signer, witness


@pytest.fixture()
def published(log: tuple[list[Leaf], NoteSigner, Cosigner], tmp_path: Path) -> Path:
    leaves, signer, witness = log
    url = f"sqlite:///{tmp_path / 'source.db'}"
    append_all(url, list(leaves))
    with SqlLedger(url) as ledger:
        seal_cosigned(ledger, ORIGIN, signer, witness, COUNT)
        publish_latest(ledger, DirectorySink(tmp_path / "tlog"))
    return tmp_path / "tlog"


def _plant(folder: Path, leaf: int, entry: bytes, body: bytes) -> None:
    """Put ``entry`` and its ``body`` in place of leaf ``leaf`` in the published bundles
    (its tenant tag unchanged, so its body stays in the same body bundle)."""
    ref = tiles.TileRef(0, leaf // tiles.TILE_WIDTH, entries=True)
    path = folder / ref.path
    entries = tiles.decode_bundle(path.read_bytes(), tiles.TILE_WIDTH)
    position = leaf % tiles.TILE_WIDTH
    tag = body_bundles.envelope_tag(entries[position])
    assert body_bundles.envelope_tag(entry) == tag
    positions = body_bundles.tags_of(entries)[tag]
    body_path = folder / body_bundles.body_path(tag, ref)
    bodies = tiles.decode_bundle(body_path.read_bytes(), len(positions))
    bodies[positions.index(position)] = body
    entries[position] = entry
    path.write_bytes(tiles.encode_bundle(entries))
    body_path.write_bytes(tiles.encode_bundle(bodies))


def _sealed(leaf: Leaf, body: bytes, created_at: str | None = None) -> bytes:
    """The envelope the writer would make for ``body`` under ``leaf``'s tenant tag."""
    return envelope_bytes(RECORD_KIND, created_at or leaf.created_at,
                          tenant_tag(ORIGIN, leaf.content["tenant"]), body)


def _duplicated_key(leaf: Leaf) -> tuple[bytes, bytes]:
    body = leaf.body.replace(b'"tenant":"bank-b"', b'"tenant":"bank-a","tenant":"bank-b"')
    return _sealed(leaf, body), body


def _not_canonical(leaf: Leaf) -> tuple[bytes, bytes]:
    body = leaf.body.replace(b'"tenant":', b'"tenant": ')
    return _sealed(leaf, body), body


def _other_time(leaf: Leaf) -> tuple[bytes, bytes]:
    return _sealed(leaf, leaf.body, "2026-11-03T09:00:00.000Z"), leaf.body


def _other_tenant(leaf: Leaf) -> tuple[bytes, bytes]:
    body = leaf.body.replace(b'"tenant":"bank-b"', b'"tenant":"bank-c"')
    return _sealed(leaf, body), body


def _row_rule_broken(leaf: Leaf) -> tuple[bytes, bytes]:
    body = leaf.body.replace(b'"output_token_count":2', b'"output_token_count":-2')
    assert body != leaf.body
    return _sealed(leaf, body), body


def _envelope_spelt_otherwise(leaf: Leaf) -> tuple[bytes, bytes]:
    return leaf.canonical.replace(b'","kind":', b'", "kind":'), leaf.body


def _restore(capsys: pytest.CaptureFixture[str], folder: Path, url: str, signer: NoteSigner,
             witness: Cosigner) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["restore", "--from", str(folder), "--db", url, "--log-key",
                 signer.verifier().encode(), "--witness", witness.witness_key.encode()])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("plant", [_duplicated_key, _not_canonical, _other_time,
                                   _other_tenant, _row_rule_broken,
                                   _envelope_spelt_otherwise])
def test_a_planted_leaf_is_judged_as_the_full_path_judges_it(
        plant: Callable[[Leaf], tuple[bytes, bytes]], published: Path,
        log: tuple[list[Leaf], NoteSigner, Cosigner], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    leaves, signer, witness = log
    entry, body = plant(leaves[PLANTED])
    _plant(published, PLANTED, entry, body)
    try:  # the full path's verdict on the planted leaf alone
        open_row(entry, body, ORIGIN)
        refused = None
    except LedgerError as exc:
        refused = str(exc)
    code, err = _restore(capsys, published, f"sqlite:///{tmp_path / 'r.db'}", signer, witness)
    assert code == 1
    if refused is not None:
        assert f"leaf {PLANTED} is not a record this restore can mirror: {refused}" in err
    else:  # read as the full path reads it, then refused by the root it changed
        assert "is not a record this restore can mirror" not in err
        assert "root" in err.lower()
    assert not (tmp_path / "r.db").exists()


def test_restore_proves_the_usual_record_by_its_batch_layout(
        published: Path, log: tuple[list[Leaf], NoteSigner, Cosigner], tmp_path: Path,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a batch's first record (and the environment leaf) is parsed and checked
    in full; the others are read through the layout learnt from it."""
    _, signer, witness = log
    parsed: list[bytes] = []
    full = kinds.parse_strict

    def counted(data: bytes | str) -> object:
        parsed.append(data if isinstance(data, bytes) else data.encode())
        return full(data)

    monkeypatch.setattr(kinds, "parse_strict", counted)
    # one core: the records are parsed in this process, where they are counted
    monkeypatch.setattr(restore_module.os, "cpu_count", lambda: 1)
    code, err = _restore(capsys, published, f"sqlite:///{tmp_path / 'r.db'}", signer, witness)
    assert code == 0, err
    batches = (COUNT - 1 + BATCH - 1) // BATCH
    assert len(parsed) == 1 + batches  # the environment leaf and each batch's first record
