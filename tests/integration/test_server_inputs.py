"""Hostile and unusual input over real HTTP on loopback (tiny model, SQLite ledger): every
invalid input is a 4xx naming the field and writes nothing; the OpenAI routes answer in
OpenAI's shape; the tokenization contract is never bent silently; admin keys are scoped."""

from __future__ import annotations

import base64
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from inference_wrapper.server.app import GENERATOR, KEYS, LEDGER, LIFECYCLE, create_app
from inference_wrapper.server.settings import Settings
from ledger.canonical import canonical_bytes
from ledger.leaves import commitments

MakeClient = Callable[..., Awaitable[Any]]
LONG_PROMPT = "y" * 1100  # the tiny tokenizer is byte-level: 1,100 tokens > 1,024


@pytest.fixture()
async def service(aiohttp_client: MakeClient, tmp_path: Path, tiny_generator: Any) -> Any:
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'ledger.db'}",
                        log_key_path=tmp_path / "log.key", max_wait_ms=1.0,
                        checkpoint_interval_s=0.1)
    app = create_app(settings, tiny_generator)
    client = await aiohttp_client(app)
    keys = app[KEYS]
    tokens = {"a": keys.create("bank-a", "client")[0], "b": keys.create("bank-b", "client")[0]}
    return client, tokens


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def record_of(client: Any, record_id: str) -> dict[str, Any]:
    row = client.server.app[LEDGER].get_record(record_id)
    assert row is not None
    body: dict[str, Any] = json.loads(row.leaf_body)  # an audit-record/v2 body
    return body


# --- the bad-input table: body of /v1/generate -----------------------------------------

DEEP = b'{"prompt": "x", "seed": ' + b"[" * 20_000 + b"]" * 20_000 + b"}"
BAD_BODIES = [
    ("20,000-deep nesting", DEEP, 400, "body"),
    ("5,000-digit integer", b'{"prompt": "x", "seed": ' + b"9" * 5000 + b"}", 400, "body"),
    ("float overflowing to infinity", b'{"prompt": "x", "temperature": 1e400}', 400, "body"),
    ("non-integral float for an integer", b'{"prompt": "x", "max_new_tokens": 5.5}', 422,
     "max_new_tokens"),
    ("integer float out of bounds", b'{"prompt": "x", "max_new_tokens": 1e300}', 422,
     "max_new_tokens"),
    ("temperature in the gap above 0", b'{"prompt": "x", "temperature": 0.001}', 422,
     "temperature"),
    ("seed beyond 2**53", b'{"prompt": "x", "seed": 9007199254740992}', 422, "seed"),
    ("whitespace prompt", b'{"prompt": "   "}', 422, "prompt"),
    ("prompt over the context length", json.dumps({"prompt": LONG_PROMPT}).encode(), 422,
     "prompt"),
    ("unsupported truncation side", b'{"prompt": "x", "truncate": "right"}', 422, "truncate"),
]


@pytest.mark.parametrize(("case", "raw", "status", "field"), BAD_BODIES,
                         ids=[c[0] for c in BAD_BODIES])
async def test_bad_body_gets_its_4xx_naming_the_field(
    service: Any, case: str, raw: bytes, status: int, field: str
) -> None:
    client, tokens = service
    ledger = client.server.app[LEDGER]
    before = ledger.tree_head()[0]
    response = await client.post("/v1/generate", data=raw, headers={
        **bearer(tokens["a"]), "Content-Type": "application/json"})
    assert response.status == status, await response.text()
    assert response.content_type == "application/problem+json"
    problem = await response.json()
    assert (problem["status"], problem["field"]) == (status, field)
    assert ledger.tree_head()[0] == before


# --- the bad-input table: query strings --------------------------------------------------

