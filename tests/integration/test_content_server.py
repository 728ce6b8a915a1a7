"""The retention routes in process (aiohttp on loopback, tiny model, SQLite): policy
administration, input errors naming the field, and no output when content that the
policy keeps cannot be stored."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from inference_wrapper.server.app import KEYS, LEDGER, VAULT, create_app
from inference_wrapper.server.settings import Settings
from ledger.leaves.stream_start import STREAM_START_KIND
from tests.wrapped_generator import WrappedGenerator

MakeClient = Callable[..., Awaitable[Any]]

ENV = 1  # every service log starts with its engine's environment leaf (decision 0026)


class CountingGenerator(WrappedGenerator):
    """The tiny generator, counting the requests that reach the model (generation waits
    while a test closes the gate)."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner, gate_open=True)
        self.generated = 0

    def run_batch(self, batch: Any, on_step: Any = None) -> Any:
        self.generated += len(batch.prompts)
        self.wait_for_gate()
        return super().run_batch(batch, on_step)


class NoStreaming(WrappedGenerator):
    """The tiny generator with no streamer: a stream's text is all there only once its
    record is committed, so a failure comes before any text (and before the headers)."""

    def run_batch(self, batch: Any, on_step: Any = None) -> Any:
        return super().run_batch(batch)


class HeldSeal(WrappedGenerator):
    """The tiny generator; sealing (the records) waits until the test has seen text."""

    def seal(self, batch: Any, log: Any = None) -> Any:
        self.wait_for_gate()
        return self.inner.seal(batch, log)


async def _start(aiohttp_client: MakeClient, tmp_path: Path, generator: Any) -> Any:
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'ledger.db'}",
                        log_key_path=tmp_path / "log.key", keyring_path=tmp_path / "keyring",
                        max_wait_ms=20.0, checkpoint_interval_s=0.1)
    app = create_app(settings, generator)
    client = await aiohttp_client(app)
    keys = app[KEYS]
    tokens = {"client": keys.create("bank-a", "client")[0],
              "admin": keys.create("bank-a", "admin")[0],
              "auditor": keys.create("audit-firm", "auditor")[0]}
    return client, app, tokens


@pytest.fixture()
async def service(aiohttp_client: MakeClient, tmp_path: Path, tiny_generator: Any) -> Any:
    return await _start(aiohttp_client, tmp_path, tiny_generator)


@pytest.fixture()
async def unstreamed(aiohttp_client: MakeClient, tmp_path: Path, tiny_generator: Any) -> Any:
    """A service whose streams get all their text at the end (``NoStreaming``)."""
    return await _start(aiohttp_client, tmp_path, NoStreaming(tiny_generator))


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_admin_sets_its_tenant_policy_within_the_minimum(service: Any) -> None:
    client, app, tokens = service
    got = await client.get("/v1/admin/retention", headers=bearer(tokens["admin"]))
    assert (await got.json())["mode"] == "commitments"
    low = await client.put("/v1/admin/retention", json={"mode": "content", "days": 30},
                           headers=bearer(tokens["admin"]))
    assert low.status == 422 and (await low.json())["field"] == "days"
    bad = await client.put("/v1/admin/retention", json={"mode": "forever"},
                           headers=bearer(tokens["admin"]))
    assert bad.status == 422 and (await bad.json())["field"] == "mode"
    denied = await client.put("/v1/admin/retention", json={"mode": "content"},
                              headers=bearer(tokens["client"]))
    assert denied.status == 403
    ok = await client.put("/v1/admin/retention", json={"mode": "content", "days": 400},
                          headers=bearer(tokens["admin"]))
    assert await ok.json() == {"tenant": "bank-a", "mode": "content", "days": 400,
                               "explicit": True}
    assert app[VAULT].policy("bank-a").days == 400


async def test_erasure_route_names_the_bad_field(service: Any) -> None:
    client, _, tokens = service
    for body, field in (({"subject": "a", "record_ids": ["r"]}, "subject"),
                        ({}, "subject"), ({"record_ids": []}, "record_ids"),
                        ({"record_ids": [7]}, "record_ids"), ({"subject": ""}, "subject"),
                        ({"subject": "a", "extra": 1}, "extra")):
        response = await client.post("/v1/admin/erasures", json=body,
                                     headers=bearer(tokens["admin"]))
        assert response.status == 422, body
        assert (await response.json())["field"] == field
    missing = await client.post("/v1/admin/erasures", json={"record_ids": ["no-such"]},
                                headers=bearer(tokens["admin"]))
    assert missing.status == 404


