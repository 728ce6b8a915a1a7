"""Real service processes: a stdout nobody reads does not stall requests; a process
killed mid-stream leaves the streamed request's start record durable."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import aiohttp

from ledger.leaves.stream_start import STREAM_START_KIND
from ledger.store.sql import SqlLedger
from tests.live_service import start_service


async def test_a_stdout_nobody_reads_does_not_stall_requests(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    # A log queue of 50 lines, and a pipe that is never read after the start line: the
    # pipe fills after a few hundred request log lines, and from then on lines are
    # dropped instead of blocking the event loop.
    service = start_service(tmp_path, tiny_model_dir,
                            env={"AUDIT_LEDGER_LOG_QUEUE_CAPACITY": "50"}, drain=False)
    headers = {"Authorization": f"Bearer {service.client_token}"}
    try:
        timeout = aiohttp.ClientTimeout(total=300)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            limit = asyncio.Semaphore(16)

            async def get(path: str) -> int:
                async with limit, session.get(f"{service.base_url}{path}") as response:
                    await response.read()
                    return response.status

            async def generate(i: int) -> int:
                async with limit, session.post(f"{service.base_url}/v1/generate", json={
                        "prompt": f"stall {i}", "max_new_tokens": 1},
                        headers=headers) as response:
                    await response.read()
                    return response.status

            # ~100 bytes of log per request: 2,000 requests are three times a pipe's 64 KiB.
            statuses = await asyncio.gather(*(get("/healthz") for _ in range(2000)))
            generated = await asyncio.gather(*(generate(i) for i in range(32)))
            async with session.get(f"{service.base_url}/metrics") as response:
                metrics = await response.text()
        assert statuses == [200] * 2000
        assert generated == [200] * 32
        dropped = [line for line in metrics.splitlines()
                   if line.startswith("audit_log_records_dropped ")]
        assert dropped and float(dropped[0].split()[1]) > 0  # the pipe really was stalled
    finally:
        service.process.kill()
        service.process.wait()


async def test_a_kill_mid_stream_leaves_the_start_record_durable(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    service = start_service(tmp_path, tiny_model_dir)
    try:
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{service.base_url}/v1/completions", json={
                    "model": "tiny-llama", "prompt": "A long story", "max_tokens": 64,
                    "temperature": 0, "stream": True},
                    headers={"Authorization": f"Bearer {service.client_token}"}) as response:
                assert response.status == 200
                first = b""
                while not first.startswith(b"data: "):
                    first = (await response.content.readline()).strip()
                chunk = json.loads(first[len(b"data: "):])
                service.process.send_signal(signal.SIGKILL)  # mid-stream
                await asyncio.to_thread(service.process.wait, 60)
    finally:
        if service.process.poll() is None:
            service.process.kill()
            service.process.wait()
    assert service.process.returncode == -signal.SIGKILL
    start_id = chunk["id"].removeprefix("cmpl-")
    with SqlLedger(service.database_url) as ledger:  # reopened after the kill
        row = ledger.get_record(start_id)
        assert row is not None
        record = json.loads(row.leaf_body)
        assert record["schema"] == STREAM_START_KIND
        assert record["data"]["generation"]["max_new_tokens"] == 64
