"""Token streaming over real HTTP on loopback with the tiny model: text leaves while the
batch generates, only after the start record is durable; the deltas join to exactly the
text the completed record commits to; a streamed and a plain request share a batch; a
caller that leaves mid-stream costs nothing. Gated by events, never by sleeping."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from inference_wrapper.engine.generate import streamable_text
from inference_wrapper.server.app import BATCHER, KEYS, LEDGER, create_app
from inference_wrapper.server.settings import Settings
from ledger.canonical import canonical_bytes
from ledger.leaves import commitments
from ledger.leaves.stream_start import STREAM_START_KIND
from tests.wrapped_generator import WrappedGenerator

MakeClient = Callable[..., Any]
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"


@pytest.fixture()
def settings(tmp_path: Path) -> Settings:
    return Settings(database_url=f"sqlite:///{tmp_path / 'ledger.db'}",
                    log_key_path=tmp_path / "log.key", max_wait_ms=1.0,
                    checkpoint_interval_s=0.1)


async def _start(aiohttp_client: MakeClient, settings: Settings, generator: Any) -> Any:
    app = create_app(settings, generator)
    client = await aiohttp_client(app)
    return client, app, app[KEYS].create("bank-a", "client")[0]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _body(route: str, prompt: str, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "tiny-llama", **extra}
    if route == CHAT:
        return body | {"messages": [{"role": "user", "content": prompt}]}
    return body | {"prompt": prompt}


async def events(response: Any) -> AsyncIterator[Any]:
    """Each ``data:`` line's value as it arrives (``"[DONE]"`` as the string)."""
    while True:
        line = await response.content.readline()
        if not line:
            return
        line = line.strip()
        if line.startswith(b"data: "):
            data = line[len(b"data: "):].decode()
            yield data if data == "[DONE]" else json.loads(data)


def delta(chunk: dict[str, Any]) -> str:
    choice = chunk["choices"][0]
    return str(choice["delta"].get("content") or "") if "delta" in choice else str(choice["text"])


def plain_text(route: str, answer: dict[str, Any]) -> str:
    choice = answer["choices"][0]
    return str(choice["message"]["content"] if route == CHAT else choice["text"])