async def test_subject_must_be_short_text(service: Any) -> None:
    client, _, tokens = service
    response = await client.post("/v1/generate", json={"prompt": "hi", "subject": "x" * 300},
                                 headers=bearer(tokens["client"]))
    assert response.status == 422 and (await response.json())["field"] == "subject"


async def test_no_output_when_the_vault_cannot_keep_the_content(service: Any) -> None:
    client, app, tokens = service
    app[VAULT].set_policy("bank-a", "content", 183)
    first = await client.post("/v1/generate", json={"prompt": "kept", "max_new_tokens": 2},
                              headers=bearer(tokens["client"]))
    assert first.status == 200
    with app[LEDGER].engine.begin() as conn:  # the vault breaks for real
        conn.execute(text("DROP TABLE vault_content"))
    size = app[LEDGER].tree_head()[0]
    response = await client.post("/v1/generate", json={"prompt": "lost", "max_new_tokens": 2},
                                 headers=bearer(tokens["client"]))
    problem = await response.json()
    assert response.status == 503 and "output" not in problem
    assert "content vault could not keep its content" in problem["detail"]
    assert "vault_content" not in problem["detail"]  # no internal error text
    assert app[LEDGER].tree_head()[0] == size + 1  # the record itself is in the log


async def test_erasure_turns_the_stored_idempotent_answer_into_410(service: Any) -> None:
    client, app, tokens = service
    app[VAULT].set_policy("bank-a", "content", 183)
    body = {"prompt": "secret prompt", "max_new_tokens": 2, "subject": "alice"}
    headers = {**bearer(tokens["client"]), "Idempotency-Key": "erase-me"}
    first = await (await client.post("/v1/generate", json=body, headers=headers)).json()
    # Inside the minimum retention: refused without a legal basis, naming the field.
    early = await client.post("/v1/admin/erasures", json={"subject": "alice"},
                              headers=bearer(tokens["admin"]))
    assert early.status == 422 and (await early.json())["field"] == "legal_basis"
    erased = await client.post("/v1/admin/erasures", json={
        "subject": "alice", "legal_basis": "GDPR Art. 17(1)(d), ticket 8812"},
        headers=bearer(tokens["admin"]))
    assert erased.status == 200 and first["record_id"] in (await erased.json())["records"]
    # The replay no longer hands back the erased answer and its salts, and the key stays
    # bound to its record (no second generate): 410 naming the record and the erasure.
    size = app[LEDGER].tree_head()[0]
    again = await client.post("/v1/generate", json=body, headers=headers)
    problem = await again.json()
    assert again.status == 410 and problem["record_id"] == first["record_id"]
    assert "erased" in problem["detail"] and first["input_salt"] not in json.dumps(problem)
    assert app[LEDGER].tree_head()[0] == size


def _break_the_vault(app: Any) -> None:
    """Content for bank-a must be kept, and the vault's table is gone: a real failure
    after the record commits."""
    app[VAULT].set_policy("bank-a", "content", 183)
    with app[LEDGER].engine.begin() as conn:
        conn.execute(text("DROP TABLE vault_content"))


async def test_a_retry_after_the_vault_failed_gets_the_same_answer_and_no_second_record(
    aiohttp_client: MakeClient, tmp_path: Path, tiny_generator: Any
) -> None:
    counted = CountingGenerator(tiny_generator)
    client, app, tokens = await _start(aiohttp_client, tmp_path, counted)
    _break_the_vault(app)
    body = {"prompt": "pay invoice 9", "max_new_tokens": 2}
    headers = {**bearer(tokens["client"]), "Idempotency-Key": "invoice-9"}
    first = await client.post("/v1/generate", json=body, headers=headers)
    problem = await first.json()
    assert first.status == 503 and "output" not in problem and "input_salt" not in problem
    assert app[LEDGER].tree_head()[0] == ENV + 1  # the record is committed, its content not kept
    again = await client.post("/v1/generate", json=body, headers=headers)
    replay = await again.json()
    assert counted.generated == 1  # not generated again
    assert app[LEDGER].tree_head()[0] == ENV + 1  # the one record, no second one
    # The retry answers what the first request answered, naming the committed record.
    assert again.status == 503
    differs = {"request_id"}  # each request has its own
    assert ({k: v for k, v in replay.items() if k not in differs}
            == {k: v for k, v in problem.items() if k not in differs})
    record_id = problem["record_id"]
    assert app[LEDGER].get_record(record_id) is not None
    assert "content vault could not keep its content" in problem["detail"]
    assert "stays bound" in problem["detail"] and record_id in problem["detail"]
    # Retrying with this key changes nothing: no Retry-After.
    assert "Retry-After" not in first.headers and "Retry-After" not in again.headers
    # Without a key a request is new each time: it may be retried (and makes a record).
    plain = await client.post("/v1/generate", json=body, headers=bearer(tokens["client"]))
    assert plain.status == 503 and plain.headers["Retry-After"] == "1"
    assert (await plain.json())["record_id"] != record_id
    assert counted.generated == 2 and app[LEDGER].tree_head()[0] == ENV + 2


