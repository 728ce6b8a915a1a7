"""Against a real Fabric network (compose.yaml), only when one is configured:
FABRIC_GATEWAY_ENDPOINT, FABRIC_MSPID, FABRIC_CERT, FABRIC_KEY and optionally
FABRIC_TLS_CA, FABRIC_CHANNEL (auditchannel), FABRIC_CHAINCODE (anchor)."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger import merkle
from ledger.anchor.fabric import ChaincodeRefusedError, FabricGateway, Identity
from ledger.checkpoint import Checkpoint, NoteSigner

NEEDED = ("FABRIC_GATEWAY_ENDPOINT", "FABRIC_MSPID", "FABRIC_CERT", "FABRIC_KEY")
configured = all(os.environ.get(name) for name in NEEDED)


@pytest.mark.skipif(not configured, reason="no real Fabric gateway configured (" +
                    ", ".join(NEEDED) + ")")
def test_anchor_on_a_real_network() -> None:
    env = os.environ
    tls = Path(env["FABRIC_TLS_CA"]) if env.get("FABRIC_TLS_CA") else None
    gateway = FabricGateway(env["FABRIC_GATEWAY_ENDPOINT"],
                            Identity.from_files(env["FABRIC_MSPID"], Path(env["FABRIC_CERT"]),
                                                Path(env["FABRIC_KEY"])),
                            env.get("FABRIC_CHANNEL", "auditchannel"),
                            env.get("FABRIC_CHAINCODE", "anchor"), tls_ca=tls)
    origin = f"real-network-{uuid.uuid4().hex[:8]}/log"
    signer = NoteSigner(origin, Ed25519PrivateKey.generate())
    gateway.submit("InitLog", origin, signer.verifier().encode())
    tree = merkle.MemoryTree(merkle.hash_leaf(b"%d" % i) for i in range(5))
    note = signer.sign_checkpoint(Checkpoint(origin, 5, tree.root())).decode()
    tx_id, block, _ = gateway.submit("AnchorCheckpoint", note, "[]")
    assert json.loads(gateway.evaluate("GetLatest", origin))["txId"] == tx_id and block > 0
    with pytest.raises(ChaincodeRefusedError) as info:
        gateway.submit("AnchorCheckpoint", signer.sign_checkpoint(
            Checkpoint(origin, 3, tree.root(3))).decode(), "[]")
    assert info.value.code == "ROLLBACK"
