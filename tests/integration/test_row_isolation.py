"""Issue 22: building one row's record never fails another row. A row whose record
cannot be built (a value validation would never let through, put in after it) is
answered alone, plain or streamed, with a fixed error and no internal text; its batch
mates, other tenants' plain and streamed requests in the same batch, all succeed, and
every one of their answers opens its committed record, which names the batch as it ran.
Real HTTP on loopback, the tiny model, a SQLite ledger; gated on the engine, never on
sleeping."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from inference_wrapper.audit.generator import PreparedRequest
from inference_wrapper.server.app import BATCHER, KEYS, LEDGER, create_app
from inference_wrapper.server.settings import Settings
from ledger.leaves import commitments
from tests.wrapped_generator import WrappedGenerator

MakeClient = Callable[..., Awaitable[Any]]
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
MARK = "poison-row"  # the prompt of a request whose record is made unbuildable
LONE = "\ud800"
INTERNAL = ("surrogate", "utf-8", "codec", "canonical", "encode character", "\\ud800",
            LONE, "Traceback", "record.")


def _poisoned(request: PreparedRequest, how: str) -> PreparedRequest:
    if how == "stop":  # its commitments cannot be computed (before the record builder)
        return replace(request, stop=(LONE,))
    return replace(request, tenant=request.tenant + LONE)  # the record builder fails


class PoisonRow(WrappedGenerator):
    """The first batch (a blocker) waits at the gate, so the test's requests queue up
    and run as one batch; at sealing, the request whose prompt holds ``MARK`` gets a
    value its record cannot encode."""

    def __init__(self, inner: Any, how: str) -> None:
        super().__init__(inner)
        self.how = how
        self.holding = threading.Event()
        self.batches = 0

    def run_batch(self, batch: Any, on_step: Any = None) -> Any:
        self.batches += 1
        if self.batches == 1:
            self.holding.set()
            self.wait_for_gate()
        return super().run_batch(batch, on_step)

    def seal(self, batch: Any, log: Any = None) -> Any:
        requests = [_poisoned(r, self.how) if MARK in r.prompt else r
                    for r in batch.requests]
        return self.inner.seal(replace(batch, requests=requests), log)


def _body(route: str, prompt: str, stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "tiny-llama", "max_tokens": 6, "temperature": 0,
                            "stream": stream}
    if route == CHAT:
        return body | {"messages": [{"role": "user", "content": prompt}]}
    return body | {"prompt": prompt}


def _sse(text: str) -> list[Any]:
    return [line[6:] if line[6:] == "[DONE]" else json.loads(line[6:])
            for line in text.splitlines() if line.startswith("data: ")]


def _delta(chunk: dict[str, Any]) -> str:
    choice = chunk["choices"][0]
    return str(choice["delta"].get("content") or "") if "delta" in choice else str(choice["text"])


@pytest.mark.parametrize("how", ["stop", "tenant"])
async def test_a_row_that_cannot_be_recorded_fails_alone(
        aiohttp_client: MakeClient, tmp_path: Path, tiny_generator: Any, how: str) -> None:
    generator = PoisonRow(tiny_generator, how)
    app = create_app(Settings(database_url=f"sqlite:///{tmp_path / 'ledger.db'}",
                              log_key_path=tmp_path / "log.key", max_wait_ms=1.0,
                              checkpoint_interval_s=0.1), generator)
    client = await aiohttp_client(app)
    a, b = (app[KEYS].create(tenant, "client")[0] for tenant in ("bank-a", "bank-b"))

    async def post(token: str, route: str, prompt: str, stream: bool) -> tuple[int, str]:
        response = await client.post(route, json=_body(route, prompt, stream),
                                     headers={"Authorization": f"Bearer {token}"})
        return response.status, await response.text()

    blocker = asyncio.ensure_future(post(b, COMPLETIONS, "blocker", False))
    assert await asyncio.to_thread(generator.holding.wait, 60), "the blocker never ran"
    asks = [(a, COMPLETIONS, f"{MARK} plain", False), (a, CHAT, f"{MARK} streamed", True),
            *((b, COMPLETIONS, f"b plain {i}", False) for i in range(3)),
            *((b, route, f"b streamed {i}", True) for i, route in enumerate(
                (CHAT, COMPLETIONS, CHAT)))]
    before = app[LEDGER].tree_head()[0] + 1  # and the blocker's record
    answers = [asyncio.ensure_future(post(*ask)) for ask in asks]
    batcher = app[BATCHER]
    while batcher.depth < len(asks):  # all queued behind the blocker: one batch next
        await asyncio.sleep(0.01)
    generator.gate.set()
    assert (await blocker)[0] == 200
    results = await asyncio.gather(*answers)
    assert generator.batches == 2  # the blocker's batch, then all of these together

    # Tenant B's rows, in that same batch: all answered, each opens its committed record.
    batch_ids, rows = set(), set()
    for (*_, stream), (status, text) in zip(asks[2:], results[2:], strict=True):
        assert status == 200, text
        if stream:
            events = _sse(text)
            assert events[-1] == "[DONE]", events[-2:]
            final = next(e for e in events if isinstance(e, dict) and "audit" in e)
            audit = final["audit"]
            output = "".join(_delta(e) for e in events if isinstance(e, dict))
        else:
            answer = json.loads(text)
            audit, output = answer["audit"], answer["choices"][0]["text"]
        row = app[LEDGER].get_record(audit["record_id"])
        assert row is not None
        record = json.loads(row.leaf_body)
        assert record["tenant"] == "bank-b"
        assert commitments.opens(record["commitments"]["output"],
                                 bytes.fromhex(audit["output_salt"]), "output",
                                 output.encode())
        assert record["batch"]["size"] == len(asks)  # the batch as it ran, poison included
        assert record["data"]["shape"][0] == len(asks)
        batch_ids.add(record["batch"]["id"])
        rows.add(record["batch"]["row"])
    assert len(batch_ids) == 1 and len(rows) == len(asks) - 2
    # The poisoned rows: a 400 in OpenAI's shape (or, once text went out, the stream's
    # error line), a fixed sentence, no internal text; nothing recorded for them.
    for (*_, stream), (status, text) in zip(asks[:2], results[:2], strict=True):
        if stream and status == 200:
            events = _sse(text)
            assert "[DONE]" not in events
            error = events[-1]["error"]
        else:
            assert status == 400, text
            error = json.loads(text)["error"]
        assert error["param"] == "body" and error["type"] == "invalid_request_error", error
        assert "holds a value its audit record cannot encode" in error["message"], error
        assert "no output is returned" in error["message"]
        for word in INTERNAL:
            assert word not in text, (word, text)

    # Six completed records and four stream start records (three of B's, the poisoned
    # stream's); no record of a poisoned row.
    assert app[LEDGER].tree_head()[0] == before + 6 + 4