async def test_the_openai_client_retrying_a_vault_failure_makes_one_record(
    aiohttp_client: MakeClient, tmp_path: Path, tiny_generator: Any
) -> None:
    from openai import APIStatusError, AsyncOpenAI

    counted = CountingGenerator(tiny_generator)
    client, app, tokens = await _start(aiohttp_client, tmp_path, counted)
    _break_the_vault(app)
    openai = AsyncOpenAI(base_url=str(client.make_url("/v1")), api_key=tokens["client"],
                         max_retries=2)  # it retries a 503 with the same key
    with pytest.raises(APIStatusError) as caught:
        await openai.completions.create(
            model="tiny-llama", prompt="Transfer 100 to account", max_tokens=2,
            extra_headers={"Idempotency-Key": "transfer-100"})
    await openai.close()
    assert counted.generated == 1 and app[LEDGER].tree_head()[0] == ENV + 1  # 3 tries, 1 record
    error = caught.value
    assert error.status_code == 503
    assert isinstance(error.body, dict) and error.body["type"] == "server_error"
    record_id = error.body["record_id"]
    assert "content vault could not keep its content" in error.body["message"]
    assert app[LEDGER].get_record(record_id) is not None


async def test_a_repeat_sent_while_the_first_runs_gets_its_answer_after_the_vault_failed(
    aiohttp_client: MakeClient, tmp_path: Path, tiny_generator: Any
) -> None:
    counted = CountingGenerator(tiny_generator)
    client, app, tokens = await _start(aiohttp_client, tmp_path, counted)
    _break_the_vault(app)
    counted.gate.clear()
    body = {"prompt": "pay invoice 10", "max_new_tokens": 2}
    headers = {**bearer(tokens["client"]), "Idempotency-Key": "invoice-10"}
    first = asyncio.ensure_future(client.post("/v1/generate", json=body, headers=headers))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while counted.generated == 0:  # the first one is in the model: the key is claimed
        assert loop.time() < deadline, "the first request never reached the model"
        await asyncio.sleep(0.01)
    repeat = asyncio.ensure_future(client.post("/v1/generate", json=body, headers=headers))
    await asyncio.sleep(0)  # (whether the repeat waits or finds it stored, it answers alike)
    counted.gate.set()
    one, two = await first, await repeat
    assert counted.generated == 1 and app[LEDGER].tree_head()[0] == ENV + 1
    assert one.status == two.status == 503
    assert (await one.json())["record_id"] == (await two.json())["record_id"]


# --- streams -------------------------------------------------------------------------------


def _stream_body(route: str, prompt: str) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "tiny-llama", "max_tokens": 2, "stream": True}
    if route == "/v1/chat/completions":
        return body | {"messages": [{"role": "user", "content": prompt}]}
    return body | {"prompt": prompt}


def _no_internal_text(text: str) -> None:
    for internal in ("vault_content", "no such table", "sqlite", "Traceback", "refused by"):
        assert internal.lower() not in text.lower(), internal


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
async def test_a_stream_whose_content_the_vault_failed_to_keep_names_its_committed_records(
    unstreamed: Any, route: str
) -> None:
    client, app, tokens = unstreamed
    _break_the_vault(app)
    response = await client.post(route, json=_stream_body(route, "pay invoice 11"),
                                 headers=bearer(tokens["client"]))
    text = await response.text()
    # A failure before any text left is an ordinary error answer: no chunk, no output.
    assert response.status == 503 and response.content_type == "application/json"
    assert "data:" not in text
    assert response.headers["Retry-After"] == "1"  # streams take no key: a retry is new
    _no_internal_text(text)
    error = json.loads(text)["error"]
    assert error["type"] == "server_error"
    assert "the record was committed" in error["message"]
    assert "content vault could not keep its content" in error["message"]
    assert "could not be committed" not in error["message"]
    assert "input_salt" not in error and "output_salt" not in error  # as without streaming
    # Exactly the request's two records are in the log, and the error names both.
    ledger = app[LEDGER]
    assert ledger.tree_head()[0] == ENV + 2
    done_row = ledger.get_record(error["record_id"])
    start_row = ledger.get_record(error["stream_start_record_id"])
    assert done_row is not None and start_row is not None
    assert {start_row.leaf_index, done_row.leaf_index} == {ENV, ENV + 1}
    done, start = json.loads(done_row.leaf_body), json.loads(start_row.leaf_body)
    assert start["schema"] == STREAM_START_KIND
    assert done["stream"]["start_record_id"] == start["record_id"]
    assert error["record_id"] in error["message"]
    assert error["stream_start_record_id"] in error["message"]


