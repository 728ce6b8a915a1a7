"""The verification CLI against a real service, a database, bundles and lying servers."""

from __future__ import annotations

import asyncio
import copy
import json
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
from ledger.checkpoint import Checkpoint, NoteSigner
from ledger.store.schema import records

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
    assert len(state) == 1 and b"\n1\n" in state[0].read_bytes()


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
    assert code == 0 and result["verified"] == 5 and result["failed"] == 0
    db_bundle = tmp_path / "db.json"
    code, _ = await cli(capsys, "export", "--db", service.settings.database_url, "--bundle",
                        str(db_bundle))
    code, one = await cli(capsys, "verify", answers[2]["record_id"], "--bundle", str(db_bundle),
                          "--log-key", service.log_key, *SELF, "--json")
    assert code == 0 and one["verified"]


async def test_one_changed_byte_in_the_record_fails_check_1(
    service: Service, capsys: pytest.CaptureFixture[str]
) -> None:
    answer = await service.generate()
    service.seal()
    engine = create_engine(service.settings.database_url)
    with engine.begin() as conn:
        row = conn.execute(records.select().where(records.c.record_id == answer["record_id"])).one()
        edited = bytes(row.canonical).replace(b'"bank-a"', b'"bank-b"')
        conn.execute(update(records).where(records.c.record_id == answer["record_id"])
                     .values(canonical=edited))
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
    older = service.app[LEDGER].checkpoint(2)
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
    assert code == 0 and b"\n3\n" in state.read_bytes()
    # The log is rolled back to the size-2 checkpoint: its newer history removed.
    engine = create_engine(service.settings.database_url)
    from ledger.store.schema import anchors, checkpoints

    with engine.begin() as conn:
        conn.execute(delete(checkpoints).where(checkpoints.c.size == 3))
        conn.execute(delete(anchors).where(anchors.c.size == 3))
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
    # This verifier was once shown another tree of size 3, signed with the log's key.
    state.write_bytes(service.app[SIGNER].sign_checkpoint(Checkpoint(origin, 3, bytes(32))))
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
    assert code == 0 and result["complete"] and result["records_in_range"] == 4
    engine = create_engine(service.settings.database_url)
    with engine.begin() as conn:
        row = dict(conn.execute(records.select().where(records.c.leaf_index == 1)).one()._mapping)
        conn.execute(delete(records).where(records.c.leaf_index == 1))
    code, result = await cli(capsys, *args)
    assert code == 1 and result["findings"] == ["mirror rows missing for leaves 1..1"]
    with engine.begin() as conn:
        conn.execute(insert(records).values(row))  # restore
        conn.execute(insert(records).values({**row, "leaf_index": 99, "record_id": "forged"}))
    engine.dispose()
    code, result = await cli(capsys, *args)
    assert code == 1 and any("extra mirror row at leaf 99" in f for f in result["findings"])


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
                             answer["input_salt"], "--replay", "--model-dir",
                             str(tiny_model_dir), "--model-manifest", str(manifest), "--json")
    assert code == 0, result
    assert result["checks"][5]["check"] == 6 and result["checks"][5]["status"] == "pass"
    assert "output token digest reproduced" in result["checks"][5]["reason"]


async def test_replay_against_another_model_is_refused(
    service: Service, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from inference_wrapper.tiny import build_tiny_model

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
