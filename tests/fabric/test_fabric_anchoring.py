"""The anchoring worker on Fabric (the peer double), and the end-to-end path:
generate -> record -> checkpoint -> anchored on the channel -> verify reports it."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from ledger.anchor.fabric import FabricAnchor
from ledger.anchor.worker import AnchorWorker
from ledger.checkpoint import NoteSigner
from ledger.errors import BackendUnavailableError
from ledger.store.integrator import Integrator
from ledger.store.keys import load_or_create_signer
from ledger.store.migrate import upgrade
from ledger.store.sql import SqlLedger
from tests.fabric.conftest import CHANNEL, gateway_for
from tests.fabric.peer_double import PeerDouble
from tests.records import make_record

ORIGIN = "anchoring-test.audit-ledger/log"


def test_worker_retries_while_fabric_is_down_then_drains_in_order(
    peer: PeerDouble, client_identity: Any, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    upgrade(url)
    signer: NoteSigner = load_or_create_signer(tmp_path / "log.key", ORIGIN)
    with SqlLedger(url) as ledger:
        anchor = FabricAnchor(ledger, gateway_for(peer, client_identity, timeout_s=2),
                              signer.verifier(), ORIGIN)
        anchor.register()
        worker = AnchorWorker(ledger, anchor, interval_s=0.05, max_backoff_s=0.2)
        integrator = Integrator(ledger, signer, ORIGIN)
        for i in range(3):
            ledger.append(make_record(i))
        integrator.seal_now()
        assert worker.run_once()
        assert anchor.latest_size() == 3

        world = peer.stop_gateway()  # the peer goes away
        sealed = []
        for batch in range(3):
            for i in range(2):
                ledger.append(make_record(100 + batch * 10 + i))
            sealed.append(integrator.seal_now())
        with pytest.raises(BackendUnavailableError):
            worker.run_once()
        worker.start()
        status = worker.status()
        assert status.backlog == 3 and status.newest_size == 9 and status.anchored_size == 3

        peer.start(world)  # back, with the same world state
        deadline = time.monotonic() + 120  # an overall bound, not a speed assumption
        while worker.status().backlog != 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        worker.stop()
        assert worker.status().backlog == 0
        history = json.loads(anchor.gateway.evaluate("GetHistory", ORIGIN, "10", ""))
        sizes = [c["size"] for c in history["checkpoints"]]
        assert sizes == sorted(sizes) and sizes[0] == 3 and sizes[-1] == 9
        # Every checkpoint sealed during the outage is a prefix of what was anchored.
        from ledger import merkle

        for checkpoint in sealed:
            assert checkpoint is not None
            merkle.verify_consistency(checkpoint.size, 9,
                                      ledger.consistency_proof(checkpoint.size, 9),
                                      checkpoint.root, ledger.checkpoint(9).root)  # type: ignore[union-attr]
        row = ledger.record_at(8)
        assert row is not None and row.anchor_ref is not None
        assert row.anchor_ref.startswith(f"fabric:{CHANNEL}:")


async def test_end_to_end_generate_anchor_on_fabric_and_verify(
    peer: PeerDouble, client_identity: Any, tmp_path: Path, aiohttp_client: Any,
    tiny_generator: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    from audit_cli.main import main
    from inference_wrapper.server.app import ANCHOR_WORKER, KEYS, LEDGER, SIGNER, create_app
    from inference_wrapper.server.settings import Settings

    monkeypatch.setenv("AUDIT_LEDGER_HOME", str(tmp_path / "home"))
    cert, key = tmp_path / "client-cert.pem", tmp_path / "client-key.pem"
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'svc.db'}",
                        log_key_path=tmp_path / "svc.key", origin=ORIGIN,
                        checkpoint_interval_s=3600, anchor_interval_s=3600,
                        fabric_gateway_endpoint=peer.endpoint, fabric_mspid="Org1MSP",
                        fabric_cert_path=str(cert), fabric_key_path=str(key),
                        fabric_channel=CHANNEL, fabric_chaincode="anchor")
    app = create_app(settings, tiny_generator)
    client = await aiohttp_client(app)
    token = app[KEYS].create("bank-a", "client")[0]
    response = await client.post("/v1/generate", json={"prompt": "fabric", "max_new_tokens": 3},
                                 headers={"Authorization": f"Bearer {token}"})
    answer = await response.json()
    app[LEDGER].seal_checkpoint(app[SIGNER], ORIGIN)
    # Anchors it now, or finds the worker's own thread already did (attempts are serial).
    await asyncio.to_thread(app[ANCHOR_WORKER].run_once)
    anchored = app[ANCHOR_WORKER].store.latest()
    assert anchored is not None and anchored.size == 2  # the environment leaf and the record
    capsys.readouterr()
    code = await asyncio.to_thread(main, [
        "verify", answer["record_id"], "--db", settings.database_url,
        "--log-key", app[SIGNER].verifier().encode(), "--json",
        "--fabric-endpoint", peer.endpoint, "--fabric-mspid", "Org1MSP",
        "--fabric-cert", str(cert), "--fabric-key", str(key), "--fabric-channel", CHANNEL])
    result = json.loads(capsys.readouterr().out)
    assert code == 0, result
    anchor_check = result["checks"][3]["reason"]
    # The tx id and the block both come from the channel (GetLatest, then qscc).
    assert peer.gateway is not None
    tx_id = json.loads(gateway_for(peer, client_identity).evaluate("GetLatest", ORIGIN))["txId"]
    block = peer.gateway.committed[tx_id].block
    assert f"fabric:{CHANNEL}:{tx_id} block {block}" in anchor_check, anchor_check
