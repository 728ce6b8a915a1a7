"""Backpressure, dropping abandoned requests, idempotent retries and streaming, over real
HTTP on loopback with the tiny model (gated by events, never by sleeping)."""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from inference_wrapper.server.app import BATCHER, IDEMPOTENCY, KEYS, LEDGER, create_app
from inference_wrapper.server.settings import Settings
from ledger.leaves import commitments
from ledger.leaves.stream_start import STREAM_START_KIND
from tests.wrapped_generator import WrappedGenerator

MakeClient = Callable[..., Any]


class GatedGenerator(WrappedGenerator):
    """The tiny generator, but ``run_batch`` waits until the test opens the gate."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.batches: list[int] = []

    def run_batch(self, batch: Any, on_step: Any = None) -> Any:
        self.batches.append(len(batch.prompts))
        self.wait_for_gate()
        return super().run_batch(batch, on_step)


@pytest.fixture()
def settings(tmp_path: Path) -> Settings:
    return Settings(database_url=f"sqlite:///{tmp_path / 'ledger.db'}",
                    log_key_path=tmp_path / "log.key", max_wait_ms=1.0,
                    checkpoint_interval_s=0.1)


async def _until(predicate: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def bearer(token: str, **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", **extra}


async def _start(aiohttp_client: MakeClient, settings: Settings, generator: Any) -> Any:
    app = create_app(settings, generator)
    client = await aiohttp_client(app)
    return client, app, app[KEYS].create("bank-a", "client")[0]


# --- one bound on outstanding work ----------------------------------------------------


async def test_outstanding_work_beyond_the_bound_gets_503_with_retry_after(
    aiohttp_client: MakeClient, settings: Settings, tiny_generator: Any
) -> None:
    gated = GatedGenerator(tiny_generator)
    client, app, token = await _start(aiohttp_client, replace(settings, queue_limit=3,
                                                              max_batch=1), gated)
    first = [asyncio.ensure_future(client.post(
        "/v1/generate", json={"prompt": f"p{i}", "max_new_tokens": 2}, headers=bearer(token)))
        for i in range(3)]
    await _until(lambda: app[BATCHER].outstanding == 3 and len(gated.batches) == 1,
                 "three requests outstanding, one in the model")
    over = await client.post("/v1/generate", json={"prompt": "over", "max_new_tokens": 2},
                             headers=bearer(token))
    assert over.status == 503 and over.headers["Retry-After"] == "1"
    assert "outstanding" in (await over.json())["detail"]
    gated.gate.set()
    assert [r.status for r in await asyncio.gather(*first)] == [200, 200, 200]
    assert app[LEDGER].tree_head()[0] == 1 + 3  # the engine's environment leaf first


async def test_a_timed_out_queued_request_is_dropped_before_generate(
    aiohttp_client: MakeClient, settings: Settings, tiny_generator: Any
) -> None:
    gated = GatedGenerator(tiny_generator)
    client, app, token = await _start(aiohttp_client, replace(
        settings, max_batch=1, request_timeout_s=0.2), gated)
    in_model = asyncio.ensure_future(client.post(
        "/v1/generate", json={"prompt": "first", "max_new_tokens": 2}, headers=bearer(token)))
    await _until(lambda: len(gated.batches) == 1, "the first request in the model")
    queued = await client.post("/v1/generate", json={"prompt": "second", "max_new_tokens": 2},
                               headers=bearer(token))
    assert queued.status == 504
    assert (await in_model).status == 504
    assert app[BATCHER].dropped == 1
    gated.gate.set()
    await _until(lambda: app[BATCHER].outstanding == 0, "the first request committed")
    assert gated.batches == [1]  # the second never reached the model
    # The environment leaf, and the first one, in the model already, committed.
    assert app[LEDGER].tree_head()[0] == 2


async def test_a_queued_request_whose_caller_disconnected_is_dropped_before_generate(
    aiohttp_client: MakeClient, settings: Settings, tiny_generator: Any
) -> None:
    import aiohttp

    gated = GatedGenerator(tiny_generator)
    client, app, token = await _start(aiohttp_client, replace(settings, max_batch=1), gated)
    in_model = asyncio.ensure_future(client.post(
        "/v1/generate", json={"prompt": "first", "max_new_tokens": 2}, headers=bearer(token)))
    await _until(lambda: len(gated.batches) == 1, "the first request in the model")
    session = aiohttp.ClientSession()
    leaving = asyncio.ensure_future(session.post(
        client.make_url("/v1/generate"), json={"prompt": "second", "max_new_tokens": 2},
        headers=bearer(token)))
    await _until(lambda: app[BATCHER].outstanding == 2, "the second request queued")
    leaving.cancel()
    await session.close()  # the caller hangs up while its request waits
    await asyncio.wait([leaving])
    gated.gate.set()
    assert (await in_model).status == 200
    await _until(lambda: app[BATCHER].outstanding == 0, "the queue empty")
    assert gated.batches == [1]  # the second never reached the model
    assert app[BATCHER].dropped == 1
    assert app[LEDGER].tree_head()[0] == 2  # the environment leaf and the first record


# --- Idempotency-Key ----------------------------------------------------------------------


async def test_a_repeat_with_the_same_key_returns_the_original_answer(
    aiohttp_client: MakeClient, settings: Settings, tiny_generator: Any
) -> None:
    client, app, token = await _start(aiohttp_client, settings, tiny_generator)
    headers = bearer(token, **{"Idempotency-Key": "order-17"})
    body = {"prompt": "pay invoice 17", "max_new_tokens": 4, "temperature": 1.0}
    first = await client.post("/v1/generate", json=body, headers=headers)
    # Same JSON, other spacing and key order: the same request.
    again = await client.post("/v1/generate", data=json.dumps(dict(reversed(body.items())),
                              indent=2), headers={**headers, "Content-Type": "application/json"})
    assert first.status == again.status == 200
    one, two = await first.json(), await again.json()
    assert one == two  # salts included
    assert again.headers["X-Audit-Record-Id"] == one["record_id"]
    assert app[LEDGER].tree_head()[0] == 2  # the environment leaf and one record
    other = await client.post("/v1/generate", json={**body, "prompt": "pay invoice 18"},
                              headers=headers)
    assert other.status == 422
    assert (await other.json())["field"] == "Idempotency-Key"
    # Keys are per tenant: tenant b's "order-17" is another request.
    token_b = app[KEYS].create("bank-b", "client")[0]
    theirs = await client.post("/v1/generate", json=body,
                               headers=bearer(token_b, **{"Idempotency-Key": "order-17"}))
    assert theirs.status == 200 and (await theirs.json())["record_id"] != one["record_id"]
    assert app[LEDGER].tree_head()[0] == 3
    bad = await client.post("/v1/generate", json=body,
                            headers=bearer(token, **{"Idempotency-Key": "has space"}))
    assert bad.status == 422 and (await bad.json())["field"] == "Idempotency-Key"


async def test_openai_client_retrying_a_timed_out_request_makes_one_record_and_gets_it(
    aiohttp_client: MakeClient, settings: Settings, tiny_generator: Any
) -> None:
    import httpx2 as httpx
    from openai import AsyncOpenAI

    gated = GatedGenerator(tiny_generator)
    client, app, token = await _start(aiohttp_client, replace(settings, request_timeout_s=0.05),
                                      gated)
    key = f"retry-{uuid.uuid4().hex}"
    statuses: list[int] = []

    async def on_response(response: httpx.Response) -> None:
        statuses.append(response.status_code)
        if response.status_code == 504 and not gated.gate.is_set():
            # The server timed out while generating; let generation finish and wait until
            # its answer is stored, so the client's retry can only find it there.
            gated.gate.set()
            store = app[IDEMPOTENCY].store

            def stored() -> bool:
                found = store.get("bank-a", key)
                return found is not None and found.state == "done"

            loop = asyncio.get_running_loop()
            deadline = loop.time() + 60
            while not await asyncio.to_thread(stored):
                assert loop.time() < deadline, "the answer was never stored"
                await asyncio.sleep(0.01)

    http = httpx.AsyncClient(event_hooks={"response": [on_response]})
    openai = AsyncOpenAI(base_url=str(client.make_url("/v1")), api_key=token,
                         http_client=http)  # default retries (2)
    completion = await openai.completions.create(
        model="tiny-llama", prompt="Transfer 100 to account", max_tokens=4, temperature=0,
        extra_headers={"Idempotency-Key": key})
    await openai.close()
    assert statuses == [504, 200]
    assert gated.batches == [1]  # generated once
    assert app[LEDGER].tree_head()[0] == 2  # the environment leaf and one record
    audit = completion.model_extra["audit"]  # type: ignore[index]
    row = app[LEDGER].get_record(audit["record_id"])
    assert row is not None and row.leaf_index == audit["leaf_index"]
    held = json.loads(row.leaf_body)["commitments"]
    assert commitments.opens(held["input"], bytes.fromhex(audit["input_salt"]), "input",
                             b"Transfer 100 to account")
    assert commitments.opens(held["output"], bytes.fromhex(audit["output_salt"]), "output",
                             completion.choices[0].text.encode())


async def test_a_late_first_request_does_not_overwrite_the_claim_that_took_over_its_key(
    aiohttp_client: MakeClient, settings: Settings, tiny_generator: Any,
    caplog: pytest.LogCaptureFixture
) -> None:
    gated = GatedGenerator(tiny_generator)
    client, app, token = await _start(aiohttp_client, settings, gated)
    idempotency = app[IDEMPOTENCY]
    headers = bearer(token, **{"Idempotency-Key": "slow-17"})
    body = {"prompt": "pay invoice 17", "max_new_tokens": 3}
    first = asyncio.ensure_future(client.post("/v1/generate", json=body, headers=headers))
    await _until(lambda: gated.batches == [1], "the first request in the model")
    held = idempotency.store.get("bank-a", "slow-17")
    assert held is not None and held.state == "pending"
    # Its claim counts as stale now (as if its process had died): the next one takes over.
    idempotency.stale_after_s = -1.0
    second = asyncio.ensure_future(client.post("/v1/generate", json=body, headers=headers))

    def taken_over() -> bool:
        found = idempotency.store.get("bank-a", "slow-17")
        return found is not None and found.owner != held.owner

    await _until(taken_over, "the second request to take the key over")
    idempotency.stale_after_s = 600.0
    gated.gate.set()
    late, taker = await (await first).json(), await (await second).json()
    assert late["record_id"] != taker["record_id"]  # a takeover generates again
    # The late first one stored nothing over the taker's claim: a retry gets the taker's.
    again = await client.post("/v1/generate", json=body, headers=headers)
    assert await again.json() == taker
    assert "another request took its stale key over" in caplog.text


# --- streaming ----------------------------------------------------------------------------


async def test_streamed_chat_with_the_official_client_ends_with_the_receipt(
    aiohttp_client: MakeClient, settings: Settings, tiny_generator: Any
) -> None:
    from openai import AsyncOpenAI

    client, app, token = await _start(aiohttp_client, settings, tiny_generator)
    openai = AsyncOpenAI(base_url=str(client.make_url("/v1")), api_key=token, max_retries=0)
    stream = await openai.chat.completions.create(
        model="tiny-llama", messages=[{"role": "user", "content": "Say hi"}], max_tokens=12,
        temperature=0, stream=True)
    chunks = [chunk async for chunk in stream]
    await openai.close()
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    final = chunks[-1]
    assert final.choices[0].finish_reason in ("stop", "length")
    audit = final.model_extra["audit"]  # type: ignore[index]
    assert all(c.model_extra.get("audit") is None for c in chunks[:-1])  # type: ignore[union-attr]
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].id == f"chatcmpl-{audit['stream_start_record_id']}"

    ledger = app[LEDGER]
    start_row = ledger.get_record(audit["stream_start_record_id"])
    done_row = ledger.get_record(audit["record_id"])
    assert start_row is not None and done_row is not None
    assert start_row.leaf_index == audit["stream_start_leaf_index"] < done_row.leaf_index
    start, done = json.loads(start_row.leaf_body), json.loads(done_row.leaf_body)
    assert start["schema"] == STREAM_START_KIND and set(start["commitments"]) == {"input"}
    assert "input_bytes" not in start["data"] and "hardware" not in start  # decision 0043
    assert done["stream"]["start_record_id"] == start["record_id"]
    salt_in, salt_out = (bytes.fromhex(audit["input_salt"]), bytes.fromhex(audit["output_salt"]))
    tokenizer = tiny_generator.loaded.tokenizer
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Say hi"}],
                                           tokenize=False, add_generation_prompt=True)
    assert commitments.opens(start["commitments"]["input"], salt_in, commitments.INPUT,
                             prompt.encode())
    assert start["commitments"]["input"] == done["commitments"]["input"]
    # The start record is still a v1 kind; the final record is audit-record/v2, whose
    # labelled commitments the same salts open.
    assert commitments.opens(done["commitments"]["input"], salt_in, "input", prompt.encode())
    assert commitments.opens(done["commitments"]["output"], salt_out, "output", text.encode())
    assert start["data"]["generation"]["max_new_tokens"] == 12


async def test_streamed_completion_over_raw_sse(
    aiohttp_client: MakeClient, settings: Settings, tiny_generator: Any
) -> None:
    client, app, token = await _start(aiohttp_client, settings, tiny_generator)
    response = await client.post("/v1/completions", json={
        "model": "tiny-llama", "prompt": "Once upon", "max_tokens": 6, "temperature": 0,
        "stream": True}, headers=bearer(token))
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("text/event-stream")
    events = [line[len("data: "):] for line in (await response.text()).split("\n\n")
              if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    audit = chunks[-1]["audit"]
    row = app[LEDGER].get_record(audit["record_id"])
    assert row is not None
    record = json.loads(row.leaf_body)
    text = "".join(c["choices"][0]["text"] for c in chunks)
    assert commitments.opens(record["commitments"]["output"],
                             bytes.fromhex(audit["output_salt"]), "output", text.encode())
    fetched = await (await client.get(f"/v1/records/{audit['stream_start_record_id']}",
                                      headers=bearer(token))).json()
    assert fetched["record"]["schema"] == STREAM_START_KIND
    assert base64.b64decode(fetched["canonical_base64"]) == app[LEDGER].get_record(
        audit["stream_start_record_id"]).canonical  # type: ignore[union-attr]


# --- API keys from memory -----------------------------------------------------------------


async def test_a_key_revoked_by_another_process_stops_working_within_the_ttl(
    aiohttp_client: MakeClient, settings: Settings, tiny_generator: Any
) -> None:
    from ledger.store.apikeys import ApiKeyStore
    from ledger.store.sql import make_engine

    client, app, _ = await _start(aiohttp_client, replace(settings, api_key_cache_ttl_s=0.2),
                                  tiny_generator)
    engine = make_engine(settings.database_url)
    elsewhere = ApiKeyStore(engine)  # e.g. `audit-ledger keys` in another process
    token, key = elsewhere.create("bank-c", "client")

    async def status() -> int:
        return int((await client.get("/v1/models", headers=bearer(token))).status)

    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while await status() != 200:  # a key created elsewhere is known after a reload
        assert loop.time() < deadline, "the new key was never accepted"
        await asyncio.sleep(0.05)
    assert elsewhere.revoke(key.key_id)
    deadline = loop.time() + 60
    while await status() != 401:
        assert loop.time() < deadline, "the revoked key was still accepted"
        await asyncio.sleep(0.05)
    engine.dispose()


async def test_no_chunk_leaves_when_the_start_record_cannot_be_committed(
    aiohttp_client: MakeClient, settings: Settings, tiny_generator: Any,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    from ledger.errors import BackendUnavailableError

    client, app, token = await _start(aiohttp_client, settings, tiny_generator)

    async def broken(record: Any) -> Any:
        raise BackendUnavailableError("database is down")

    monkeypatch.setattr(app[LEDGER], "append_async", broken)
    response = await client.post("/v1/chat/completions", json={
        "model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4, "stream": True}, headers=bearer(token))
    assert response.status == 503
    assert response.content_type == "application/json"  # OpenAI's error shape
    text = await response.text()
    assert "data:" not in text and "database is down" not in text
    assert json.loads(text)["error"]["type"]
    # Only the environment leaf, written when the engine started.
    assert app[BATCHER].outstanding == 0 and app[LEDGER].tree_head()[0] == 1


def test_expired_receipts_are_purged(settings: Settings) -> None:
    from ledger.store.migrate import upgrade
    from ledger.store.receipts import ReceiptStore
    from ledger.store.sql import make_engine

    upgrade(settings.database_url)
    engine = make_engine(settings.database_url)
    kept, expired = ReceiptStore(engine), ReceiptStore(engine, ttl_s=-1)
    assert kept.claim("bank-a", "k1", b"x" * 32, stale_after_s=600, owner="a") is None
    assert expired.claim("bank-a", "k2", b"y" * 32, stale_after_s=600, owner="b") is None
    assert expired.complete("bank-a", "k2", "b", {"body": {"salt": "ab"}, "headers": {}})
    assert kept.purge() == 1
    assert kept.get("bank-a", "k2") is None
    held = kept.get("bank-a", "k1")
    assert held is not None and held.state == "pending"
    # The same key again, other body: the holder is returned to the caller to compare.
    again = kept.claim("bank-a", "k1", b"z" * 32, stale_after_s=600, owner="c")
    assert again is not None and kept.same_request("bank-a", "k1", again, b"x" * 32)
    assert not kept.same_request("bank-a", "k1", again, b"z" * 32)
    engine.dispose()
