"""Supervised workers: the writer survives cancelled callers and failing groups; a worker
that dies anyway fails its waiters with 503, turns /readyz 503 naming it, and stops the
process with a non-zero status."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from inference_wrapper.server.app import KEYS, LEDGER, create_app
from inference_wrapper.server.settings import Settings
from ledger.errors import BackendError, WorkerDiedError
from ledger.store.sql import SqlLedger
from tests.live_service import start_service
from tests.records import make_record

MakeClient = Callable[..., Any]


def _gate_writer(ledger: SqlLedger) -> tuple[threading.Event, threading.Event]:
    """Hold the writer inside its next transaction until ``release`` is set."""
    entered, release = threading.Event(), threading.Event()
    real = ledger._write

    def gated(group: Any, **options: Any) -> Any:
        entered.set()
        assert release.wait(60), "the test never released the writer"
        return real(group, **options)

    ledger._write = gated  # type: ignore[method-assign]
    return entered, release


@pytest.fixture()
def ledger(ledger_url: str) -> Iterator[SqlLedger]:
    with SqlLedger(ledger_url) as opened:
        yield opened


def test_a_cancelled_thread_caller_does_not_kill_the_writer(ledger: SqlLedger) -> None:
    entered, release = _gate_writer(ledger)
    first = ledger.submit(make_record(0))
    assert entered.wait(30)
    assert first.cancel()  # the caller gives up while its group is being committed
    release.set()
    receipt = ledger.append(make_record(1), timeout=60)
    assert receipt.leaf_index == 1  # the cancelled one was committed too, then skipped
    assert ledger.writer_alive


async def test_a_cancelled_async_caller_does_not_kill_the_writer(ledger: SqlLedger) -> None:
    entered, release = _gate_writer(ledger)
    first = asyncio.ensure_future(ledger.append_async(make_record(0)))
    assert await asyncio.to_thread(entered.wait, 30)
    first.cancel()
    release.set()
    receipt = await asyncio.wait_for(ledger.append_async(make_record(1)), 60)
    assert receipt.leaf_index == 1
    assert ledger.writer_alive


def test_a_failing_group_gets_its_error_and_the_writer_goes_on(ledger: SqlLedger) -> None:
    real = ledger._write
    calls = []

    def fail_once(group: Any, **options: Any) -> Any:
        calls.append(len(group))
        if len(calls) == 1:
            raise RuntimeError("injected failure")
        return real(group, **options)

    ledger._write = fail_once  # type: ignore[method-assign]
    with pytest.raises(BackendError, match="append failed"):
        ledger.append(make_record(0), timeout=60)
    assert ledger.append(make_record(1), timeout=60).leaf_index == 0
    assert ledger.writer_alive


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_writer_fails_every_waiter_and_refuses_new_appends(ledger: SqlLedger) -> None:
    entered, release = _gate_writer(ledger)
    real = ledger._write

    def die(group: Any, **options: Any) -> Any:
        entered.set()
        assert release.wait(60)
        raise SystemExit("injected: the writer thread ends")  # not an Exception

    ledger._write = die  # type: ignore[method-assign]
    first = ledger.submit(make_record(0))
    assert entered.wait(30)
    queued = ledger.submit(make_record(1))  # waits in the queue behind the dying group
    release.set()
    for future in (first, queued):
        with pytest.raises(WorkerDiedError) as caught:
            future.result(60)
        assert caught.value.worker == "ledger-writer"
    assert not ledger.writer_alive
    with pytest.raises(WorkerDiedError):
        ledger.submit(make_record(2))
    ledger._write = real  # type: ignore[method-assign]


def test_close_is_bounded_when_the_writer_hangs(ledger_url: str) -> None:
    ledger = SqlLedger(ledger_url).start()
    entered, release = _gate_writer(ledger)
    stuck = ledger.submit(make_record(0))
    assert entered.wait(30)
    waiting = ledger.submit(make_record(1))
    ledger.close(timeout_s=0.5)  # returns although the writer is still inside a group
    with pytest.raises(BackendError, match="closed"):
        waiting.result(5)
    release.set()
    assert stuck.result(60).leaf_index == 0


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
async def test_a_dead_worker_gives_503_flips_readiness_and_calls_for_exit(
    aiohttp_client: MakeClient, tmp_path: Path, tiny_generator: Any
) -> None:
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'ledger.db'}",
                        log_key_path=tmp_path / "log.key", max_wait_ms=1.0)
    fatal: list[str] = []
    app = create_app(settings, tiny_generator, on_fatal=fatal.append)
    client = await aiohttp_client(app)
    token = app[KEYS].create("bank-a", "client")[0]

    def die(group: Any, **options: Any) -> Any:
        raise SystemExit("injected: the writer thread ends")

    app[LEDGER]._write = die  # type: ignore[method-assign]
    response = await client.post("/v1/generate", json={"prompt": "x", "max_new_tokens": 2},
                                 headers={"Authorization": f"Bearer {token}"})
    assert response.status == 503
    assert "output" not in await response.json()
    for _ in range(600):  # the supervisor polls; give it a generous while
        ready = await client.get("/readyz")
        if ready.status == 503:
            break
        await asyncio.sleep(0.05)
    body = await ready.json()
    assert ready.status == 503 and body["checks"]["worker:ledger-writer"] is False
    assert body["checks"]["worker:batcher"] is True
    assert fatal == ["ledger-writer"]


async def test_a_dead_batcher_stops_the_process_with_a_non_zero_status(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    service = start_service(tmp_path, tiny_model_dir, module="tests.integration.dying_service")
    try:
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{service.base_url}/v1/generate", json={
                    "prompt": "x", "max_new_tokens": 2},
                    headers={"Authorization": f"Bearer {service.client_token}"}) as response:
                assert response.status == 503
        status = await asyncio.to_thread(service.process.wait, 120)
    finally:
        if service.process.poll() is None:
            service.process.kill()
            service.process.wait()
    assert status == 3  # exit_code_for(WorkerDiedError): backend unavailable


async def test_drain_ends_at_once_when_the_batching_task_died(
    ledger: SqlLedger, tiny_generator: Any
) -> None:
    from inference_wrapper.audit.batcher import Batcher

    batcher = Batcher(tiny_generator, ledger, max_wait_ms=1)

    def broken() -> Any:
        raise RuntimeError("injected bug in the batching task")

    batcher._take_batch = broken  # type: ignore[method-assign]
    batcher.start()
    with pytest.raises(WorkerDiedError) as caught:
        await asyncio.wait_for(batcher.submit(tiny_generator.prepare("x")), 60)
    assert caught.value.worker == "batcher" and not batcher.alive
    with pytest.raises(WorkerDiedError):
        await batcher.submit(tiny_generator.prepare("y"))
    # Its deadline is long; it must not be what ends the drain.
    await asyncio.wait_for(batcher.drain(timeout_s=3600), 60)
    assert batcher.outstanding == 0
