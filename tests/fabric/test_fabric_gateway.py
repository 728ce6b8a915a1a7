"""The Python Gateway client against the peer double running the real chaincode."""

from __future__ import annotations

import json

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger import merkle
from ledger.anchor.fabric import ChaincodeRefusedError, Identity
from ledger.checkpoint import Checkpoint, NoteSigner
from tests.fabric.conftest import gateway_for
from tests.fabric.peer_double import PeerDouble

ORIGIN = "fabric-test.audit-ledger/log"


def test_anchor_read_back_and_commit_status_valid(peer: PeerDouble,
                                                  client_identity: Identity) -> None:
    signer = NoteSigner(ORIGIN, Ed25519PrivateKey.generate())
    gateway = gateway_for(peer, client_identity)
    tx_id, block, result = gateway.submit("InitLog", ORIGIN, signer.verifier().encode())
    assert json.loads(result)["origin"] == ORIGIN and block == 1 and len(tx_id) == 64
    tree = merkle.MemoryTree(merkle.hash_leaf(b"%d" % i) for i in range(9))
    first = signer.sign_checkpoint(Checkpoint(ORIGIN, 4, tree.root(4)))
    second = signer.sign_checkpoint(Checkpoint(ORIGIN, 9, tree.root(9)))
    gateway.submit("AnchorCheckpoint", first.decode(), "[]")
    proof = json.dumps([h.hex() for h in tree.consistency_proof(4)])
    tx_id, block, result = gateway.submit("AnchorCheckpoint", second.decode(), proof)
    assert json.loads(result)["txId"] == tx_id and block == 3
    latest = json.loads(gateway.evaluate("GetLatest", ORIGIN))
    assert latest["size"] == 9 and latest["note"] == second.decode()
    with pytest.raises(ChaincodeRefusedError) as info:
        gateway.submit("AnchorCheckpoint", first.decode(), "[]")
    assert info.value.code == "ROLLBACK"
    gateway.close()
