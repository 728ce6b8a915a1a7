"""The Python Gateway client against the peer double running the real chaincode."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

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


def _registered(peer: PeerDouble, identity: Identity) -> tuple[NoteSigner, object]:
    signer = NoteSigner(ORIGIN, Ed25519PrivateKey.generate())
    gateway = gateway_for(peer, identity)
    gateway.submit("InitLog", ORIGIN, signer.verifier().encode())
    return signer, gateway


def test_chaincode_refusal_surfaces_as_its_specific_error(peer: PeerDouble,
                                                          client_identity: Identity) -> None:
    _, gateway = _registered(peer, client_identity)
    impostor = NoteSigner(ORIGIN, Ed25519PrivateKey.generate())
    note = impostor.sign_checkpoint(Checkpoint(ORIGIN, 1, merkle.hash_leaf(b"x")))
    with pytest.raises(ChaincodeRefusedError) as info:
        gateway.submit("AnchorCheckpoint", note.decode(), "[]")  # type: ignore[attr-defined]
    assert info.value.code == "BAD_SIGNATURE"
    with pytest.raises(ChaincodeRefusedError) as evaluated:  # Evaluate's error path
        gateway.evaluate("GetLatest", "nobody/log")  # type: ignore[attr-defined]
    assert evaluated.value.code == "NOT_FOUND"


def test_high_s_proposal_signature_is_refused(peer: PeerDouble, client_identity: Identity,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.asymmetric.utils import (
        decode_dss_signature,
        encode_dss_signature,
    )

    from ledger.anchor.fabric import P256_ORDER
    from ledger.errors import BackendConfigurationError

    def high_s(message: bytes) -> bytes:
        r, s = decode_dss_signature(client_identity.private_key.sign(
            message, ec.ECDSA(hashes.SHA256())))
        return encode_dss_signature(r, s if s > P256_ORDER // 2 else P256_ORDER - s)

    monkeypatch.setattr(type(client_identity), "sign", lambda self, message: high_s(message))
    gateway = gateway_for(peer, client_identity)
    with pytest.raises(BackendConfigurationError, match="FAILED_PRECONDITION") as info:
        gateway.evaluate("GetLatest", ORIGIN)
    assert re.search("access denied.*high-S", info.value.diagnostics())


def test_unsigned_and_foreign_signed_envelopes(peer: PeerDouble, client_identity: Identity,
                                               tmp_path: Path) -> None:
    import grpc
    from fabric_protos.gateway import gateway_pb2, gateway_pb2_grpc

    from tests.fabric.conftest import make_identity

    signer, gateway = _registered(peer, client_identity)
    tx_id, signed = gateway._proposal("InitLog", [ORIGIN, signer.verifier().encode()])  # type: ignore[attr-defined]
    stub = gateway_pb2_grpc.GatewayStub(grpc.insecure_channel(peer.endpoint))
    endorsed = stub.Endorse(gateway_pb2.EndorseRequest(
        transaction_id=tx_id, channel_id="auditchannel", proposed_transaction=signed))
    envelope = endorsed.prepared_transaction
    with pytest.raises(grpc.RpcError) as unsigned:
        stub.Submit(gateway_pb2.SubmitRequest(transaction_id=tx_id, channel_id="auditchannel",
                                              prepared_transaction=envelope))
    assert unsigned.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert unsigned.value.details() == "prepared transaction must be signed"
    envelope.signature = make_identity(tmp_path, "mallory").sign(envelope.payload)
    with pytest.raises(grpc.RpcError) as foreign:
        stub.Submit(gateway_pb2.SubmitRequest(transaction_id=tx_id, channel_id="auditchannel",
                                              prepared_transaction=envelope))
    assert foreign.value.code() == grpc.StatusCode.ABORTED
    envelope.signature = client_identity.sign(envelope.payload)  # the tx id is not used up
    stub.Submit(gateway_pb2.SubmitRequest(transaction_id=tx_id, channel_id="auditchannel",
                                          prepared_transaction=envelope))


def _endorse_signed(gateway: Any, function: str, args: list[str]) -> tuple[str, Any]:
    """Endorse a proposal and sign the prepared envelope (not submitted yet)."""
    from fabric_protos.gateway import gateway_pb2

    tx_id, signed = gateway._proposal(function, args)
    endorsed = gateway._stub.Endorse(gateway_pb2.EndorseRequest(
        transaction_id=tx_id, channel_id="auditchannel", proposed_transaction=signed))
    envelope = endorsed.prepared_transaction
    envelope.signature = gateway.identity.sign(envelope.payload)
    return tx_id, envelope


def _submit(gateway: Any, tx_id: str, envelope: Any) -> None:
    from fabric_protos.gateway import gateway_pb2

    gateway._stub.Submit(gateway_pb2.SubmitRequest(
        transaction_id=tx_id, channel_id="auditchannel", prepared_transaction=envelope))


def test_concurrent_writes_to_one_key_conflict_in_the_same_block(
        peer: PeerDouble, client_identity: Identity) -> None:
    signer, gateway = _registered(peer, client_identity)
    tree = merkle.MemoryTree(merkle.hash_leaf(b"%d" % i) for i in range(2))
    envelopes = [  # both endorsed against the same (empty) latest checkpoint
        _endorse_signed(gateway, "AnchorCheckpoint", [signer.sign_checkpoint(
            Checkpoint(ORIGIN, size, tree.root(size))).decode(), "[]"])
        for size in (1, 2)]
    assert peer.gateway is not None
    peer.gateway.hold()  # the orderer batches both, as a real one within its BatchTimeout
    for tx_id, envelope in envelopes:
        _submit(gateway, tx_id, envelope)
    peer.gateway.release()
    first, second = (gateway.commit_status(t) for t, _ in envelopes)  # type: ignore[attr-defined]
    assert first[0] == "VALID" and second[0] == "MVCC_READ_CONFLICT"
    assert second[1] == first[1]  # a result code in the winner's block, not an error
    assert json.loads(gateway.evaluate("GetLatest", ORIGIN))["size"] == 1  # type: ignore[attr-defined]


def test_resubmitted_envelope_is_ordered_again_as_duplicate_txid(
        peer: PeerDouble, client_identity: Identity) -> None:
    from fabric_protos.common import common_pb2
    from fabric_protos.peer import transaction_pb2

    signer, gateway = _registered(peer, client_identity)
    note = signer.sign_checkpoint(Checkpoint(ORIGIN, 1, merkle.hash_leaf(b"dup"))).decode()
    tx_id, envelope = _endorse_signed(gateway, "AnchorCheckpoint", [note, "[]"])
    _submit(gateway, tx_id, envelope)
    status, block = gateway.commit_status(tx_id)  # type: ignore[attr-defined]
    _submit(gateway, tx_id, envelope)  # accepted, not an error
    assert peer.gateway is not None and peer.gateway.block == block + 1  # a wasted block
    assert gateway.commit_status(tx_id) == (status, block)  # type: ignore[attr-defined]
    assert status == "VALID"
    wasted = peer.gateway.ledger.blocks[block + 1]
    assert [(t, code) for t, _, code in wasted] == [(tx_id, transaction_pb2.DUPLICATE_TXID)]
    # qscc finds the VALID original, not the duplicate copy.
    assert gateway.block_of(tx_id) == block  # type: ignore[attr-defined]
    raw = gateway.evaluate("GetBlockByTxID", "auditchannel", tx_id,  # type: ignore[attr-defined]
                           chaincode="qscc")
    assert common_pb2.Block.FromString(raw).header.number == block


def test_block_of_an_unknown_transaction_is_a_refusal(peer: PeerDouble,
                                                      client_identity: Identity) -> None:
    gateway = gateway_for(peer, client_identity)
    with pytest.raises(ChaincodeRefusedError, match="entry not found"):
        gateway.block_of("cd" * 32)


def test_unknown_chaincode_on_submit_is_a_configuration_error(
        peer: PeerDouble, client_identity: Identity) -> None:
    from ledger.anchor.fabric import FabricGateway
    from ledger.error_map import EXIT_USAGE, exit_code_for
    from ledger.errors import BackendConfigurationError

    gateway = FabricGateway(peer.endpoint, client_identity, "auditchannel", "nosuchcode")
    with pytest.raises(BackendConfigurationError, match="chaincode 'nosuchcode'") as info:
        gateway.submit("InitLog", ORIGIN, "key")
    assert "FAILED_PRECONDITION" in str(info.value)
    assert "no peers available" in info.value.diagnostics()  # the peer's own words
    assert exit_code_for(info.value) == EXIT_USAGE


def test_unknown_transaction_waits_until_the_deadline(peer: PeerDouble,
                                                      client_identity: Identity) -> None:
    from ledger.errors import BackendUnavailableError

    gateway = gateway_for(peer, client_identity, commit_timeout_s=0.5)
    with pytest.raises(BackendUnavailableError, match="unavailable"):
        gateway.commit_status("ab" * 32)


def test_unknown_channel_is_a_configuration_error_not_an_outage(
        peer: PeerDouble, client_identity: Identity) -> None:
    """A real 2.5 gateway answers Evaluate on a channel its peer has not joined with
    UNAVAILABLE ("failed to get config for channel"), Endorse with FAILED_PRECONDITION
    (seen on a real network): both are the settings, exit 2, never "unreachable"."""
    from ledger.anchor.fabric import FabricGateway
    from ledger.error_map import EXIT_USAGE, exit_code_for
    from ledger.errors import BackendConfigurationError

    gateway = FabricGateway(peer.endpoint, client_identity, "nochannel", "anchor")
    with pytest.raises(BackendConfigurationError, match="has not joined") as evaluated:
        gateway.evaluate("GetLatest", ORIGIN)
    assert "failed to get config for channel [nochannel]" in evaluated.value.diagnostics()
    assert exit_code_for(evaluated.value) == EXIT_USAGE
    with pytest.raises(BackendConfigurationError, match="FAILED_PRECONDITION") as submitted:
        gateway.submit("InitLog", ORIGIN, "key")
    assert "No metadata was found for chaincode anchor in channel nochannel" in \
        submitted.value.diagnostics()
    gateway.close()


def test_official_node_client_drives_the_double(peer: PeerDouble, client_identity: Identity,
                                                tmp_path: Path) -> None:
    """Faithfulness: the official @hyperledger/fabric-gateway client accepts the double."""
    import subprocess

    here = Path(__file__).parent / "node-client"
    assert (here / "node_modules").is_dir(), "run scripts/setup.sh"
    signer = NoteSigner(ORIGIN, Ed25519PrivateKey.generate())
    note = signer.sign_checkpoint(Checkpoint(ORIGIN, 1, merkle.hash_leaf(b"node")))
    proc = subprocess.run(
        ["node", str(here / "drive.js"), peer.endpoint, "Org1MSP",
         str(tmp_path / "client-cert.pem"), str(tmp_path / "client-key.pem"), "auditchannel",
         "anchor", ORIGIN, signer.verifier().encode(), note.decode()],
        capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["init"]["origin"] == ORIGIN
    assert out["anchor"]["valid"] is True and out["anchor"]["code"] == 0
    assert out["latest"]["size"] == 1 and out["latest"]["txId"] == out["anchor"]["txId"]
    assert out["refusal"]["name"] == "EndorseError" and out["refusal"]["code"] == 10  # ABORTED
    assert any("MALFORMED" in d for d in out["refusal"]["details"])


def test_a_missing_identity_file_names_the_file(tmp_path: Path) -> None:
    from ledger.errors import InvalidInputError

    with pytest.raises(InvalidInputError) as info:
        Identity.from_files("Org1MSP", tmp_path / "signcerts" / "cert.pem", tmp_path / "key")
    assert info.value.field == "fabric certificate" and "cert.pem" in info.value.reason
