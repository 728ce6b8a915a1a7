"""Start-up is never blocked by Fabric: the service serves with the peer down (under its
keep-serving policy), registers and anchors when the peer comes up; a channel or chaincode
the gateway does not know is a configuration error shown by /readyz, not a hot retry loop."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from inference_wrapper.server.settings import Settings
from tests.fabric.conftest import CHANNEL, make_identity
from tests.fabric.peer_double import PeerDouble

ORIGIN = "startup-test.audit-ledger/log"


def _settings(tmp_path: Path, peer: PeerDouble, chaincode: str = "anchor") -> Settings:
    make_identity(tmp_path, "client")  # writes client-cert.pem / client-key.pem
    return Settings(database_url=f"sqlite:///{tmp_path / 'svc.db'}",
                    log_key_path=tmp_path / "svc.key", origin=ORIGIN,
                    checkpoint_interval_s=0.2, anchor_interval_s=0.05,
                    fabric_gateway_endpoint=peer.endpoint, fabric_mspid="Org1MSP",
                    fabric_cert_path=str(tmp_path / "client-cert.pem"),
                    fabric_key_path=str(tmp_path / "client-key.pem"),
                    fabric_channel=CHANNEL, fabric_chaincode=chaincode)


async def _poll(condition: Any, timeout_s: float = 120.0) -> None:
    """Poll ``condition`` (a callable run off the loop) until true; generous timeout."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await asyncio.to_thread(condition):
        assert loop.time() < deadline, "condition not reached within the timeout"
        await asyncio.sleep(0.05)


async def test_serve_with_the_peer_down_then_anchor_when_it_comes_up(
        stopped_peer: PeerDouble, tmp_path: Path, aiohttp_client: Any,
        tiny_generator: Any) -> None:
    from inference_wrapper.server.app import ANCHOR_WORKER, KEYS, LEDGER, create_app

    app = create_app(_settings(tmp_path, stopped_peer), tiny_generator)
    client = await aiohttp_client(app)  # start-up completes with no peer at all
    token = app[KEYS].create("bank-a", "client")[0]
    ids = []
    for prompt in ("first", "second"):
        response = await client.post("/v1/generate",
                                     json={"prompt": prompt, "max_new_tokens": 2},
                                     headers={"Authorization": f"Bearer {token}"})
        assert response.status == 200, await response.text()
        ids.append((await response.json())["record_id"])
    worker = app[ANCHOR_WORKER]
    await _poll(lambda: worker.failures > 0)  # it tried, and the peer was not there
    assert not worker.prepared and worker.status().anchored_size == 0
    ready = await (await client.get("/readyz")).json()
    assert ready["checks"]["anchor_configured"] is True  # unreachable is not misconfigured

    await asyncio.to_thread(stopped_peer.start)
    ledger = app[LEDGER]

    def anchored_all() -> bool:
        rows = [ledger.get_record(i) for i in ids]
        return all(r is not None and r.anchor_ref is not None for r in rows)

    await _poll(anchored_all)
    assert worker.prepared
    for record_id in ids:
        row = ledger.get_record(record_id)
        assert row is not None and str(row.anchor_ref).startswith(f"fabric:{CHANNEL}:")


async def test_unknown_chaincode_is_a_configuration_error_in_readyz(
        peer: PeerDouble, tmp_path: Path, aiohttp_client: Any, tiny_generator: Any,
        caplog: pytest.LogCaptureFixture) -> None:
    from inference_wrapper.server.app import ANCHOR_WORKER, create_app

    app = create_app(_settings(tmp_path, peer, chaincode="nosuchcode"), tiny_generator)
    client = await aiohttp_client(app)
    worker = app[ANCHOR_WORKER]
    await _poll(lambda: worker.config_error is not None)
    response = await client.get("/readyz")
    body = await response.json()
    assert response.status == 503 and body["checks"]["anchor_configured"] is False
    assert "nosuchcode" in body["anchor_error"] and "FAILED_PRECONDITION" in body["anchor_error"]
    assert "no peers available" not in body["anchor_error"]  # the peer's text stays in logs
    assert "misconfigured" in caplog.text and "no peers available" in caplog.text
    # One attempt, then the long configuration back-off (300 s): no hot retry loop.
    assert worker.failures == 1 and worker.config_backoff_s >= 300
