"""Graceful shutdown of a real service process: requests in flight at SIGTERM are answered
and their records committed before the process exits.

Gated on the service's own state, not on time: SIGTERM is sent once /metrics shows a batch
in the model and more requests queued behind it, however fast or slow the machine is.
"""

from __future__ import annotations

import asyncio
import json
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
        assert ledger.tree_head()[0] == 1 + REQUESTS  # and the engine's environment leaf
        for _, body in results:
            assert ledger.get_record(str(body["record_id"])) is not None


async def raw_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response read to the end of the connection (the request said close)."""
    raw = await asyncio.wait_for(reader.read(), GATE_TIMEOUT_S)
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.strip().lower(): value.strip()
               for name, _, value in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, body


async def test_new_connections_during_the_drain_get_503_not_refused(
        tmp_path: Path, tiny_model_dir: Path) -> None:
    """The listener stays open while a request drains: a caller that connects after
    SIGTERM is told the service is shutting down (and when to retry) instead of refused.

    The request held in flight is one whose body is only half sent: it stays in the
    handler, whatever the machine's speed, until the test sends the rest.
    """
    service = start_service(tmp_path, tiny_model_dir)
    proc, base, token = service.process, service.base_url, service.client_token
    port = int(base.rsplit(":", 1)[1])
    body = json.dumps({"prompt": "held across the signal", "max_new_tokens": 4}).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"POST /v1/generate HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                 f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                 + body[:10])
    await writer.drain()
    deadline = time.monotonic() + GATE_TIMEOUT_S
    async with aiohttp.ClientSession() as session:
        while (await gauges(session, base))["audit_http_requests_in_flight"] < 1:
            assert time.monotonic() < deadline, "".join(service.output)[-2000:]
            await asyncio.sleep(0.005)  # polling interval only; nothing waits on it
        proc.send_signal(signal.SIGTERM)
        while True:  # the flag is set at the signal; the listener is still open
            async with session.get(f"{base}/readyz") as ready:
                if ready.status == 503:
                    assert (await ready.json())["shutting_down"] is True
                    break
                assert ready.status == 200
            assert time.monotonic() < deadline, "".join(service.output)[-2000:]
            await asyncio.sleep(0.005)

    auth = {"Authorization": f"Bearer {token}"}
    # A fresh connection for each: what a load balancer's retry or a new client opens.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) \
            as fresh:
        async with fresh.post(f"{base}/v1/generate", headers=auth,
                              json={"prompt": "late", "max_new_tokens": 4}) as late:
            assert late.status == 503
            assert late.headers["Retry-After"] == "5"
            assert late.headers["Connection"] == "close"
            assert late.content_type == "application/problem+json"
            problem = await late.json(content_type=None)
        assert problem["status"] == 503 and problem["title"] == "Service Unavailable"
        assert problem["detail"] == "the service is shutting down"
        assert problem["instance"] == "/v1/generate" and "output" not in problem
        for path, payload in [
                ("/v1/chat/completions", {"model": "tiny-llama", "max_tokens": 4,
                                          "messages": [{"role": "user", "content": "late"}]}),
                ("/v1/completions", {"model": "tiny-llama", "prompt": "late",
                                     "max_tokens": 4})]:
            async with fresh.post(f"{base}{path}", headers=auth, json=payload) as late:
                assert late.status == 503, path
                assert late.headers["Retry-After"] == "5"
                assert late.headers["Connection"] == "close"
                error = (await late.json())["error"]
            assert error["type"] == "server_error" and error["code"] is None, error
            assert error["message"].startswith("the service is shutting down"), error

    writer.write(body[10:])  # the held request now completes, recorded and sealed
    await writer.drain()
    status, headers, answer = await raw_response(reader)
    writer.close()
    assert status == 200, answer
    receipt = json.loads(answer)
    assert headers["x-audit-record-id"] == receipt["record_id"]
    assert receipt["leaf_index"] == 1 and receipt["leaf_hash"]  # after the environment leaf
    assert proc.wait(timeout=GATE_TIMEOUT_S) == 0, "".join(service.output)[-2000:]
    with SqlLedger(service.database_url) as ledger:
        assert ledger.tree_head()[0] == 2  # the 503s recorded nothing
        assert ledger.get_record(receipt["record_id"]) is not None
        latest = ledger.latest_checkpoint()
        assert latest is not None and latest.size == 2  # sealed before the exit


async def test_a_second_sigterm_ends_the_drain_at_once(tmp_path: Path,
                                                       tiny_model_dir: Path) -> None:
    """A request that would hold the drain open (its body never completes) is cut off
    by a second signal; the process still cleans up and exits 0."""
    service = start_service(tmp_path, tiny_model_dir)
    proc, base, token = service.process, service.base_url, service.client_token
    port = int(base.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"POST /v1/generate HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                 f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
                 "Content-Length: 1000\r\n\r\n{\"prompt\": ".encode())
    await writer.drain()
    deadline = time.monotonic() + GATE_TIMEOUT_S
    async with aiohttp.ClientSession() as session:
        while (await gauges(session, base))["audit_http_requests_in_flight"] < 1:
            assert time.monotonic() < deadline, "".join(service.output)[-2000:]
            await asyncio.sleep(0.005)  # polling interval only; nothing waits on it
        proc.send_signal(signal.SIGTERM)
        while True:  # the first signal has been taken: the drain waits on the held request
            async with session.get(f"{base}/readyz") as ready:
                if ready.status == 503:
                    break
            assert time.monotonic() < deadline, "".join(service.output)[-2000:]
            await asyncio.sleep(0.005)
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(proc.wait, GATE_TIMEOUT_S) == 0, \
        "".join(service.output)[-2000:]
    try:  # the held request was cut off, never answered
        assert not await asyncio.wait_for(reader.read(), GATE_TIMEOUT_S)
    except ConnectionResetError:
        pass
    writer.close()
    # What shows that the second signal, not the drain window's end, let it go.
    while "SIGTERM again: ending the drain now" not in "".join(service.output):
        assert time.monotonic() < deadline, "".join(service.output)[-2000:]
        await asyncio.sleep(0.01)  # the output thread may still be reading the last lines
    with SqlLedger(service.database_url) as ledger:
        assert ledger.tree_head()[0] == 1  # the environment leaf alone
