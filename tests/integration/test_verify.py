"""The verification CLI against a real service, a database, bundles and lying servers."""

from __future__ import annotations

import asyncio
import base64
import copy
import hashlib
import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import create_engine, delete, insert, update

from audit_cli.main import main
from inference_wrapper.server.app import (
    ANCHOR_WORKER,
    KEYS,
    LEDGER,
    SETTINGS,
    SIGNER,
    create_app,
)
from inference_wrapper.server.settings import Settings
from ledger.canonical import canonical_bytes
from ledger.checkpoint import Checkpoint, NoteSigner
from ledger.cosignature import add_cosignatures
from ledger.leaves.body_codec import pack_body, unpack_body
from ledger.leaves.envelope import tenant_tag
from ledger.store.schema import records
from ledger.store.sql import SqlLedger
from tests.records import make_record
from tests.simulator import witnesses

PROMPT = "Approve the loan for applicant 42?"
# The embedded local anchor is the operator's own: verifying against it is an explicit choice.
SELF = ("--accept-self-anchored",)


class Service:
    def __init__(self, client: Any, token: str, auditor: str, settings: Settings) -> None:
        self.client, self.token, self.auditor, self.settings = client, token, auditor, settings
        app = client.server.app
        self.app = app
        self.log_key = app[SIGNER].verifier().encode()
        self.url = str(client.make_url("")).rstrip("/")

    async def generate(self, prompt: str = PROMPT) -> dict[str, Any]:
        response = await self.client.post(
            "/v1/generate", json={"prompt": prompt, "max_new_tokens": 6},
            headers={"Authorization": f"Bearer {self.token}"})
        assert response.status == 200
        return dict(await response.json())

    def seal(self) -> None:
        app = self.app
        app[LEDGER].seal_checkpoint(app[SIGNER], app[SETTINGS].origin)
        app[ANCHOR_WORKER].run_once()


@pytest.fixture()
async def service(aiohttp_client: Any, tmp_path: Path, tiny_generator: Any,
                  monkeypatch: pytest.MonkeyPatch) -> Service:
    monkeypatch.setenv("AUDIT_LEDGER_HOME", str(tmp_path / "home"))
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'ledger.db'}",
                        log_key_path=tmp_path / "log.key", max_wait_ms=5.0,
                        checkpoint_interval_s=3600, anchor_interval_s=3600)
    app = create_app(settings, tiny_generator)
    client = await aiohttp_client(app)
    token = app[KEYS].create("bank-a", "client")[0]
    auditor = app[KEYS].create("audit-firm", "auditor")[0]
    return Service(client, token, auditor, settings)


async def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any]:
    capsys.readouterr()
    code = await asyncio.to_thread(main, list(argv))
    captured = capsys.readouterr()
    try:
        return code, json.loads(captured.out)
    except ValueError:
        return code, captured.out + captured.err


def failed_check(result: dict[str, Any]) -> int | None:
    return result["failed_check"]  # type: ignore[no-any-return]