async def test_the_openai_client_reads_the_committed_record_of_a_failed_stream(
    unstreamed: Any
) -> None:
    from openai import APIStatusError, AsyncOpenAI

    client, app, tokens = unstreamed
    _break_the_vault(app)
    openai = AsyncOpenAI(base_url=str(client.make_url("/v1")), api_key=tokens["client"],
                         max_retries=0)
    with pytest.raises(APIStatusError) as caught:
        await openai.chat.completions.create(
            model="tiny-llama", messages=[{"role": "user", "content": "pay invoice 12"}],
            max_tokens=2, stream=True)
    await openai.close()
    error = caught.value
    assert error.status_code == 503 and isinstance(error.body, dict)
    assert "the record was committed" in error.body["message"]
    assert app[LEDGER].get_record(error.body["record_id"]) is not None
    assert app[LEDGER].tree_head()[0] == ENV + 2


async def test_a_stream_whose_record_could_not_be_appended_says_so(unstreamed: Any) -> None:
    client, app, tokens = unstreamed
    with app[LEDGER].engine.begin() as conn:  # a real failure of the completed record only
        conn.execute(text("CREATE TRIGGER refuse_completed BEFORE INSERT ON records "
                          # The first leaf naming an environment is the stream start.
                          "WHEN NEW.environment_index IS NOT NULL AND EXISTS (SELECT 1 "
                          "FROM records WHERE environment_index IS NOT NULL) "
                          "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"))
    route = "/v1/completions"
    response = await client.post(route, json=_stream_body(route, "pay invoice 13"),
                                 headers=bearer(tokens["client"]))
    body = await response.text()
    assert response.status == 503 and "data:" not in body
    _no_internal_text(body)
    error = json.loads(body)["error"]
    assert "record_id" not in error  # nothing committed to name as the request's record
    assert "the audit record could not be committed" in error["message"]
    # Only the start record is in the log, and the error says which it is.
    assert app[LEDGER].tree_head()[0] == ENV + 1
    with app[LEDGER].engine.connect() as conn:
        rows = conn.execute(text("SELECT record_id, leaf_index FROM records "
                                 "WHERE leaf_index >= :env"), {"env": ENV}).all()
    assert len(rows) == 1  # after the environment leaf
    start_row = app[LEDGER].get_record(rows[0].record_id)
    assert start_row is not None
    assert json.loads(start_row.leaf_body)["schema"] == STREAM_START_KIND
    assert f"stream start record {rows[0].record_id}" in error["message"]


def _refuse_completed_records(app: Any) -> None:
    with app[LEDGER].engine.begin() as conn:  # a real failure of the completed record only
        conn.execute(text("CREATE TRIGGER refuse_completed BEFORE INSERT ON records "
                          # The first leaf naming an environment is the stream start.
                          "WHEN NEW.environment_index IS NOT NULL AND EXISTS (SELECT 1 "
                          "FROM records WHERE environment_index IS NOT NULL) "
                          "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"))