class PausedModel:
    """The model's forward blocks on its ``pause_at``-th call until the test releases it:
    generation stops mid-batch, inside ``model.generate``."""

    def __init__(self, model: Any, monkeypatch: pytest.MonkeyPatch, pause_at: int) -> None:
        self.calls, self.pause_at = 0, pause_at
        self.paused, self.release = threading.Event(), threading.Event()
        forward = model.forward

        def paused_forward(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            if self.calls == self.pause_at:
                self.paused.set()
                assert self.release.wait(120), "the test never released the model"
            return forward(*args, **kwargs)

        monkeypatch.setattr(model, "forward", paused_forward)


def _record(app: Any, record_id: str) -> dict[str, Any] | None:
    row = app[LEDGER].get_record(record_id)
    return None if row is None else dict(json.loads(row.leaf_body))


# --- text leaves while the batch generates ---------------------------------------------


@pytest.mark.parametrize("route", [CHAT, COMPLETIONS])
async def test_text_arrives_while_the_model_is_still_generating(
    aiohttp_client: MakeClient, settings: Settings, tiny_generator: Any,
    monkeypatch: pytest.MonkeyPatch, route: str
) -> None:
    # 1 prefill + 4 steps: 5 tokens are out when the 6th forward blocks.
    model = PausedModel(tiny_generator.loaded.model, monkeypatch, pause_at=6)
    client, app, token = await _start(aiohttp_client, settings, tiny_generator)
    try:
        response = await client.post(route, json=_body(
            route, "pay invoice 13", max_tokens=16, temperature=0, stream=True),
            headers=bearer(token))
        assert response.status == 200
        chunks, streamed = [], ""
        stream = events(response)
        async for event in stream:
            chunks.append(event)
            streamed += delta(event)
            if streamed:
                break
        # The first text is here, and generate cannot end before the test releases it.
        assert await asyncio.to_thread(model.paused.wait, 60), "the model never paused"
        assert app[BATCHER].in_model == 1
        start_id = chunks[0]["id"].split("-", 1)[1]
        start = _record(app, start_id)  # durable before the first text left
        assert start is not None and start["schema"] == STREAM_START_KIND
        # The environment leaf and the start record: the completed record is not there yet.
        assert app[LEDGER].tree_head()[0] == 2
        model.release.set()
        async for event in stream:
            if event == "[DONE]":
                break
            chunks.append(event)
            if "audit" in event:  # the final chunk: its record is durable already
                assert _record(app, event["audit"]["record_id"]) is not None
            streamed += delta(event)
    finally:
        model.release.set()
    audit = chunks[-1]["audit"]
    done = _record(app, audit["record_id"])
    assert done is not None and done["stream"]["start_record_id"] == start_id
    assert commitments.opens(done["commitments"]["output"],
                             bytes.fromhex(audit["output_salt"]), "output", streamed.encode())
    assert done["data"]["output_token_count"] == 16 and len(streamed) == 16


# --- the deltas join to exactly the recorded text --------------------------------------


def _stop_in(text: str) -> str:
    """Characters from the middle of ``text``: a stop sequence over several tokens (one
    per UTF-8 byte) that the generation does hit, after some text."""
    for size in (3, 2):
        for i in range(1, len(text) - size):
            stop = text[i:i + size]
            if text.find(stop) >= 1 and "\ufffd" not in stop and len(stop.encode()) >= 2:
                return stop
    raise AssertionError(f"no stop sequence to take from {text!r}")


CASES = [  # prompt, sampling seed (None: greedy), with a stop sequence
    ("pay invoice 13", None, False),
    ("pay invoice 13", 3, True),
    ("Say hi", None, False),  # cut UTF-8 sequences: replacement characters held back
    ("Once upon", 7, False),
    ("Once upon", 7, True),
    ("hello world", 11, True),
    ("A long story", 5, False),
]


@pytest.mark.parametrize("route", [CHAT, COMPLETIONS])
@pytest.mark.parametrize(("prompt", "seed", "with_stop"), CASES)
async def test_streamed_deltas_join_to_the_text_the_record_commits_to(
    aiohttp_client: MakeClient, settings: Settings, tiny_generator: Any, route: str,
    prompt: str, seed: int | None, with_stop: bool
) -> None:
    client, app, token = await _start(aiohttp_client, settings, tiny_generator)
    sampling = {"temperature": 0} if seed is None else {"temperature": 1.0, "seed": seed}
    base = _body(route, prompt, max_tokens=24, **sampling)
    if with_stop:
        full = await (await client.post(route, json=base, headers=bearer(token))).json()
        stop = _stop_in(plain_text(route, full))
        base["stop"] = [stop, "never in the text"]
    plain = await (await client.post(route, json=base, headers=bearer(token))).json()
    expected = plain_text(route, plain)
    if with_stop:
        assert plain["choices"][0]["finish_reason"] == "stop"
        assert stop not in expected and expected

    response = await client.post(route, json=base | {"stream": True}, headers=bearer(token))
    chunks = [event async for event in events(response)]
    assert chunks[-1] == "[DONE]"
    streamed = "".join(delta(c) for c in chunks[:-1])
    assert streamed == expected
    final = chunks[-2]
    assert final["choices"][0]["finish_reason"] == plain["choices"][0]["finish_reason"]
    audit = final["audit"]
    done = _record(app, audit["record_id"])
    assert done is not None
    assert commitments.opens(done["commitments"]["output"],
                             bytes.fromhex(audit["output_salt"]), "output", streamed.encode())
    assert all("audit" not in c for c in chunks[:-2])


@pytest.mark.parametrize("route", [CHAT, COMPLETIONS])
async def test_the_official_client_streams_the_recorded_text_with_a_stop_sequence(
    aiohttp_client: MakeClient, settings: Settings, tiny_generator: Any, route: str
) -> None:
    from openai import AsyncOpenAI

    client, app, token = await _start(aiohttp_client, settings, tiny_generator)
    openai = AsyncOpenAI(base_url=str(client.make_url("/v1")), api_key=token, max_retries=0)
    args: dict[str, Any] = {"model": "tiny-llama", "max_tokens": 24, "temperature": 1.0,
                            "seed": 7}
    try:
        if route == CHAT:
            messages: Any = [{"role": "user", "content": "pay invoice 13"}]
            full = await openai.chat.completions.create(messages=messages, **args)
            args["stop"] = [_stop_in(full.choices[0].message.content or "")]
            plain = await openai.chat.completions.create(messages=messages, **args)
            expected = plain.choices[0].message.content
            stream = await openai.chat.completions.create(messages=messages, stream=True,
                                                          **args)
            chunks = [chunk async for chunk in stream]
            streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
        else:
            full_completion = await openai.completions.create(prompt="pay invoice 13", **args)
            args["stop"] = [_stop_in(full_completion.choices[0].text)]
            plain_completion = await openai.completions.create(prompt="pay invoice 13", **args)
            expected = plain_completion.choices[0].text
            completion_stream = await openai.completions.create(
                prompt="pay invoice 13", stream=True, **args)
            chunks = [chunk async for chunk in completion_stream]  # type: ignore[misc]
            streamed = "".join(c.choices[0].text for c in chunks)  # type: ignore[union-attr]
    finally:
        await openai.close()
    assert streamed == expected and args["stop"][0] not in streamed
    assert chunks[-1].choices[0].finish_reason == "stop"
    audit = chunks[-1].model_extra["audit"]  # type: ignore[index]
    done = _record(app, audit["record_id"])
    assert done is not None and commitments.opens(
        done["commitments"]["stop"], bytes.fromhex(audit["input_salt"]), "stop",
        canonical_bytes(list(args["stop"])))
    assert commitments.opens(done["commitments"]["output"],
                             bytes.fromhex(audit["output_salt"]), "output", streamed.encode())


def test_only_text_that_can_no_longer_change_is_streamable(tiny_generator: Any) -> None:
    tokenizer = tiny_generator.loaded.tokenizer

    def ids(text: str) -> list[int]:  # one token per UTF-8 byte
        return list(tokenizer.encode(text, add_special_tokens=False))

    euro = ids("a€")
    assert len(euro) == 4
    assert streamable_text(tokenizer, euro[:2], ()) == ("a", False)  # the € is cut short
    assert streamable_text(tokenizer, euro, ()) == ("a€", False)
    assert streamable_text(tokenizer, ids("abc S"), ("STOP",)) == ("abc ", False)
    assert streamable_text(tokenizer, ids("abc SA"), ("STOP",)) == ("abc SA", False)
    assert streamable_text(tokenizer, ids("abc STO"), ("X", "STOP")) == ("abc ", False)
    assert streamable_text(tokenizer, ids("abc STX"), ("STOP",)) == ("abc STX", False)
    assert streamable_text(tokenizer, ids("abc STOP and"), ("STOP", "c S")) == ("ab", True)


# --- a streamed and a plain request in one batch ---------------------------------------


class GatedGenerator(WrappedGenerator):
    """The tiny generator; ``run_batch`` waits for the gate and notes whether it was
    given a step callback (a streamer)."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.streamed: list[bool] = []

    def run_batch(self, batch: Any, on_step: Any = None) -> Any:
        self.streamed.append(on_step is not None)
        self.wait_for_gate()
        return super().run_batch(batch, on_step)


async def _mixed_batch(aiohttp_client: MakeClient, settings: Settings, tiny_generator: Any,
                       stream: bool) -> tuple[str, dict[str, Any], list[bool], str]:
    gated = GatedGenerator(tiny_generator)
    client, app, token = await _start(aiohttp_client, replace(settings, max_batch=2), gated)
    params = {"max_tokens": 12, "temperature": 0}
    blocker = asyncio.ensure_future(client.post(COMPLETIONS, json=_body(
        COMPLETIONS, "first in", **params), headers=bearer(token)))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while len(gated.streamed) < 1:  # the blocker is in the model, held at the gate
        assert loop.time() < deadline, "the first batch never reached the model"
        await asyncio.sleep(0.01)
    streamed_call = asyncio.ensure_future(client.post(COMPLETIONS, json=_body(
        COMPLETIONS, "Say hi", stream=stream, **params), headers=bearer(token)))
    plain_call = asyncio.ensure_future(client.post(COMPLETIONS, json=_body(
        COMPLETIONS, "hello world, again", **params), headers=bearer(token)))
    while app[BATCHER].depth < 2:  # both wait: they leave the queue as one batch
        assert loop.time() < deadline, "the two requests never queued"
        await asyncio.sleep(0.01)
    gated.gate.set()
    assert (await blocker).status == 200
    first, plain = await streamed_call, await (await plain_call).json()
    if stream:
        text = "".join(delta(c) for c in [e async for e in events(first)] if c != "[DONE]")
    else:
        text = plain_text(COMPLETIONS, await first.json())
    record = _record(app, plain["audit"]["record_id"])
    assert record is not None and record["batch"]["size"] == 2
    return text, plain, gated.streamed, str(record["batch"]["id"])


async def test_a_plain_request_batched_with_a_streamed_one_gets_the_same_answer(
    aiohttp_client: MakeClient, settings: Settings, tiny_generator: Any
) -> None:
    streamed, plain, calls, _ = await _mixed_batch(aiohttp_client, settings, tiny_generator,
                                                   stream=True)
    alone, plain_again, calls_again, _ = await _mixed_batch(aiohttp_client, settings,
                                                            tiny_generator, stream=False)
    assert calls == [False, True]  # a batch with no streamed request has no streamer
    assert calls_again == [False, False]
    assert plain["choices"] == plain_again["choices"]
    assert plain["usage"] == plain_again["usage"]
    assert streamed == alone


# --- a caller that leaves mid-stream ------------------------------------------------------


async def test_a_caller_that_leaves_mid_stream_still_gets_its_record_committed(
    aiohttp_client: MakeClient, settings: Settings, tiny_generator: Any,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    model = PausedModel(tiny_generator.loaded.model, monkeypatch, pause_at=4)
    # A batch leaves the queue only when both requests wait: one generate for the two.
    client, app, token = await _start(aiohttp_client, replace(
        settings, max_batch=2, max_wait_ms=600_000.0), tiny_generator)
    params = {"max_tokens": 16, "temperature": 0}
    try:
        plain_call = asyncio.ensure_future(client.post(COMPLETIONS, json=_body(
            COMPLETIONS, "hello world", **params), headers=bearer(token)))
        response = await client.post(CHAT, json=_body(CHAT, "pay invoice 13", stream=True,
                                                      **params), headers=bearer(token))
        assert response.status == 200
        start_id = ""
        async for event in events(response):
            start_id = event["id"].split("-", 1)[1]
            if delta(event):
                break
        assert await asyncio.to_thread(model.paused.wait, 60), "the model never paused"
        assert app[BATCHER].in_model == 2
        response.close()  # the caller leaves mid-stream
        model.release.set()
        plain = await plain_call
        assert plain.status == 200  # the other row of the batch is unaffected
        answer = await plain.json()
    finally:
        model.release.set()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while app[BATCHER].outstanding or app[LEDGER].tree_head()[0] < 4:  # with the environment
        assert loop.time() < deadline, "the left stream's record was never committed"
        await asyncio.sleep(0.01)
    rows = [json.loads(r) for r in _canonicals(app)]
    completed = [r for r in rows if r.get("stream", {}).get("start_record_id") == start_id]
    assert len(completed) == 1 and completed[0]["data"]["output_token_count"] == 16
    assert completed[0]["batch"]["id"] == _record(
        app, answer["audit"]["record_id"])["batch"]["id"]  # type: ignore[index]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def _canonicals(app: Any) -> list[bytes]:
    """Every leaf as readers parse it: a v2 leaf's body, a v1 leaf's bytes."""
    return [row.leaf_body for row in app[LEDGER].iter_records()]


class DifferentText(WrappedGenerator):
    """A deliberate bug: the answer's text is not what was streamed. Sealing waits until
    the test has seen text, so the mismatch is found at the end."""

    def seal(self, batch: Any, log: Any = None) -> Any:
        self.wait_for_gate()
        return [replace(out, text="#" + out.text) for out in self.inner.seal(batch, log)]


async def test_a_recorded_text_other_than_the_streamed_one_ends_with_an_error_not_a_receipt(
    aiohttp_client: MakeClient, settings: Settings, tiny_generator: Any,
    caplog: pytest.LogCaptureFixture
) -> None:
    wrong = DifferentText(tiny_generator)
    client, app, token = await _start(aiohttp_client, settings, wrong)
    response = await client.post(COMPLETIONS, json=_body(
        COMPLETIONS, "pay invoice 13", max_tokens=8, temperature=0, stream=True),
        headers=bearer(token))
    chunks = []
    try:
        async for event in events(response):
            chunks.append(event)
            if event != "[DONE]" and "error" not in event and delta(event):
                wrong.gate.set()
    finally:
        wrong.gate.set()
    assert "[DONE]" not in chunks and all("audit" not in c for c in chunks)
    error = chunks[-1]["error"]
    assert "differs from the output the completed record" in error["message"]
    assert "receipt is withheld" in error["message"]
    assert "streamed text is not a prefix of the recorded output" in caplog.text