BAD_QUERIES = [
    ("superscript two as limit", "/v1/records?limit=%C2%B2", "limit"),
    ("Arabic-Indic digit as limit", "/v1/records?limit=%D9%A3", "limit"),
    ("zero limit", "/v1/records?limit=0", "limit"),
    ("limit above its bound", "/v1/records?limit=10001", "limit"),
    ("signed limit", "/v1/records?limit=+5", "limit"),
    ("time overflowing in UTC", "/v1/records?since=0001-01-01T00:00:00%2B01:00", "since"),
    ("tree size beyond 64 bits", "/v1/records/{id}/proof?tree_size=29210043846210519040",
     "tree_size"),
    ("tree size with a superscript", "/v1/records/{id}/proof?tree_size=%C2%B9", "tree_size"),
    ("consistency from a superscript", "/v1/checkpoints/consistency?from=%C2%B2&to=3", "from"),
    ("consistency to beyond 2**53", "/v1/checkpoints/consistency?from=1&to=9007199254740992",
     "to"),
    ("consistency without to", "/v1/checkpoints/consistency?from=1", "to"),
    ("forged cursor beyond 64 bits", "/v1/records?cursor="
     + base64.urlsafe_b64encode(b"after:" + b"9" * 30).decode().rstrip("="), "cursor"),
    ("cursor with a superscript", "/v1/records?cursor="
     + base64.urlsafe_b64encode("after:²".encode()).decode().rstrip("="), "cursor"),
    ("time cursor beyond 2**53", "/v1/records?order=time&cursor="
     + base64.urlsafe_b64encode(b"after:time:0:9007199254740992").decode().rstrip("="),
     "cursor"),
    ("cursor of another order", "/v1/records?order=-time&cursor=5", "cursor"),
    ("unknown match", "/v1/records?match=fuzzy", "match"),
    ("unknown order", "/v1/records?order=newest", "order"),
    ("total not a boolean", "/v1/records?total=yes", "total"),
    ("empty filter", "/v1/records?model_name=", "model_name"),
    ("over-long filter", "/v1/records?driver_version=" + "9" * 257, "driver_version"),
    # PostgreSQL refuses NUL in text (it was a 500 there); no name holds one.
    ("NUL in a part of a name", "/v1/records?model_name=a%00b&match=part", "model_name"),
    ("NUL in an exact filter", "/v1/records?model_digest=%00", "model_digest"),
]


@pytest.mark.parametrize(("case", "path", "field"), BAD_QUERIES, ids=[c[0] for c in BAD_QUERIES])
async def test_bad_query_gets_400_naming_the_parameter(
    service: Any, case: str, path: str, field: str
) -> None:
    client, tokens = service
    answer = await (await client.post("/v1/generate", json={"prompt": "q", "max_new_tokens": 1},
                                      headers=bearer(tokens["a"]))).json()
    response = await client.get(path.replace("{id}", answer["record_id"]),
                                headers=bearer(tokens["a"]))
    assert response.status == 400, await response.text()
    assert response.content_type == "application/problem+json"
    assert (await response.json())["field"] == field


async def test_json_numbers_follow_json_schema(service: Any) -> None:
    # 5.0 is an integer and 2 is a number: both accepted, and the int reaches the model
    # as a float (it used to reach transformers as an int and fail with a 500).
    client, tokens = service
    response = await client.post("/v1/generate", json={
        "prompt": "numbers", "max_new_tokens": 3.0, "temperature": 2, "top_p": 1, "seed": 7.0},
        headers=bearer(tokens["a"]))
    assert response.status == 200, await response.text()
    answer = await response.json()
    generation = record_of(client, answer["record_id"])["data"]["generation"]
    assert generation["max_new_tokens"] == 3 and generation["seed"] == 7 == answer["seed"]
    assert generation["temperature"] == 2.0 and generation["do_sample"] is True


async def test_405_names_the_allowed_methods(service: Any) -> None:
    client, tokens = service
    native = await client.get("/v1/generate", headers=bearer(tokens["a"]))
    assert native.status == 405 and native.headers["Allow"] == "POST"
    assert native.content_type == "application/problem+json"
    openai = await client.put("/v1/chat/completions", headers=bearer(tokens["a"]))
    assert openai.status == 405 and openai.headers["Allow"] == "POST"
    assert (await openai.json())["error"]["type"] == "invalid_request_error"


