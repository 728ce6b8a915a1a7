"""`audit-ledger serve` as its own process, configured for a Fabric peer that is DOWN: it
starts, serves, and anchors once the peer comes up (it used to exit 3 at start-up)."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from ledger.store.sql import SqlLedger
from tests.fabric.conftest import CHANNEL, make_identity
from tests.fabric.peer_double import PeerDouble
from tests.live_service import start_service


def _drain(stream: object) -> None:
    for _ in stream:  # type: ignore[attr-defined]
        pass


def test_serve_process_starts_with_the_peer_down_and_anchors_when_it_is_up(
        stopped_peer: PeerDouble, tmp_path: Path, tiny_model_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    make_identity(tmp_path, "client")
    for name, value in {"FABRIC_GATEWAY_ENDPOINT": stopped_peer.endpoint,
                        "FABRIC_MSPID": "Org1MSP",
                        "FABRIC_CERT_PATH": str(tmp_path / "client-cert.pem"),
                        "FABRIC_KEY_PATH": str(tmp_path / "client-key.pem"),
                        "FABRIC_CHANNEL": CHANNEL, "FABRIC_CHAINCODE": "anchor",
                        "CHECKPOINT_INTERVAL_S": "0.2", "ANCHOR_INTERVAL_S": "0.05"}.items():
        monkeypatch.setenv(f"AUDIT_LEDGER_{name}", value)
    home = tmp_path / "home"
    home.mkdir()
    service = start_service(home, tiny_model_dir)
    assert service.process.stdout is not None
    threading.Thread(target=_drain, args=(service.process.stdout,), daemon=True).start()
    try:
        assert service.process.poll() is None, "serve exited with the peer down"
        request = urllib.request.Request(
            f"{service.base_url}/v1/generate", method="POST",
            data=json.dumps({"prompt": "peer down", "max_new_tokens": 2}).encode(),
            headers={"Authorization": f"Bearer {service.client_token}",
                     "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            assert response.status == 200
            record_id = json.loads(response.read())["record_id"]

        stopped_peer.start()
        with SqlLedger(service.database_url) as ledger:
            deadline = time.monotonic() + 120
            while True:
                row = ledger.get_record(record_id)
                if row is not None and row.anchor_ref is not None:
                    break
                assert time.monotonic() < deadline, "not anchored after the peer came up"
                time.sleep(0.1)
        assert row.anchor_ref.startswith(f"fabric:{CHANNEL}:")
    finally:
        service.stop()
