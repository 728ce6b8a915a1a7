"""Continuity (decision 0027): a v1 log goes on with v2 leaves, nothing rewritten.

The golden v1 files (``tests/vectors/v1_*``, recipe in ``make_v1_golden.py``) were made
by the code before record v2. Their bundle and database verify as they are; a copy of
the database, migrated, takes an environment leaf and v2 records after its v1 leaves,
and the mixed log passes ``verify`` (every leaf, from the database and from a bundle),
``audit`` and ``log fsck``, while a tampered body or environment row is caught.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import text

from ledger.anchor.local import LocalAnchor
from ledger.checkpoint import NoteSigner
from ledger.content_records import access_body, erasure_body
from ledger.leaves.body_codec import pack_body
from ledger.leaves.commitments import INPUT, commit, row_commitments
from ledger.leaves.content_leaves import build_access, build_erasure
from ledger.leaves.envelope import Leaf
from ledger.leaves.environment import build_environment
from ledger.leaves.record_v2 import EnvironmentRef, build_record_v2, row_data
from ledger.leaves.report import build_report
from ledger.leaves.stream_start import build_stream_start_v2
from ledger.record import AuditRecord, new_record_id, utc_timestamp
from ledger.report_record import report_body
from ledger.store.migrate import upgrade
from ledger.store.sql import SqlLedger
from tests.cli_runs import cli_json

VECTORS = Path(__file__).resolve().parents[1] / "vectors"
META = json.loads((VECTORS / "v1_log.json").read_text())
ORIGIN, KEY = META["origin"], META["verifier_key"]
SEED = bytes(range(32))  # the golden log's test-only key (make_vectors.SEED)
TRUST = ("--log-key", KEY, "--accept-self-anchored")


@pytest.fixture(autouse=True)
def verifier_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUDIT_LEDGER_HOME", str(tmp_path / "home"))


def test_the_golden_v1_bundle_verifies(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = cli_json(capsys, "verify", "--bundle", str(VECTORS / "v1_bundle.json"), *TRUST)
    assert code == 0, out
    assert (out["verified"], out["failed"]) == (5, 0)
    first = META["records"][0]
    code, out = cli_json(capsys, "verify", first["record_id"], "--bundle",
                    str(VECTORS / "v1_bundle.json"), *TRUST, "--prompt", first["prompt"],
                    "--input-salt", META["salt"], "--output", first["output"],
                    "--output-salt", META["salt"])
    assert code == 0, out
    assert out["checks"][4]["status"] == "pass" and "environment" not in out


def _v2_leaves(environment_index: int, environment: Leaf) -> list[tuple[Leaf, str]]:
    """Three v2 records naming the environment; with each its prompt."""
    salt = bytes(range(200, 232))
    out = []
    for row, (tenant, prompt) in enumerate([("acme", "v2 one"), ("globex", "v2 two"),
                                             ("acme", "v2 three")]):
        leaf = build_record_v2(
            origin=ORIGIN, tenant=tenant, engine="engine-0",
            environment=EnvironmentRef(environment_index, environment.leaf_hash),
            commitments=row_commitments(input_salt=salt, output_salt=salt, prompt=prompt,
                                        input_ids=[1, 2], output="ok", output_ids=[3]),
            data=row_data(input_token_count=2, output_token_count=1, truncated=False,
                          finish_reason="stop", rows=3, padded_length=2,
                          padding_side="left", padding_count=0,
                          generation={"max_new_tokens": 4, "temperature": 0.0}),
            batch={"id": "c" * 32, "size": 3, "row": row}, timings_ms={"forward": 3.0})
        out.append((leaf, prompt))
    return out


def _environment() -> Leaf:
    return build_environment(
        engine="engine-0", model={"name": "tiny-llama", "digest": "sha256:" + "cd" * 32,
                                  "pinned": True},
        hardware={"accelerator": "cuda", "accelerator_model": "NVIDIA H200",
                  "driver_version": "560.35.03"},
        software={"torch": {"version": "2.6.0", "git_version": "e" * 40},
                  "service": {"git_revision": "f" * 40, "dirty": False}},
        tokenization_contract={"tokenizer_digest": "sha256:" + "01" * 32},
        generation_config_digest="sha256:" + "02" * 32)


@pytest.fixture()
def mixed_log(tmp_path: Path) -> tuple[str, list[tuple[Leaf, str]]]:
    """The golden v1 database, migrated, with an environment and three v2 records after
    its five v1 leaves, sealed and anchored at size 9."""
    shutil.copy(VECTORS / "v1_log.sqlite", tmp_path / "log.sqlite")
    url = f"sqlite:///{tmp_path / 'log.sqlite'}"
    upgrade(url)
    signer = NoteSigner(ORIGIN, Ed25519PrivateKey.from_private_bytes(SEED))
    with SqlLedger(url).start() as ledger:
        environment = _environment()
        receipt = ledger.append(environment)
        assert receipt.leaf_index == META["size"]  # after the v1 history, none rewritten
        records = _v2_leaves(receipt.leaf_index, environment)
        for leaf, _ in records:
            ledger.append(leaf)
        ledger.seal_checkpoint(signer, ORIGIN)
        LocalAnchor(ledger, signer.verifier(), ORIGIN).anchor(ledger.latest_checkpoint().note)  # type: ignore[union-attr]
    return url, records


def test_the_golden_v1_database_verifies_audits_and_fscks_after_migration(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copy(VECTORS / "v1_log.sqlite", tmp_path / "log.sqlite")
    url = f"sqlite:///{tmp_path / 'log.sqlite'}"
    upgrade(url)
    for record in META["records"]:
        code, out = cli_json(capsys, "verify", record["record_id"], "--db", url, *TRUST)
        assert code == 0, out
    code, out = cli_json(capsys, "audit", "--db", url, "--from", "2000-01-01T00:00:00Z",
                    "--to", "2100-01-01T00:00:00Z", "--log-key", KEY)
    assert code == 0 and out["complete"] and out["rows_checked"] == 5, out
    code, out = cli_json(capsys, "log", "fsck", "--db", url, "--log-key", KEY)
    assert code == 0 and out["ok"] and out["records_checked"] == 5, out


def test_a_mixed_v1_v2_log_verifies_audits_and_fscks(
        mixed_log: tuple[str, list[tuple[Leaf, str]]], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    url, records = mixed_log
    for record in META["records"]:  # the v1 history still verifies at the new size
        code, out = cli_json(capsys, "verify", record["record_id"], "--db", url, *TRUST)
        assert code == 0 and out["tree_size"] == 9, out
    for leaf, prompt in records:
        code, out = cli_json(capsys, "verify", leaf.record_id, "--db", url, *TRUST,
                        "--prompt", prompt, "--input-salt", bytes(range(200, 232)).hex(),
                        "--output", "ok", "--output-salt", bytes(range(200, 232)).hex())
        assert code == 0, out
        assert [c["status"] for c in out["checks"]] == [
            "pass", "pass", "pass", "self-anchored", "pass"]
        assert "environment leaf" in out["checks"][0]["reason"]
        assert "environment leaf 5" in out["checks"][1]["reason"]
        assert out["environment"]["accelerator_model"] == "NVIDIA H200"
        assert out["environment"]["torch_version"] == "2.6.0"
    code, out = cli_json(capsys, "audit", "--db", url, "--from", "2000-01-01T00:00:00Z",
                    "--to", "2100-01-01T00:00:00Z", "--log-key", KEY)
    assert code == 0 and out["complete"] and out["rows_checked"] == 9, out
    code, out = cli_json(capsys, "log", "fsck", "--db", url, "--log-key", KEY)
    assert code == 0 and out["ok"] and out["records_checked"] == 9, out

    # A bundle of the mixed log carries the environment leaf once and verifies offline.
    bundle = tmp_path / "mixed.json"
    code, out = cli_json(capsys, "export", "--db", url, "--bundle", str(bundle))
    assert code == 0, out
    written = json.loads(bundle.read_text())
    assert list(written["environments"]) == ["5"]
    assert sum("body" in e for e in written["entries"]) == 4  # the environment and 3 records
    code, out = cli_json(capsys, "verify", "--bundle", str(bundle), *TRUST, "--no-state")
    assert code == 0 and (out["verified"], out["failed"]) == (9, 0), out

    # The mirror answers filters through the environment: v1 rows by their own columns.
    with SqlLedger(url) as ledger:
        h200, _ = ledger.mirror.query(accelerator_model="NVIDIA H200")
        assert sorted(r.record_id for r in h200) == sorted(leaf.record_id for leaf, _ in records)
        assert all(r.columns["torch_version"] == "2.6.0" for r in h200)
        acme, _ = ledger.mirror.query(tenant="acme", model_digest="sha256:" + "cd" * 32)
        assert len(acme) == 2
        v1_rows, _ = ledger.mirror.query(model_digest="sha256:" + "ab" * 32)
        assert len(v1_rows) == 5


def test_a_changed_v2_body_fails_verify_audit_and_fsck(
        mixed_log: tuple[str, list[tuple[Leaf, str]]],
        capsys: pytest.CaptureFixture[str]) -> None:
    url, records = mixed_log
    leaf = records[0][0]
    forged = leaf.body.replace(b'"input_token_count":2', b'"input_token_count":3')
    with SqlLedger(url) as ledger, ledger.engine.begin() as conn:
        conn.execute(text("UPDATE records SET body = :b WHERE record_id = :r"),
                     {"b": pack_body(forged), "r": leaf.record_id})
    code, out = cli_json(capsys, "verify", leaf.record_id, "--db", url, *TRUST)
    assert code == 1 and out["failed_check"] == 1
    assert "LeafBindingError: the body hashes to" in out["checks"][0]["reason"]
    code, out = cli_json(capsys, "audit", "--db", url, "--from", "2000-01-01T00:00:00Z",
                    "--to", "2100-01-01T00:00:00Z", "--log-key", KEY)
    assert code == 1 and [f["kind"] for f in out["findings"]] == ["record_unparseable"]
    code, out = cli_json(capsys, "log", "fsck", "--db", url, "--log-key", KEY)
    assert code == 1 and [f["kind"] for f in out["findings"]] == ["record_unparseable"]


def test_a_changed_environment_row_fails_audit_and_a_swapped_environment_fails_verify(
        mixed_log: tuple[str, list[tuple[Leaf, str]]],
        capsys: pytest.CaptureFixture[str]) -> None:
    url, records = mixed_log
    with SqlLedger(url) as ledger, ledger.engine.begin() as conn:
        conn.execute(text("UPDATE environments SET accelerator_model = 'NVIDIA A100'"))
    code, out = cli_json(capsys, "audit", "--db", url, "--from", "2000-01-01T00:00:00Z",
                    "--to", "2100-01-01T00:00:00Z", "--log-key", KEY)
    assert code == 1
    assert [(f["kind"], f["column"]) for f in out["findings"]] == [
        ("environment_mismatch", "accelerator_model")]
    # Another environment's bytes in place of the named one's: check 1 names it.
    other = build_environment(**{**{k: v for k, v in _environment().content.items()
                                    if k not in ("schema", "record_id", "created_at")},
                                 "hardware": {"accelerator": "cuda",
                                              "accelerator_model": "NVIDIA A100"}})
    with SqlLedger(url) as ledger, ledger.engine.begin() as conn:
        conn.execute(text("UPDATE records SET canonical = :c, body = :b WHERE leaf_index = 5"),
                     {"c": other.envelope, "b": pack_body(other.body)})
    code, out = cli_json(capsys, "verify", records[0][0].record_id, "--db", url, *TRUST)
    assert code == 1 and out["failed_check"] == 1
    assert "the environment leaf hashes to" in out["checks"][0]["reason"]



def test_fsck_finds_a_record_naming_one_environment_index_and_another_hash(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Leaf 5 is the engine's declared environment, leaf 6 another one; the record names
    # index 5 but leaf 6's hash: each row alone is well formed, only the pair is wrong.
    shutil.copy(VECTORS / "v1_log.sqlite", tmp_path / "log.sqlite")
    url = f"sqlite:///{tmp_path / 'log.sqlite'}"
    upgrade(url)
    signer = NoteSigner(ORIGIN, Ed25519PrivateKey.from_private_bytes(SEED))
    declared = _environment()
    other = build_environment(**{**{k: v for k, v in declared.content.items()
                                    if k not in ("schema", "record_id", "created_at")},
                                 "hardware": {"accelerator": "cuda",
                                              "accelerator_model": "NVIDIA A100"}})
    with SqlLedger(url).start() as ledger:
        index = ledger.append(declared).leaf_index
        ledger.append(other)
        (honest, _), = _v2_leaves(index, declared)[:1]
        ledger.append(honest)
        (forged, _), = _v2_leaves(index, other)[1:2]
        forged_index = ledger.append(forged).leaf_index
        ledger.seal_checkpoint(signer, ORIGIN)
    code, out = cli_json(capsys, "log", "fsck", "--db", url, "--log-key", KEY, "--no-state")
    assert code == 1
    assert [(f["kind"], f["where"]) for f in out["findings"]] == [
        ("environment_mismatch", f"leaf {forged_index} (record {forged.record_id})")]
    assert f"the record names leaf {index} as its environment" in out["findings"][0]["detail"]


def _v1_leaves_of_every_other_kind() -> list[AuditRecord]:
    """An access, an erasure and a report leaf as the code before decision 0043 wrote
    them (the golden log holds v1 records and a v1 stream start already)."""
    ids = [record["record_id"] for record in META["records"]]
    return [
        AuditRecord.from_body(access_body(
            leaf_id=new_record_id(), created_at=utc_timestamp(), record_id=ids[0],
            record_tenant="acme", key_id="key-auditor-1", role="auditor",
            key_tenant="audit-firm", purpose="v1 era review", channel="cli")),
        AuditRecord.from_body(erasure_body(
            leaf_id=new_record_id(), created_at=utc_timestamp(), tenant="acme",
            records=ids[:2], reason="request", selector="records", requested_by="cli:dpo")),
        AuditRecord.from_body(report_body(
            leaf_id=new_record_id(), created_at=utc_timestamp(), digest="sha256:" + "1" * 64,
            since="2026-01-01T00:00:00.000Z", until="2026-02-01T00:00:00.000Z",
            scope_tenant=None, made_by="v1 officer")),
    ]


def _v2_leaves_of_every_other_kind(environment_index: int, environment: Leaf,
                                   record: Leaf) -> list[Leaf]:
    salt = bytes(range(200, 232))
    return [
        build_stream_start_v2(
            origin=ORIGIN, tenant="acme", engine="engine-0",
            environment=EnvironmentRef(environment_index, environment.leaf_hash),
            commitments={INPUT: commit(salt, INPUT, b"v2 streamed")},
            generation={"max_new_tokens": 4, "temperature": 0.0}, route="/v1/completions"),
        build_access(origin=ORIGIN, record_id=record.record_id, record_tenant="acme",
                     key_id="key-auditor-1", role="auditor", key_tenant="audit-firm",
                     purpose="v2 era review", channel="http", leaf_id=new_record_id(),
                     created_at=utc_timestamp()),
        build_erasure(origin=ORIGIN, tenant="acme", records=[record.record_id],
                      reason="request", selector="subject", requested_by="cli:dpo",
                      leaf_id=new_record_id(), created_at=utc_timestamp()),
        build_report(origin=ORIGIN, digest="sha256:" + "2" * 64,
                     since="2026-11-01T00:00:00.000Z", until="2026-12-01T00:00:00.000Z",
                     scope_tenant="acme", made_by="v2 officer", file="report.html",
                     leaf_id=new_record_id(), created_at=utc_timestamp()),
    ]


def test_a_log_mixing_v1_and_v2_leaves_of_every_kind_verifies_audits_and_fscks(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copy(VECTORS / "v1_log.sqlite", tmp_path / "log.sqlite")
    url = f"sqlite:///{tmp_path / 'log.sqlite'}"
    upgrade(url)
    signer = NoteSigner(ORIGIN, Ed25519PrivateKey.from_private_bytes(SEED))
    with SqlLedger(url).start() as ledger:
        for old in _v1_leaves_of_every_other_kind():  # appended before the upgrade
            ledger.append(old)
        environment = _environment()
        index = ledger.append(environment).leaf_index
        (record, prompt), = _v2_leaves(index, environment)[:1]
        ledger.append(record)
        new = _v2_leaves_of_every_other_kind(index, environment, record)
        for leaf in new:
            ledger.append(leaf)
        ledger.seal_checkpoint(signer, ORIGIN)
        LocalAnchor(ledger, signer.verifier(), ORIGIN).anchor(ledger.latest_checkpoint().note)  # type: ignore[union-attr]
        rows = [ledger.record_at(i) for i in range(ledger.tree_head()[0])]
    size = len(rows)
    kinds = [json.loads(row.leaf_body)["schema"] for row in rows if row is not None]
    assert sorted(set(kinds)) == sorted({
        "audit-record/v1", "audit-stream-start/v1", "access-record/v1", "erasure-record/v1",
        "report-record/v1", "environment/v1", "audit-record/v2", "audit-stream-start/v2",
        "access-record/v2", "erasure-record/v2", "report-record/v2"})
    for row in rows:  # every leaf, each by its own format
        assert row is not None
        code, out = cli_json(capsys, "verify", row.record_id, "--db", url, *TRUST)
        assert code == 0 and out["tree_size"] == size, (row.record_id, out)
    start = new[0]
    salt = bytes(range(200, 232)).hex()
    code, out = cli_json(capsys, "verify", start.record_id, "--db", url, *TRUST,
                         "--prompt", "v2 streamed", "--input-salt", salt)
    assert code == 0 and out["checks"][4]["status"] == "pass", out
    assert f"environment leaf {index}" in out["checks"][1]["reason"]  # proved with it
    assert out["environment"]["accelerator_model"] == "NVIDIA H200"
    code, out = cli_json(capsys, "audit", "--db", url, "--from", "2000-01-01T00:00:00Z",
                         "--to", "2100-01-01T00:00:00Z", "--log-key", KEY)
    assert code == 0 and out["complete"] and out["rows_checked"] == size, out
    code, out = cli_json(capsys, "log", "fsck", "--db", url, "--log-key", KEY)
    assert code == 0 and out["ok"] and out["records_checked"] == size, out
    bundle = tmp_path / "every-kind.json"
    code, out = cli_json(capsys, "export", "--db", url, "--bundle", str(bundle))
    assert code == 0, out
    code, out = cli_json(capsys, "verify", "--bundle", str(bundle), *TRUST, "--no-state")
    assert code == 0 and (out["verified"], out["failed"]) == (size, 0), out


def test_a_stream_start_naming_another_environment_fails_verify_and_fsck(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copy(VECTORS / "v1_log.sqlite", tmp_path / "log.sqlite")
    url = f"sqlite:///{tmp_path / 'log.sqlite'}"
    upgrade(url)
    signer = NoteSigner(ORIGIN, Ed25519PrivateKey.from_private_bytes(SEED))
    declared = _environment()
    with SqlLedger(url).start() as ledger:
        index = ledger.append(declared).leaf_index
        (record, _), = _v2_leaves(index, declared)[:1]
        ledger.append(record)
        # Names the v1 leaf before the environment (index 4), with the environment's hash.
        start = _v2_leaves_of_every_other_kind(index - 1, declared, record)[0]
        ledger.append(start)
        ledger.seal_checkpoint(signer, ORIGIN)
        LocalAnchor(ledger, signer.verifier(), ORIGIN).anchor(ledger.latest_checkpoint().note)  # type: ignore[union-attr]
    code, out = cli_json(capsys, "verify", start.record_id, "--db", url, *TRUST)
    assert code == 1 and out["failed_check"] == 1, out
    assert "names environment leaf 4 and the source gave none" in out["checks"][0]["reason"]
    code, out = cli_json(capsys, "log", "fsck", "--db", url, "--log-key", KEY, "--no-state")
    assert code == 1
    assert [f["kind"] for f in out["findings"]] == ["environment_mismatch"]