async def test_a_500_says_only_internal_error_and_the_request_id(
    service: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, tokens = service

    def broken() -> None:
        raise RuntimeError("SELECT secret FROM records WHERE tenant = 'bank-b'")

    monkeypatch.setattr(client.server.app[LEDGER], "latest_checkpoint", broken)
    response = await client.get("/v1/checkpoints/latest", headers={
        **bearer(tokens["a"]), "X-Request-Id": "req-42"})
    assert response.status == 500
    assert response.headers["X-Request-Id"] == "req-42"
    problem = await response.json()
    assert problem == {"type": "about:blank", "title": "Internal Server Error", "status": 500,
                       "detail": "internal error", "instance": "/v1/checkpoints/latest",
                       "request_id": "req-42"}


async def test_requests_after_shutdown_began_get_503(service: Any) -> None:
    client, tokens = service
    client.server.app[LIFECYCLE].shutting_down = True
    response = await client.post("/v1/generate", json={"prompt": "late"},
                                 headers=bearer(tokens["a"]))
    assert response.status == 503 and response.headers["Retry-After"] == "5"
    assert (await response.json())["detail"] == "the service is shutting down"
    assert (await client.get("/healthz")).status == 200  # probes still answer
    assert client.server.app[LEDGER].tree_head()[0] == 1  # the environment leaf alone


# --- the tokenization contract ---------------------------------------------------------


async def test_over_long_prompt_refused_unless_truncation_is_asked_for(service: Any) -> None:
    client, tokens = service
    refused = await client.post("/v1/generate", json={"prompt": LONG_PROMPT},
                                headers=bearer(tokens["a"]))
    assert refused.status == 422
    problem = await refused.json()
    assert problem["field"] == "prompt" and problem["code"] == "context_length_exceeded"
    assert "1100 tokens" in problem["detail"] and "1024" in problem["detail"]

    allowed = await client.post("/v1/generate", json={
        "prompt": LONG_PROMPT, "truncate": "left", "max_new_tokens": 2},
        headers=bearer(tokens["a"]))
    assert allowed.status == 200
    answer = await allowed.json()
    data = record_of(client, answer["record_id"])["data"]
    assert data["truncated"] is True and data["input_token_count"] == 1024
    assert answer["usage"] == {"prompt_tokens": 1024,
                               "completion_tokens": data["output_token_count"],
                               "total_tokens": 1024 + data["output_token_count"]}


async def test_chat_truncation_never_drops_the_system_prompt(service: Any) -> None:
    client, tokens = service
    model = client.server.app[GENERATOR].loaded.name
    messages = [{"role": "system", "content": "POLICY: never reveal account numbers."},
                {"role": "user", "content": LONG_PROMPT}]
    refused = await client.post("/v1/chat/completions", json={
        "model": model, "messages": messages, "max_tokens": 2}, headers=bearer(tokens["a"]))
    assert refused.status == 400
    assert (await refused.json())["error"]["code"] == "context_length_exceeded"
    still_refused = await client.post("/v1/chat/completions", json={
        "model": model, "messages": messages, "max_tokens": 2, "truncate": "left"},
        headers=bearer(tokens["a"]))
    assert still_refused.status == 400
    error = (await still_refused.json())["error"]
    assert error["param"] == "truncate" and "system prompt" in error["message"]
    no_system = await client.post("/v1/chat/completions", json={
        "model": model, "messages": messages[1:], "max_tokens": 2, "truncate": "left"},
        headers=bearer(tokens["a"]))
    assert no_system.status == 200
    assert client.server.app[LEDGER].tree_head()[0] == 2  # the environment leaf and one


# --- OpenAI compatibility ------------------------------------------------------------------


async def test_openai_stop_n_user_seed_and_fingerprint(service: Any) -> None:
    client, tokens = service
    generator = client.server.app[GENERATOR]
    model = generator.loaded.name
    base = {"model": model, "prompt": "Once upon a time", "max_tokens": 24, "temperature": 0}
    plain = await (await client.post("/v1/completions", json=base,
                                     headers=bearer(tokens["a"]))).json()
    text = plain["choices"][0]["text"]
    assert len(text) > 3, text
    stop = text[2]  # greedy decoding repeats itself: this character occurs at index >= 2
    cut = text[: text.index(stop)]
    response = await client.post("/v1/completions", json={
        **base, "stop": ["\x00never", stop], "n": 1, "user": "customer-7"},
        headers=bearer(tokens["a"]))
    assert response.status == 200, await response.text()
    answer = await response.json()
    choice = answer["choices"][0]
    assert choice["text"] == cut and choice["finish_reason"] == "stop"
    assert answer["system_fingerprint"] == "fp_" + generator.loaded.digest.split(":")[1][:16]
    assert answer["seed"] is None  # greedy: no seed was used
    record = record_of(client, answer["audit"]["record_id"])
    held, data = record["commitments"], record["data"]
    assert data["finish_reason"] == "stop"
    # The stop strings and the user are caller content: committed, never disclosed.
    assert commitments.opens(held["stop"], bytes.fromhex(answer["audit"]["input_salt"]),
                             "stop", canonical_bytes(["\x00never", stop]))
    assert commitments.opens(held["output"], bytes.fromhex(answer["audit"]["output_salt"]),
                             "output", cut.encode())
    assert commitments.opens(held["user"], bytes.fromhex(answer["audit"]["user_salt"]),
                             "user", b"customer-7")
    assert "never" not in json.dumps(record)
    assert "customer-7" not in json.dumps(record_of(client, answer["audit"]["record_id"]))
    assert answer["usage"]["completion_tokens"] == data["output_token_count"] <= 24

    sampled = await (await client.post("/v1/completions", json={
        **base, "temperature": 0.8, "max_tokens": 2}, headers=bearer(tokens["a"]))).json()
    recorded = record_of(client, sampled["audit"]["record_id"])["data"]["generation"]["seed"]
    assert isinstance(sampled["seed"], int) and sampled["seed"] == recorded


async def test_max_completion_tokens_supersedes_max_tokens(service: Any) -> None:
    client, tokens = service
    model = client.server.app[GENERATOR].loaded.name
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 9,
            "max_completion_tokens": 2, "temperature": 0}
    answer = await (await client.post("/v1/chat/completions", json=body,
                                      headers=bearer(tokens["a"]))).json()
    assert record_of(client, answer["audit"]["record_id"])["data"]["generation"][
        "max_new_tokens"] == 2
    zero = await client.post("/v1/chat/completions", json={**body, "max_completion_tokens": 0},
                             headers=bearer(tokens["a"]))
    assert zero.status == 400
    assert (await zero.json())["error"]["param"] == "max_completion_tokens"


