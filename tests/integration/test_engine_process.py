"""The engine in its own process: the same tokens as in this process, each step as it is
generated, a SIGKILL that fails only the batch it held and a supervisor that brings the
engine back, and two engines that batches are spread over. Real child processes; every
wait is on an event or on polled state."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from inference_wrapper.audit.batcher import Batcher, TokenFeed
from inference_wrapper.audit.generator import AuditedGenerator
from inference_wrapper.engine.model import load_served_model
from inference_wrapper.engine.params import GenerationParams
from inference_wrapper.engine.process import EngineSpec
from inference_wrapper.engine.protocol import EngineBatch, EngineDownError
from inference_wrapper.engine.supervised import SupervisedEngine
from ledger.store.migrate import upgrade
from ledger.store.sql import SqlLedger

START_TIMEOUT_S = 300.0  # a loaded machine imports torch slowly


def _spec(model_dir: Path, engine_id: str = "engine-0") -> EngineSpec:
    return EngineSpec(engine_id=engine_id, model_dir=model_dir, name="tiny-llama",
                      manifest=model_dir.parent / "tiny-llama.manifest.json", device="cpu")


def _batch(*prompts: str, max_new_tokens: int = 8) -> EngineBatch:
    return EngineBatch(tuple(prompts), GenerationParams(max_new_tokens=max_new_tokens),
                       tuple(() for _ in prompts), tuple(False for _ in prompts))


@pytest.fixture()
async def engine(tiny_model_dir: Path) -> AsyncIterator[SupervisedEngine]:
    supervised = SupervisedEngine(_spec(tiny_model_dir), backoff_s=(0.1,))
    await asyncio.wait_for(supervised.start(), START_TIMEOUT_S)
    yield supervised
    await supervised.close()


async def test_the_process_engine_gives_the_in_process_tokens_step_by_step(
        engine: SupervisedEngine, tiny_generator: Any) -> None:
    environment = engine.environment()
    assert environment["engine"] == "engine-0"
    assert environment["model"]["digest"] == tiny_generator.loaded.digest
    assert environment["tokenization_contract"] == tiny_generator.contract.to_dict()
    assert environment["hardware"]["accelerator"] == "none"

    batch = _batch("The capital of France is", "hello", max_new_tokens=12)
    steps: list[list[int | None]] = []
    result = await engine.generate(batch, steps.append)
    expected = tiny_generator.engines[0].run(batch)  # the same model in this process
    assert result.output_ids == expected.output_ids
    assert result.input_ids == expected.input_ids
    assert result.texts == expected.texts
    assert result.engine_id == "engine-0" and result.gpu_sample is None
    for row in range(2):  # every token came as its own step, in order, before the result
        streamed = [step[row] for step in steps if step[row] is not None]
        assert streamed == result.output_ids[row]
    assert len(steps) == max(len(ids) for ids in result.output_ids)


async def test_a_killed_engine_fails_its_batch_and_comes_back(
        engine: SupervisedEngine) -> None:
    first_pid = engine.pid
    assert first_pid is not None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + START_TIMEOUT_S
    while engine.reserve_pid is None:  # the warm reserve the restart will load into
        assert loop.time() < deadline, "no warm reserve"
        await asyncio.sleep(0.05)
    reserve_pid = engine.reserve_pid
    stepped = asyncio.Event()
    # 512 steps: the batch is still in the engine when the first step's kill lands.
    held = asyncio.ensure_future(engine.generate(_batch("hold me", max_new_tokens=512),
                                                 lambda tokens: stepped.set()))
    await asyncio.wait_for(stepped.wait(), START_TIMEOUT_S)
    os.kill(first_pid, signal.SIGKILL)
    with pytest.raises(EngineDownError, match="went down during the batch"):
        await held
    assert not engine.alive()
    with pytest.raises(EngineDownError, match="is down"):  # refused at once, not held
        await engine.generate(_batch("while it is down"), None)

    await asyncio.wait_for(engine.up.wait(), START_TIMEOUT_S)  # the supervisor restarted it
    assert engine.alive() and engine.pid == reserve_pid != first_pid
    assert (engine.deaths, engine.restarts) == (1, 1)
    result = await engine.generate(_batch("after the restart"), None)
    assert result.engine_id == "engine-0" and result.output_ids[0]


async def test_batches_are_spread_over_two_engines_and_records_name_theirs(
        tiny_model_dir: Path, tiny_manifest: dict[str, Any], tmp_path: Path) -> None:
    engines = [SupervisedEngine(_spec(tiny_model_dir, f"engine-{i}"), reserve=False)
               for i in range(2)]
    served = load_served_model(tiny_model_dir, name="tiny-llama", manifest=tiny_manifest)
    generator = AuditedGenerator(served, engines=engines)
    await asyncio.wait_for(asyncio.gather(*(e.start() for e in engines)), START_TIMEOUT_S)
    for engine in engines:
        generator.check_environment(engine.environment())
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    upgrade(url)
    with SqlLedger(url) as ledger:
        batcher = Batcher(generator, ledger, max_batch=1, max_wait_ms=1)
        batcher.start()
        stopped: int | None = None
        try:
            feed = TokenFeed()
            long = generator.prepare("the long one", GenerationParams(max_new_tokens=512))
            held = asyncio.ensure_future(batcher.submit(long, feed=feed))
            await asyncio.wait_for(feed.changed.wait(), START_TIMEOUT_S)
            stopped = engines[0].pid  # engine-0 took the first batch; hold it there
            assert stopped is not None
            os.kill(stopped, signal.SIGSTOP)
            short = generator.prepare("the short one", GenerationParams(max_new_tokens=4))
            other = await asyncio.wait_for(batcher.submit(short), START_TIMEOUT_S)
            assert other.output.record.body["data"]["batch"]["engine"] == "engine-1"
            assert not held.done()  # still in the stopped engine-0
            os.kill(stopped, signal.SIGCONT)
            stopped = None
            first = await asyncio.wait_for(held, START_TIMEOUT_S)
            assert first.output.record.body["data"]["batch"]["engine"] == "engine-0"
            for answer in (first, other):
                stored = ledger.get_record(answer.receipt.record_id)
                assert stored is not None and stored.canonical == answer.output.record.canonical
        finally:
            if stopped is not None:
                os.kill(stopped, signal.SIGCONT)
            await batcher.drain(timeout_s=120)
            for engine in engines:
                await engine.close()


async def test_the_api_outlives_a_killed_engine(aiohttp_client: Any, tiny_model_dir: Path,
                                                tiny_manifest: dict[str, Any],
                                                tmp_path: Path) -> None:
    """In flight: 503 with Retry-After and no record; /healthz answers throughout, /readyz
    says the engine is down until the supervisor has it back; then it serves (and streams
    token by token) again."""
    from inference_wrapper.server.app import BATCHER, KEYS, LEDGER, create_app
    from inference_wrapper.server.settings import Settings

    engine = SupervisedEngine(_spec(tiny_model_dir), backoff_s=(0.1,), reserve=False)
    served = load_served_model(tiny_model_dir, name="tiny-llama", manifest=tiny_manifest)
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'ledger.db'}",
                        log_key_path=tmp_path / "log.key", max_wait_ms=1.0,
                        checkpoint_interval_s=0.1)
    app = create_app(settings, AuditedGenerator(served, engines=[engine]))
    client = await aiohttp_client(app)  # starts the engine process (engine_context)
    auth = {"Authorization": f"Bearer {app[KEYS].create('bank-a', 'client')[0]}"}
    first_pid = engine.pid
    assert first_pid is not None and engine.alive()

    held = asyncio.ensure_future(client.post("/v1/generate", headers=auth, json={
        "prompt": "hold me", "max_new_tokens": 512}))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + START_TIMEOUT_S
    while app[BATCHER].in_model == 0:  # the batch is in the engine
        assert loop.time() < deadline and not held.done(), "the batch never reached it"
        await asyncio.sleep(0.005)
    os.kill(first_pid, signal.SIGKILL)
    answer = await held
    assert answer.status == 503 and answer.headers["Retry-After"] == "2"
    problem = await answer.json()
    assert "engine is down" in problem["detail"] and "record_id" not in problem
    assert app[LEDGER].tree_head()[0] == 1  # nothing recorded for it (leaf 0: environment)
    assert (await client.get("/healthz")).status == 200
    ready = await client.get("/readyz")
    assert ready.status == 503 and (await ready.json())["checks"]["engine_serving"] is False

    await asyncio.wait_for(engine.up.wait(), START_TIMEOUT_S)
    assert (await client.get("/readyz")).status == 200
    served_again = await client.post("/v1/generate", headers=auth, json={
        "prompt": "after the restart", "max_new_tokens": 4})
    assert served_again.status == 200
    record = app[LEDGER].get_record((await served_again.json())["record_id"])
    assert record is not None

    stream = await client.post("/v1/completions", headers=auth, json={
        "model": "tiny-llama", "prompt": "stream me", "max_tokens": 24, "temperature": 0,
        "stream": True})
    assert stream.status == 200
    pieces = []
    while line := await stream.content.readline():
        if line.startswith(b"data: {"):
            text = json.loads(line[len(b"data: "):])["choices"][0]["text"]
            pieces += [text] if text else []
    assert len(pieces) >= 3  # text arrived in pieces as the engine generated it