async def _stream_until_failure(client: Any, token: str, route: str, held: HeldSeal
                                ) -> tuple[list[dict[str, Any]], str]:
    """Text first (the records are sealed only once some arrived), then the end."""
    body = _stream_body(route, "pay invoice 14") | {"max_tokens": 8, "temperature": 0}
    response = await client.post(route, json=body, headers=bearer(token))
    assert response.status == 200  # the headers left with the first text
    lines: list[str] = []
    while True:
        line = (await response.content.readline()).decode()
        if not line:
            break
        if line.startswith("data: "):
            lines.append(line[len("data: "):].strip())
            chunk = json.loads(lines[-1])
            choice = (chunk.get("choices") or [{}])[0]
            if choice.get("text") or (choice.get("delta") or {}).get("content"):
                held.gate.set()  # text is out: now the records may be sealed
    assert "[DONE]" not in lines  # an error ends the stream
    return [json.loads(line) for line in lines], "\n".join(lines)


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
async def test_a_vault_failure_after_text_was_streamed_ends_with_an_error_naming_the_records(
    aiohttp_client: MakeClient, tmp_path: Path, tiny_generator: Any, route: str
) -> None:
    held = HeldSeal(tiny_generator)
    client, app, tokens = await _start(aiohttp_client, tmp_path, held)
    _break_the_vault(app)
    chunks, raw = await _stream_until_failure(client, tokens["client"], route, held)
    _no_internal_text(raw)
    error = chunks[-1]["error"]
    assert all("error" not in c and "audit" not in c for c in chunks[:-1])
    assert error["type"] == "server_error"
    assert "the record was committed" in error["message"]
    assert "content vault could not keep its content" in error["message"]
    assert "input_salt" not in raw and "output_salt" not in raw  # no receipt: no salts
    done = app[LEDGER].get_record(error["record_id"])
    start = app[LEDGER].get_record(error["stream_start_record_id"])
    assert done is not None and start is not None and app[LEDGER].tree_head()[0] == ENV + 2
    assert json.loads(done.leaf_body)["stream"]["start_record_id"] == start.record_id
    assert chunks[0]["id"].endswith(start.record_id)


async def test_the_openai_client_raises_on_an_error_after_streamed_text(
    aiohttp_client: MakeClient, tmp_path: Path, tiny_generator: Any
) -> None:
    from openai import APIError, AsyncOpenAI

    held = HeldSeal(tiny_generator)
    client, app, tokens = await _start(aiohttp_client, tmp_path, held)
    _refuse_completed_records(app)
    openai = AsyncOpenAI(base_url=str(client.make_url("/v1")), api_key=tokens["client"],
                         max_retries=0)
    received = ""
    try:
        stream = await openai.completions.create(
            model="tiny-llama", prompt="pay invoice 15", max_tokens=8, temperature=0,
            stream=True)
        with pytest.raises(APIError) as caught:
            async for chunk in stream:
                received += chunk.choices[0].text
                if received:
                    held.gate.set()
    finally:
        held.gate.set()
        await openai.close()
    error = caught.value
    assert received  # text had arrived before the error
    assert isinstance(error.body, dict)
    assert "the audit record could not be committed" in error.message
    assert "the text streamed so far has no completed record" in error.message
    assert app[LEDGER].tree_head()[0] == ENV + 1  # only the start record
    assert f"stream start record {chunk.id.removeprefix('cmpl-')}" in error.message


async def test_a_record_refused_after_text_was_streamed_says_it_was_not_committed(
    aiohttp_client: MakeClient, tmp_path: Path, tiny_generator: Any
) -> None:
    held = HeldSeal(tiny_generator)
    client, app, tokens = await _start(aiohttp_client, tmp_path, held)
    _refuse_completed_records(app)
    chunks, raw = await _stream_until_failure(client, tokens["client"], "/v1/chat/completions",
                                              held)
    _no_internal_text(raw)
    error = chunks[-1]["error"]
    assert "record_id" not in error  # nothing committed to name as the request's record
    assert error["message"].startswith("the audit record could not be committed")
    start_id = chunks[0]["id"].removeprefix("chatcmpl-")
    assert f"stream start record {start_id} is in the log" in error["message"]
    assert app[LEDGER].tree_head()[0] == ENV + 1


async def test_retention_days_beyond_the_bound_are_422_never_500(service: Any) -> None:
    client, app, tokens = service
    for days in (36_526, 10_000_000, 10**12, 10**30):
        response = await client.put("/v1/admin/retention", json={"mode": "content",
                                                                 "days": days},
                                    headers=bearer(tokens["admin"]))
        problem = await response.json()
        assert (response.status, problem["field"]) == (422, "days"), (days, problem)
    policy = await client.get("/v1/admin/retention", headers=bearer(tokens["admin"]))
    assert (await policy.json())["mode"] == "commitments"  # nothing changed
    # Generating for the tenant still works (no record committed without its content).
    answer = await client.post("/v1/generate", json={"prompt": "hi", "max_new_tokens": 2},
                               headers=bearer(tokens["client"]))
    assert answer.status == 200