OPENAI_BAD = [
    ("n above 1", {"n": 2}, 400, "n", None),
    ("stream not a boolean", {"stream": "yes"}, 400, "stream", None),
    ("empty stop", {"stop": [""]}, 400, "stop[0]", None),
    ("five stops", {"stop": ["a", "b", "c", "d", "e"]}, 400, "stop", None),
    ("user too long", {"user": "u" * 300}, 400, "user", None),
    ("unknown model", {"model": "gpt-9"}, 404, "model", "model_not_found"),
    ("context too long", {"prompt": LONG_PROMPT}, 400, "prompt", "context_length_exceeded"),
    ("temperature as a string", {"temperature": "hot"}, 400, "temperature", None),
]


@pytest.mark.parametrize(("case", "extra", "status", "param", "code"), OPENAI_BAD,
                         ids=[c[0] for c in OPENAI_BAD])
async def test_openai_errors_have_openais_shape(
    service: Any, case: str, extra: dict[str, Any], status: int, param: str, code: str | None
) -> None:
    client, tokens = service
    body = {"model": client.server.app[GENERATOR].loaded.name, "prompt": "x", **extra}
    response = await client.post("/v1/completions", json=body, headers=bearer(tokens["a"]))
    assert response.status == status
    assert response.content_type == "application/json"
    error = (await response.json())["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["param"], error["code"], error["type"]) == (param, code,
                                                              "invalid_request_error")
    assert error["message"]
    assert client.server.app[LEDGER].tree_head()[0] == 1  # the environment leaf alone


