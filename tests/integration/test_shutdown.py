"""Graceful shutdown of a real service process: in-flight requests are answered and
their records committed before the process exits."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import aiohttp

from ledger.store.sql import SqlLedger
from tests.live_service import start_service


async def test_sigterm_drains_in_flight_requests(tmp_path: Path, tiny_model_dir: Path) -> None:
    service = start_service(tmp_path, tiny_model_dir, "--max-batch", "4")
    proc, base, token = service.process, service.base_url, service.client_token
    async with aiohttp.ClientSession() as session:
        finished: list[float] = []

        async def call(i: int) -> tuple[int, dict[str, object]]:
            async with session.post(f"{base}/v1/generate", json={
                    "prompt": f"drain {i}", "max_new_tokens": 160},
                    headers={"Authorization": f"Bearer {token}"}) as response:
                body = await response.json()
                finished.append(time.monotonic())
                return response.status, body

        calls = [asyncio.ensure_future(call(i)) for i in range(12)]
        await asyncio.sleep(1.0)  # all sent; 3 batches of 160 tokens are still running
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        results = await asyncio.gather(*calls)
    assert proc.wait(timeout=120) == 0
    assert max(finished) > signalled  # some answers really were drained after SIGTERM
    answered = [body for status, body in results if status == 200]
    assert len(answered) == 12, results
    with SqlLedger(service.database_url) as ledger:
        assert ledger.tree_head()[0] == 12
        for body in answered:
            assert ledger.get_record(str(body["record_id"])) is not None