async def test_genuine_record_verifies_online_with_prompt_and_output(
    service: Service, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    answer = await service.generate()
    service.seal()
    (tmp_path / "prompt.txt").write_text(PROMPT)
    (tmp_path / "output.txt").write_text(answer["output"])
    code, result = await cli(
        capsys, "verify", answer["record_id"], "--server", service.url, "--api-key", service.token,
        "--log-key", service.log_key, *SELF, "--prompt-file", str(tmp_path / "prompt.txt"),
        "--input-salt", answer["input_salt"], "--output-file", str(tmp_path / "output.txt"),
        "--output-salt", answer["output_salt"], "--json")
    assert code == 0, result
    assert [c["status"] for c in result["checks"]] == ["pass"] * 3 + ["self-anchored", "pass"]
    assert "local:" in result["checks"][3]["reason"] and result["trust"] == "self-anchored"
    state = list((tmp_path / "home" / "verifier").glob("*.note"))
    # Size 2: the engine's environment leaf (index 0) and the record.
    assert len(state) == 1 and b"\n2\n" in state[0].read_bytes()
    assert result["environment"]["model_name"] == "tiny-llama", result
    assert "environment leaf 0" in result["checks"][1]["reason"]


async def test_genuine_record_verifies_from_the_database(
    service: Service, capsys: pytest.CaptureFixture[str]
) -> None:
    answer = await service.generate()
    service.seal()
    code, result = await cli(capsys, "verify", answer["record_id"], "--db",
                             service.settings.database_url, "--log-key", service.log_key, *SELF,
                             "--json")
    assert code == 0 and result["verified"], result


async def test_bundle_verifies_offline_and_names_each_record(
    service: Service, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    answers = [await service.generate(f"prompt {i}") for i in range(5)]
    service.seal()
    bundle = tmp_path / "evidence.json"
    code, _ = await cli(capsys, "export", "--server", service.url, "--api-key", service.auditor,
                        "--bundle", str(bundle))
    assert code == 0
    code, result = await cli(capsys, "verify", "--bundle", str(bundle), "--log-key",
                             service.log_key, *SELF, "--json")
    # The auditor's bundle holds every leaf: the environment leaf and the five records.
    assert code == 0 and result["verified"] == 6 and result["failed"] == 0
    assert len(json.loads(bundle.read_text())["environments"]) == 1
    db_bundle = tmp_path / "db.json"
    code, _ = await cli(capsys, "export", "--db", service.settings.database_url, "--bundle",
                        str(db_bundle))
    code, one = await cli(capsys, "verify", answers[2]["record_id"], "--bundle", str(db_bundle),
                          "--log-key", service.log_key, *SELF, "--json")
    assert code == 0 and one["verified"]


async def test_two_evidence_sources_at_once_are_a_usage_error_naming_both(
    service: Service, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    answer = await service.generate()
    service.seal()
    bundle = tmp_path / "evidence.json"
    db = service.settings.database_url
    assert (await cli(capsys, "export", "--db", db, "--bundle", str(bundle)))[0] == 0
    key = ("--log-key", service.log_key, *SELF)
    assert (await cli(capsys, "verify", "--bundle", str(bundle), *key, "--json"))[0] == 0
    # Each source alone verifies; together, which one was meant is unknown.
    for extra in (("--server", service.url, "--api-key", service.auditor), ("--db", db)):
        code, result = await cli(capsys, "verify", answer["record_id"], "--bundle",
                                 str(bundle), *extra, *key, "--json")
        assert code == 2, result
        error = result["error"]
        assert error["exit_code"] == 2 and error["field"] in ("--server", "--db")
        assert extra[0] in error["message"] and "--bundle" in error["message"]
        code, text = await cli(capsys, "verify", "--bundle", str(bundle), *extra, *key)
        assert code == 2 and extra[0] in text and "--bundle" in text
    code, result = await cli(capsys, "verify", answer["record_id"], "--server", service.url,
                             "--api-key", service.auditor, "--db", db, *key, "--json")
    assert code == 2 and "--server" in result["error"]["message"]
    assert "--db" in result["error"]["message"]
    code, result = await cli(capsys, "query", "--server", service.url, "--api-key",
                             service.auditor, "--db", db, "--json")
    assert code == 2 and "--server" in result["error"]["message"]
    assert "--db" in result["error"]["message"]


async def test_one_changed_byte_in_the_record_fails_check_1(
    service: Service, capsys: pytest.CaptureFixture[str]
) -> None:
    answer = await service.generate()
    service.seal()
    engine = create_engine(service.settings.database_url)
    with engine.begin() as conn:
        row = conn.execute(records.select().where(records.c.record_id == answer["record_id"])).one()
        edited = unpack_body(bytes(row.body)).replace(b'"bank-a"', b'"bank-b"')
        conn.execute(update(records).where(records.c.record_id == answer["record_id"])
                     .values(body=pack_body(edited)))
    engine.dispose()
    code, result = await cli(capsys, "verify", answer["record_id"], "--db",
                             service.settings.database_url, "--log-key", service.log_key,
                             *SELF, "--json")
    assert code == 1 and failed_check(result) == 1
    assert "the body hashes to" in result["checks"][0]["reason"]
    # The envelope changed to match the changed body: it no longer hashes to the leaf.
    fields = json.loads(bytes(row.canonical))
    fields["body"] = "sha256:" + hashlib.sha256(edited).hexdigest()
    fields["tenant_tag"] = tenant_tag(service.app[SETTINGS].origin, "bank-b")
    engine = create_engine(service.settings.database_url)
    with engine.begin() as conn:
        conn.execute(update(records).where(records.c.record_id == answer["record_id"])
                     .values(canonical=canonical_bytes(fields)))
    engine.dispose()
    code, result = await cli(capsys, "verify", answer["record_id"], "--db",
                             service.settings.database_url, "--log-key", service.log_key,
                             *SELF, "--json")
    assert code == 1 and failed_check(result) == 1
    assert "the log holds" in result["checks"][0]["reason"]


@pytest.mark.parametrize("which", ["prompt", "salt"])
async def test_wrong_prompt_or_salt_fails_check_5(
    service: Service, tmp_path: Path, capsys: pytest.CaptureFixture[str], which: str
) -> None:
    answer = await service.generate()
    service.seal()
    prompt = PROMPT.replace("42", "43") if which == "prompt" else PROMPT
    salt = "00" * 32 if which == "salt" else answer["input_salt"]
    (tmp_path / "p.txt").write_text(prompt)
    code, result = await cli(capsys, "verify", answer["record_id"], "--db",
                             service.settings.database_url, "--log-key", service.log_key, *SELF,
                             "--prompt-file", str(tmp_path / "p.txt"), "--input-salt", salt,
                             "--json")
    assert code == 1 and failed_check(result) == 5
    assert "does not match input_commitment" in result["checks"][4]["reason"]


async def test_checkpoint_signed_by_another_key_fails_check_3(
    service: Service, capsys: pytest.CaptureFixture[str]
) -> None:
    answer = await service.generate()
    service.seal()
    other = NoteSigner(service.app[SETTINGS].origin, Ed25519PrivateKey.generate())
    code, result = await cli(capsys, "verify", answer["record_id"], "--db",
                             service.settings.database_url, "--log-key",
                             other.verifier().encode(), "--json")
    assert code == 1 and failed_check(result) == 3
    assert "no signature by key" in result["checks"][2]["reason"]


async def test_unreachable_server_exits_3(service: Service,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    code, _ = await cli(capsys, "verify", "some-id", "--server", "http://127.0.0.1:9",
                        "--api-key", "x", "--log-key", service.log_key, *SELF)
    assert code == 3


async def test_missing_log_key_is_a_usage_error(service: Service,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    code, _ = await cli(capsys, "verify", "some-id", "--db", service.settings.database_url)
    assert code == 2


# --- a lying server: genuine answers, one of them altered ------------------------------


async def lying_server(aiohttp_client: Any, service: Service, record_id: str,
                       lie: Callable[[dict[str, Any]], None]) -> str:
    headers = {"Authorization": f"Bearer {service.auditor}"}
    truth: dict[str, Any] = {}
    for key, path in (("record", f"/v1/records/{record_id}"),
                      ("proof", f"/v1/records/{record_id}/proof"),
                      ("anchored", "/v1/checkpoints/anchored")):
        truth[key] = await (await service.client.get(path, headers=headers)).json()
    anchored_size = truth["anchored"]["tree_size"]
    size = truth["proof"]["tree_size"]
    low, high = sorted((anchored_size, size))
    truth["consistency"] = await (await service.client.get(
        f"/v1/checkpoints/consistency?from={low}&to={high}", headers=headers)).json()
    answers = copy.deepcopy(truth)
    lie(answers)

    def serve(key: str) -> Callable[[web.Request], Any]:
        async def handler(request: web.Request) -> web.Response:
            return web.json_response(answers[key])
        return handler

    app = web.Application()
    app.router.add_get("/v1/records/{record_id}", serve("record"))
    app.router.add_get("/v1/records/{record_id}/proof", serve("proof"))
    app.router.add_get("/v1/checkpoints/anchored", serve("anchored"))
    app.router.add_get("/v1/checkpoints/consistency", serve("consistency"))
    client = await aiohttp_client(app)
    return str(client.make_url("")).rstrip("/")


async def _three_records(service: Service) -> list[dict[str, Any]]:
    """Checkpoints of sizes 3 and 4 (leaf 0 is the engine's environment leaf)."""
    answers = [await service.generate(f"p{i}") for i in range(2)]
    service.seal()
    answers.append(await service.generate("p2"))
    service.seal()
    return answers


async def test_lying_server_proof_for_another_leaf_fails_check_2(
    service: Service, aiohttp_client: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    answers = await _three_records(service)
    headers = {"Authorization": f"Bearer {service.auditor}"}
    other = await (await service.client.get(f"/v1/records/{answers[0]['record_id']}/proof",
                                            headers=headers)).json()

    def lie(a: dict[str, Any]) -> None:
        a["proof"]["inclusion_proof"] = other["inclusion_proof"]

    url = await lying_server(aiohttp_client, service, answers[1]["record_id"], lie)
    code, result = await cli(capsys, "verify", answers[1]["record_id"], "--server", url,
                             "--api-key", "k", "--log-key", service.log_key, *SELF, "--json")
    assert code == 1 and failed_check(result) == 2
    assert "root mismatch" in result["checks"][1]["reason"]


async def test_lying_server_fabricated_checkpoint_fails_check_3(
    service: Service, aiohttp_client: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    answers = await _three_records(service)
    impostor = NoteSigner(service.app[SETTINGS].origin, Ed25519PrivateKey.generate())

    def lie(a: dict[str, Any]) -> None:
        body = a["proof"]["checkpoint"].split("\n\n")[0] + "\n"
        a["proof"]["checkpoint"] = impostor.sign(body.encode()).decode()

    url = await lying_server(aiohttp_client, service, answers[0]["record_id"], lie)
    code, result = await cli(capsys, "verify", answers[0]["record_id"], "--server", url,
                             "--api-key", "k", "--log-key", service.log_key, *SELF, "--json")
    assert code == 1 and failed_check(result) == 3


async def test_lying_server_truncated_consistency_proof_fails_check_4(
    service: Service, aiohttp_client: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    answers = await _three_records(service)
    # Make the anchored checkpoint an older one so a consistency proof is needed.
    older = service.app[LEDGER].checkpoint(3)
    assert older is not None

    def lie(a: dict[str, Any]) -> None:
        a["anchored"]["checkpoint"] = older.note.decode()
        a["anchored"]["tree_size"] = 2
        a["consistency"]["proof"] = a["consistency"]["proof"][:-1]

    url = await lying_server(aiohttp_client, service, answers[2]["record_id"], lie)
    code, result = await cli(capsys, "verify", answers[2]["record_id"], "--server", url,
                             "--api-key", "k", "--log-key", service.log_key, *SELF, "--json")
    assert code == 1 and failed_check(result) == 4
    assert "MalformedProofError" in result["checks"][3]["reason"] or \
        "RootMismatchError" in result["checks"][3]["reason"]


async def test_rolled_back_checkpoint_fails_check_4(
    service: Service, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    answers = await _three_records(service)
    state = tmp_path / "state.note"
    code, _ = await cli(capsys, "verify", answers[2]["record_id"], "--db",
                        service.settings.database_url, "--log-key", service.log_key, *SELF,
                        "--state", str(state))
    assert code == 0 and b"\n4\n" in state.read_bytes()
    # The log is rolled back to the size-3 checkpoint: its newer history removed.
    engine = create_engine(service.settings.database_url)
    from ledger.store.schema import anchors, checkpoints

    with engine.begin() as conn:
        conn.execute(delete(checkpoints).where(checkpoints.c.size == 4))
        conn.execute(delete(anchors).where(anchors.c.size == 4))
    engine.dispose()
    code, result = await cli(capsys, "verify", answers[0]["record_id"], "--db",
                             service.settings.database_url, "--log-key", service.log_key, *SELF,
                             "--state", str(state), "--json")
    assert code == 1 and failed_check(result) == 4
    assert "RollbackError" in result["checks"][3]["reason"]


async def test_split_view_same_size_other_root_fails_check_4(
    service: Service, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    answers = await _three_records(service)
    origin = service.app[SETTINGS].origin
    state = tmp_path / "state.note"
    # This verifier was once shown another tree of size 4, signed with the log's key.
    state.write_bytes(service.app[SIGNER].sign_checkpoint(Checkpoint(origin, 4, bytes(32))))
    code, result = await cli(capsys, "verify", answers[1]["record_id"], "--db",
                             service.settings.database_url, "--log-key", service.log_key, *SELF,
                             "--state", str(state), "--json")
    assert code == 1 and failed_check(result) == 4
    assert "ForkError" in result["checks"][3]["reason"]


async def test_audit_detects_deleted_and_extra_rows(
    service: Service, capsys: pytest.CaptureFixture[str]
) -> None:
    for i in range(4):
        await service.generate(f"audit {i}")
    service.seal()
    args = ("audit", "--db", service.settings.database_url, "--from", "2000-01-01",
            "--to", "2100-01-01", "--log-key", service.log_key, "--json")
    code, result = await cli(capsys, *args)
    # Five in range: the environment leaf and the four records.
    assert code == 0 and result["complete"] and result["records_in_range"] == 5
    engine = create_engine(service.settings.database_url)
    with engine.begin() as conn:
        row = dict(conn.execute(records.select().where(records.c.leaf_index == 1)).one()._mapping)
        conn.execute(delete(records).where(records.c.leaf_index == 1))
    code, result = await cli(capsys, *args)
    assert code == 1 and [f["message"] for f in result["findings"]] == [
        "mirror rows missing for leaves 1..1"]
    with engine.begin() as conn:
        conn.execute(insert(records).values(row))  # restore
        conn.execute(insert(records).values({**row, "leaf_index": 99, "record_id": "forged"}))
    engine.dispose()
    code, result = await cli(capsys, *args)
    assert code == 1 and any("extra mirror row at leaf 99" in f["message"]
                             for f in result["findings"])


async def test_replay_reproduces_the_output_token_digest(
    service: Service, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    tiny_model_dir: Path,
) -> None:
    answer = await service.generate()
    service.seal()
    (tmp_path / "p.txt").write_text(PROMPT)
    manifest = tiny_model_dir.parent / "tiny-llama.manifest.json"
    code, result = await cli(capsys, "verify", answer["record_id"], "--db",
                             service.settings.database_url, "--log-key", service.log_key, *SELF,
                             "--prompt-file", str(tmp_path / "p.txt"), "--input-salt",
                             answer["input_salt"], "--output", answer["output"],
                             "--output-salt", answer["output_salt"], "--replay", "--model-dir",
                             str(tiny_model_dir), "--model-manifest", str(manifest), "--json")
    assert code == 0, result
    assert result["checks"][5]["check"] == 6 and result["checks"][5]["status"] == "pass"
    assert "output token digest reproduced" in result["checks"][5]["reason"]


async def test_replay_against_another_model_is_refused(
    service: Service, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from inference_wrapper.engine.tiny import build_tiny_model

    answer = await service.generate()
    service.seal()
    other = tmp_path / "other-model"
    build_tiny_model(other, seed=99)
    (tmp_path / "p.txt").write_text(PROMPT)
    code, out = await cli(capsys, "verify", answer["record_id"], "--db",
                          service.settings.database_url, "--log-key", service.log_key, *SELF,
                          "--prompt-file", str(tmp_path / "p.txt"), "--replay",
                          "--model-dir", str(other))
    assert code == 2, out
    assert "refusing to replay" in out and "the record names" in out


async def test_lying_server_bytes_of_another_record_fail_check_1(
    service: Service, aiohttp_client: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    answers = await _three_records(service)
    headers = {"Authorization": f"Bearer {service.auditor}"}
    other = await (await service.client.get(f"/v1/records/{answers[0]['record_id']}",
                                            headers=headers)).json()

    def lie(a: dict[str, Any]) -> None:
        a["record"]["canonical_base64"] = other["canonical_base64"]

    url = await lying_server(aiohttp_client, service, answers[1]["record_id"], lie)
    code, result = await cli(capsys, "verify", answers[1]["record_id"], "--server", url,
                             "--api-key", "k", "--log-key", service.log_key, *SELF, "--json")
    assert code == 1 and failed_check(result) == 1


# --- issue 9: rollback and fork from every source, offline included -------------------


def copy_database(service: Service, target: Path) -> str:
    """A consistent copy of the service's SQLite ledger (what an operator restores)."""
    source = sqlite3.connect(service.settings.database_url.removeprefix("sqlite:///"))
    copy_db = sqlite3.connect(target)
    with copy_db:
        source.backup(copy_db)
    source.close()
    copy_db.close()
    return f"sqlite:///{target}"


def grow(service: Service, url: str, count: int, tag: str) -> None:
    """Append ``count`` records to the log at ``url`` and seal, with the log's own key."""
    with SqlLedger(url) as ledger:
        for i in range(count):
            ledger.append(make_record(100 + i, tenant=tag))
        ledger.seal_checkpoint(service.app[SIGNER], service.app[SETTINGS].origin)


async def verify_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any]:
    return await cli(capsys, "verify", *argv, "--json")


async def test_older_and_forked_bundles_fail_check_4_offline_after_a_newer_checkpoint(
    service: Service, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    answers = [await service.generate(f"p{i}") for i in range(3)]
    service.seal()
    db = service.settings.database_url
    old = tmp_path / "old.json"
    assert (await cli(capsys, "export", "--db", db, "--bundle", str(old)))[0] == 0
    fork_url = copy_database(service, tmp_path / "fork.db")
    for i in range(2):
        await service.generate(f"q{i}")
    service.seal()
    state = tmp_path / "state.note"
    key = ("--log-key", service.log_key, *SELF, "--state", str(state))
    code, result = await verify_json(capsys, answers[0]["record_id"], "--server", service.url,
                                     "--api-key", service.auditor, *key)
    assert code == 0 and result["tree_size"] == 6, result

    # An older bundle (size 4): a rollback, seen offline without any proof.
    code, result = await verify_json(capsys, "--bundle", str(old), *key)
    assert code == 1 and result["failed"] == 4
    assert {r["failed_check"] for r in result["results"]} == {4}
    assert "RollbackError" in result["results"][0]["checks"][3]["reason"]

    # A fork signed with the log's key: another tree of size 6, then one of size 7.
    grow(service, fork_url, 2, "forked")
    forked = tmp_path / "forked.json"
    assert (await cli(capsys, "export", "--db", fork_url, "--bundle", str(forked)))[0] == 0
    code, result = await verify_json(capsys, "--bundle", str(forked), *key)
    assert code == 1 and {r["failed_check"] for r in result["results"]} == {4}
    assert "ForkError" in result["results"][0]["checks"][3]["reason"]
    grow(service, fork_url, 1, "forked")
    assert (await cli(capsys, "export", "--db", fork_url, "--bundle", str(forked)))[0] == 0
    code, result = await verify_json(capsys, "--bundle", str(forked), *key)
    assert code == 1 and {r["failed_check"] for r in result["results"]} == {4}
    assert "RootMismatchError" in result["results"][0]["checks"][3]["reason"]
    assert Checkpoint.peek(state.read_bytes()).size == 6  # no failure moved the state

    # The honest log grown to 7: its bundle proves it extends size 6, and advances the state.
    await service.generate("r")
    service.seal()
    newer = tmp_path / "newer.json"
    assert (await cli(capsys, "export", "--db", db, "--bundle", str(newer)))[0] == 0
    code, result = await verify_json(capsys, "--bundle", str(newer), *key)
    assert code == 0 and result["verified"] == 7, result
    assert Checkpoint.peek(state.read_bytes()).size == 7
    # ... after which the size-6 fork is older than what was seen: a rollback.
    code, result = await verify_json(capsys, "--bundle", str(old), *key)
    assert code == 1 and "RollbackError" in result["results"][0]["checks"][3]["reason"]


async def test_version_1_bundles_still_read_but_prove_no_extension(
    service: Service, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    await service.generate("a")
    service.seal()
    state = tmp_path / "state.note"
    key = ("--log-key", service.log_key, *SELF, "--state", str(state))
    first = tmp_path / "first.json"
    await cli(capsys, "export", "--db", service.settings.database_url, "--bundle", str(first))
    assert (await verify_json(capsys, "--bundle", str(first), *key))[0] == 0
    await service.generate("b")
    service.seal()
    bundle = tmp_path / "v1.json"
    await cli(capsys, "export", "--db", service.settings.database_url, "--bundle", str(bundle))
    data = json.loads(bundle.read_text())
    assert data["format"] == "audit-ledger-bundle/v2" and "2" in data["consistency_from"]
    data["format"] = "audit-ledger-bundle/v1"
    del data["consistency_from"]
    bundle.write_text(json.dumps(data))
    code, result = await verify_json(capsys, "--bundle", str(bundle), *key)
    assert code == 1 and "MissingProofError" in result["results"][0]["checks"][3]["reason"]
    code, result = await verify_json(capsys, "--bundle", str(bundle), *key, "--no-state")
    assert code == 0 and result["verified"] == 3  # the environment leaf and two records


async def test_older_database_copy_is_a_rollback_check_4_not_a_usage_error(
    service: Service, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    answers = await _three_records(service)  # checkpoints 3 and 4
    copy_url = copy_database(service, tmp_path / "copy.db")
    await service.generate("later")
    service.seal()
    state = tmp_path / "state.note"
    key = ("--log-key", service.log_key, *SELF, "--state", str(state))
    code, _ = await verify_json(capsys, answers[0]["record_id"], "--db",
                                service.settings.database_url, *key)
    assert code == 0 and Checkpoint.peek(state.read_bytes()).size == 5
    code, result = await verify_json(capsys, answers[0]["record_id"], "--db", copy_url, *key)
    assert code == 1 and failed_check(result) == 4
    assert "rollback: trusted tree size 5, offered 4" in result["checks"][3]["reason"]


async def test_consistent_liar_at_a_smaller_size_fails_check_4_not_unreachable(
    service: Service, aiohttp_client: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    answers = await _three_records(service)
    state = tmp_path / "state.note"
    key = ("--log-key", service.log_key, *SELF, "--state", str(state))
    assert (await verify_json(capsys, answers[0]["record_id"], "--db",
                              service.settings.database_url, *key))[0] == 0
    headers = {"Authorization": f"Bearer {service.auditor}"}
    rid = answers[0]["record_id"]
    record = await (await service.client.get(f"/v1/records/{rid}", headers=headers)).json()
    proof = await (await service.client.get(f"/v1/records/{rid}/proof?tree_size=3",
                                            headers=headers)).json()
    old = service.app[LEDGER].checkpoint(3)
    assert old is not None and proof["tree_size"] == 3

    # Every answer genuine for size 3; it cannot prove anything about size 4.
    async def handle(request: web.Request) -> web.Response:
        path = request.path
        if path.endswith("/proof"):
            return web.json_response(proof)
        if path.startswith("/v1/records/"):
            return web.json_response(record)
        if path == "/v1/checkpoints/anchored":
            return web.json_response({"tree_size": 3, "kind": "local", "ref": "local:3",
                                      "checkpoint": old.note.decode()})
        return web.json_response({"title": "Bad Request"}, status=400)

    app = web.Application()
    app.router.add_get("/{tail:.*}", handle)
    liar = str((await aiohttp_client(app)).make_url("")).rstrip("/")
    code, result = await verify_json(capsys, rid, "--server", liar, "--api-key", "k", *key)
    assert code == 1 and failed_check(result) == 4, result
    assert "RollbackError" in result["checks"][3]["reason"]


async def test_record_missing_from_a_server_that_answered_is_check_1(
    service: Service, capsys: pytest.CaptureFixture[str]
) -> None:
    await service.generate()
    service.seal()
    code, result = await verify_json(capsys, "no-such-record", "--server", service.url,
                                     "--api-key", service.auditor, "--log-key",
                                     service.log_key, *SELF)
    assert code == 1 and failed_check(result) == 1
    assert "the log has no record 'no-such-record'" in result["checks"][0]["reason"]


async def test_self_anchored_fails_check_4_unless_accepted_and_then_says_so(
    service: Service, capsys: pytest.CaptureFixture[str]
) -> None:
    answer = await service.generate()
    service.seal()
    args = ("verify", answer["record_id"], "--db", service.settings.database_url,
            "--log-key", service.log_key, "--no-state")
    code, out = await cli(capsys, *args)
    assert code == 1 and "[FAIL] 4." in out and "SelfAnchoredError" in out
    assert "--accept-self-anchored" in out and "NOT VERIFIED (check 4 failed)" in out
    code, out = await cli(capsys, *args, "--accept-self-anchored")
    assert code == 0 and "[SELF] 4." in out
    assert out.strip().splitlines()[-1].startswith("SELF-ANCHORED")


async def test_witness_quorum_on_a_bundle_passes_and_names_a_missing_witness(
    service: Service, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for i in range(2):
        await service.generate(f"w{i}")
    service.seal()
    bundle = tmp_path / "bundle.json"
    await cli(capsys, "export", "--db", service.settings.database_url, "--bundle", str(bundle))
    data = json.loads(bundle.read_text())
    # Stand-ins for witnesses on other machines: they cosign the bundle's checkpoint.
    cosigners = witnesses(2)
    body = data["checkpoint"].encode().split(b"\n\n")[0] + b"\n"
    full = add_cosignatures(data["checkpoint"].encode(),
                            [c.cosign(body, 1_800_000_000) for c in cosigners])
    data["checkpoint"] = full.decode()
    bundle.write_text(json.dumps(data))
    keyfile = tmp_path / "witnesses.txt"
    keyfile.write_text("\n".join(c.witness_key.encode() for c in cosigners) + "\n")
    base = ("--bundle", str(bundle), "--log-key", service.log_key, "--no-state")
    code, result = await verify_json(capsys, *base, "--witness", str(keyfile))
    assert code == 0 and result["trust"] == ["witnessed"], result
    # One witness's cosignature missing: quorum 2 of 2 unmet, the missing one named.
    data["checkpoint"] = add_cosignatures(data["checkpoint"].split("\n\n")[0].encode()
                                          + b"\n\n" + full.split(b"\n\n")[1].split(b"\n")[0]
                                          + b"\n", [cosigners[0].cosign(body, 1)]).decode()
    bundle.write_text(json.dumps(data))
    witness_args = [a for c in cosigners for a in ("--witness", c.witness_key.encode())]
    code, result = await verify_json(capsys, *base, *witness_args)
    assert code == 1 and {r["failed_check"] for r in result["results"]} == {4}
    reason = result["results"][0]["checks"][3]["reason"]
    assert "QuorumError" in reason and f"missing: {cosigners[1].name}" in reason
    code, result = await verify_json(capsys, *base, *witness_args, "--witness-quorum", "1")
    assert code == 0 and result["verified"] == 3  # the environment leaf and the records
    code, result = await verify_json(capsys, *base, *witness_args, "--witness-quorum", "3")
    assert code == 2 and result["error"]["field"] == "--witness-quorum"


async def test_altered_root_in_a_bundle_fails_check_3(
    service: Service, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    answer = await service.generate()
    service.seal()
    bundle = tmp_path / "bundle.json"
    await cli(capsys, "export", "--db", service.settings.database_url, "--bundle", str(bundle))
    data = json.loads(bundle.read_text())
    lines = data["checkpoint"].split("\n")
    lines[2] = base64.b64encode(bytes(32)).decode()
    data["checkpoint"] = "\n".join(lines)
    bundle.write_text(json.dumps(data))
    code, result = await verify_json(capsys, answer["record_id"], "--bundle", str(bundle),
                                     "--log-key",
                                     service.log_key, *SELF, "--no-state")
    assert code == 1 and failed_check(result) == 3
    assert [c["status"] for c in result["checks"]][:3] == ["pass", "skipped", "fail"]


async def test_crlf_prompt_opens_from_its_file_bytes_or_inline_text(
    service: Service, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompt = "Approve the loan?\r\nApplicant: 42\r\n"
    answer = await service.generate(prompt)
    service.seal()
    exact, normalised = tmp_path / "crlf.txt", tmp_path / "lf.txt"
    exact.write_bytes(prompt.encode())
    normalised.write_bytes(prompt.replace("\r\n", "\n").encode())
    base = (answer["record_id"], "--db", service.settings.database_url, "--log-key",
            service.log_key, *SELF, "--input-salt", answer["input_salt"], "--no-state")
    code, result = await verify_json(capsys, *base, "--prompt-file", str(exact))
    assert code == 0 and result["checks"][4]["status"] == "pass", result
    code, result = await verify_json(capsys, *base, "--prompt", prompt)
    assert code == 0 and result["checks"][4]["status"] == "pass"
    code, result = await verify_json(capsys, *base, "--prompt-file", str(normalised))
    assert code == 1 and failed_check(result) == 5


async def test_fabricated_mirror_row_beyond_the_log_is_check_1_not_a_usage_error(
    service: Service, capsys: pytest.CaptureFixture[str]
) -> None:
    answer = await service.generate()
    service.seal()
    engine = create_engine(service.settings.database_url)
    with engine.begin() as conn:
        row = dict(conn.execute(records.select().where(
            records.c.record_id == answer["record_id"])).one()._mapping)
        conn.execute(insert(records).values({**row, "leaf_index": 99, "record_id": "forged"}))
    engine.dispose()
    code, result = await verify_json(capsys, "forged", "--db", service.settings.database_url,
                                     "--log-key", service.log_key, *SELF, "--no-state")
    assert code == 1 and failed_check(result) == 1
    assert "which the log does not hold" in result["checks"][0]["reason"]


async def test_server_bundle_built_since_the_verifiers_size_proves_the_extension(
    service: Service, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = [await service.generate(f"s{i}") for i in range(2)]
    service.seal()
    state = tmp_path / "state.note"
    key = ("--log-key", service.log_key, *SELF, "--state", str(state))
    assert (await verify_json(capsys, first[0]["record_id"], "--server", service.url,
                              "--api-key", service.auditor, *key))[0] == 0
    for i in range(2):
        await service.generate(f"t{i}")
    service.seal()
    bundle = tmp_path / "bundle.json"
    export = ("export", "--server", service.url, "--api-key", service.auditor,
              "--bundle", str(bundle))
    code, result = await cli(capsys, *export, "--json")
    assert code == 0 and result["tree_size"] == 5 and result["consistency_from"] == []
    code, result = await verify_json(capsys, "--bundle", str(bundle), *key)
    assert code == 1 and "MissingProofError" in result["results"][0]["checks"][3]["reason"]
    code, result = await cli(capsys, *export, "--since-size", "3", "--json")
    assert code == 0 and result["consistency_from"] == [3]
    code, result = await verify_json(capsys, "--bundle", str(bundle), *key)
    assert code == 0 and result["verified"] == 5
    assert Checkpoint.peek(state.read_bytes()).size == 5


async def test_database_bundle_carries_proofs_from_the_latest_sizes_or_since_a_size(
    service: Service, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(4):
        await service.generate(f"c{i}")
        service.seal()  # checkpoints of sizes 2, 3, 4, 5 (leaf 0: the environment)
    monkeypatch.setattr("ledger.client.exporter.DEFAULT_EARLIER_SIZES", 2)
    bundle = tmp_path / "bundle.json"
    export = ("export", "--db", service.settings.database_url, "--bundle", str(bundle), "--json")
    code, result = await cli(capsys, *export)
    assert code == 0 and result["consistency_from"] == [3, 4]
    code, result = await cli(capsys, *export, "--since-size", "2")
    assert code == 0 and result["consistency_from"] == [2, 3, 4]