async def test_official_openai_client_reads_message_param_and_code(service: Any) -> None:
    import openai

    client, tokens = service
    model = client.server.app[GENERATOR].loaded.name
    sdk = openai.AsyncOpenAI(base_url=str(client.make_url("/v1")), api_key=tokens["a"],
                             max_retries=0)
    with pytest.raises(openai.BadRequestError) as too_long:
        await sdk.completions.create(model=model, prompt=LONG_PROMPT, max_tokens=2)
    assert too_long.value.code == "context_length_exceeded"
    assert too_long.value.param == "prompt"
    assert "1100 tokens" in too_long.value.message
    assert isinstance(too_long.value.body, dict) and too_long.value.body["param"] == "prompt"
    with pytest.raises(openai.NotFoundError) as missing:
        await sdk.chat.completions.create(model="gpt-9", messages=[
            {"role": "user", "content": "hi"}])
    assert (missing.value.code, missing.value.param) == ("model_not_found", "model")
    with pytest.raises(openai.BadRequestError) as two:
        await sdk.completions.create(model=model, prompt="x", n=2)
    assert two.value.param == "n" and "supports only 1: one choice" in two.value.message
    chat = await sdk.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_completion_tokens=3,
        temperature=0, stop="\x00", user="u-1", seed=5)
    assert chat.system_fingerprint is not None and chat.system_fingerprint.startswith("fp_")
    assert chat.usage is not None and chat.usage.completion_tokens <= 3
    bad_key = openai.AsyncOpenAI(base_url=str(client.make_url("/v1")),
                                 api_key="alk_0_nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as denied:
        await bad_key.models.list()
    assert denied.value.code == "invalid_api_key"
    await sdk.close()
    await bad_key.close()


# --- roles -----------------------------------------------------------------------------


async def test_admin_reads_only_its_tenant_unless_created_for_all(service: Any) -> None:
    client, tokens = service
    keys = client.server.app[KEYS]
    other = await (await client.post("/v1/generate", json={"prompt": "b", "max_new_tokens": 1},
                                     headers=bearer(tokens["b"]))).json()
    scoped = keys.create("bank-a", "admin")[0]
    everywhere, key = keys.create("ops", "admin", all_tenants=True)
    assert key.all_tenants and key.role == "admin"

    assert (await client.get(f"/v1/records/{other['record_id']}",
                             headers=bearer(scoped))).status == 404
    listing = await (await client.get("/v1/records", headers=bearer(scoped))).json()
    assert listing["records"] == []
    forbidden = await client.get("/v1/records?tenant=bank-b", headers=bearer(scoped))
    assert forbidden.status == 403 and (await forbidden.json())["field"] == "tenant"

    seen = await client.get(f"/v1/records/{other['record_id']}", headers=bearer(everywhere))
    assert seen.status == 200 and (await seen.json())["tenant"] == "bank-b"
    listing = await (await client.get("/v1/records?tenant=bank-b",
                                      headers=bearer(everywhere))).json()
    assert [r["record_id"] for r in listing["records"]] == [other["record_id"]]


def test_cli_creates_all_tenant_admins_only(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    from audit_cli.main import main

    url = f"sqlite:///{tmp_path / 'keys.db'}"
    assert main(["keys", "--db", url, "create", "--tenant", "x", "--role", "client",
                 "--all-tenants"]) == 2
    assert "all_tenants" in capsys.readouterr().err
    assert main(["keys", "--json", "--db", url, "create", "--tenant", "ops", "--role",
                 "admin", "--all-tenants"]) == 0
    created = json.loads(capsys.readouterr().out)
    assert created["role"] == "admin" and created["all_tenants"] is True
    assert main(["keys", "--json", "--db", url, "list"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(k["role"], k["all_tenants"]) for k in listed] == [("admin", True)]



async def test_replay_reproduces_stop_cut_and_truncated_records(
    service: Any, tiny_model_dir: Path
) -> None:
    from inference_wrapper.audit.replay import replay_v2

    client, tokens = service
    model = client.server.app[GENERATOR].loaded.name
    base = {"model": model, "prompt": "Replay me", "max_tokens": 16, "temperature": 0}
    text = (await (await client.post("/v1/completions", json=base,
                                     headers=bearer(tokens["a"]))).json())["choices"][0]["text"]
    stopped = await (await client.post("/v1/completions", json={**base, "stop": text[3]},
                                       headers=bearer(tokens["a"]))).json()
    truncated = await (await client.post("/v1/completions", json={
        **base, "prompt": LONG_PROMPT, "truncate": "left"}, headers=bearer(tokens["a"]))).json()
    manifest = tiny_model_dir.parent / f"{tiny_model_dir.name}.manifest.json"
    ledger = client.server.app[LEDGER]
    for answer, prompt, stop in ((stopped, "Replay me", (text[3],)),
                                 (truncated, LONG_PROMPT, ())):
        record = record_of(client, answer["audit"]["record_id"])
        environment = ledger.record_at(record["environment"]["leaf_index"])
        # A v2 record's token ids and stop strings are commitments: the salts open them.
        result = replay_v2(record, json.loads(environment.leaf_body), prompt,
                           input_salt=bytes.fromhex(answer["audit"]["input_salt"]),
                           output_salt=bytes.fromhex(answer["audit"]["output_salt"]),
                           stop=stop, model_dir=tiny_model_dir, manifest_path=manifest)
        assert result.reproduced and result.input_ids_match
        assert result.replayed_text == answer["choices"][0]["text"]
    assert stopped["choices"][0]["finish_reason"] == "stop"
