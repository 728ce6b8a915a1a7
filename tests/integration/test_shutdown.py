"""Graceful shutdown of a real service process: requests in flight at SIGTERM are answered
and their records committed before the process exits.

Gated on the service's own state, not on time: SIGTERM is sent once /metrics shows a batch
in the model and more requests queued behind it, however fast or slow the machine is.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from ledger.store.sql import SqlLedger
from tests.live_service import start_service

REQUESTS = 12
GATE_TIMEOUT_S = 300.0  # an overall bound for a loaded machine, not a tuned deadline


async def gauges(session: aiohttp.ClientSession, base: str) -> dict[str, float]:
    async with session.get(f"{base}/metrics") as response:
        text = await response.text()
    return {s.name: s.value for family in text_string_to_metric_families(text)
            for s in family.samples if not s.labels}


async def test_sigterm_drains_in_flight_requests(tmp_path: Path, tiny_model_dir: Path) -> None:
    service = start_service(tmp_path, tiny_model_dir, "--max-batch", "4")
    proc, base, token = service.process, service.base_url, service.client_token
    async with aiohttp.ClientSession() as session:

        async def call(i: int) -> tuple[int, dict[str, object]]:
            async with session.post(f"{base}/v1/generate", json={
                    "prompt": f"drain {i}", "max_new_tokens": 512},
                    headers={"Authorization": f"Bearer {token}"}) as response:
                return response.status, await response.json()

        calls = [asyncio.ensure_future(call(i)) for i in range(REQUESTS)]
        deadline = time.monotonic() + GATE_TIMEOUT_S
        while True:  # a batch in the model and requests queued behind it
            state = await gauges(session, base)
            if state["audit_requests_in_model"] >= 1 and state["audit_queue_depth"] >= 1:
                break
            assert time.monotonic() < deadline, ("never saw work in flight", state,
                                                 "".join(service.output)[-2000:])
            # Fails clearly (instead of waiting out the bound) if every answer came back
            # between two polls: then the gate needs more queued work, not a longer sleep.
            assert not all(c.done() for c in calls), [c.result() for c in calls]
            await asyncio.sleep(0.005)  # polling interval only; nothing waits on it
        proc.send_signal(signal.SIGTERM)
        results = await asyncio.gather(*calls)
    assert proc.wait(timeout=GATE_TIMEOUT_S) == 0, "".join(service.output)[-2000:]
    assert [status for status, _ in results] == [200] * REQUESTS, results
    with SqlLedger(service.database_url) as ledger:
        assert ledger.tree_head()[0] == REQUESTS
        for _, body in results:
            assert ledger.get_record(str(body["record_id"])) is not None
