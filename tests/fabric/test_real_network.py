"""Against a REAL Fabric 2.5 network, only when there is one:

- ``FABRIC_BIN`` set (Fabric 2.5 binaries): ``deploy/fabric/native.sh up`` starts one on
  loopback for this module and ``down`` removes it afterwards; the outage test stops and
  restarts its peer;
- or FABRIC_GATEWAY_ENDPOINT, FABRIC_MSPID, FABRIC_CERT, FABRIC_KEY (and FABRIC_TLS_CA,
  FABRIC_CHANNEL, FABRIC_CHAINCODE) point at a running one (the outage test is skipped:
  it cannot stop someone else's peer).

Skipped, with the reason, otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger import merkle
from ledger.anchor.fabric import ChaincodeRefusedError, FabricAnchor, FabricGateway, Identity
from ledger.anchor.worker import AnchorWorker
from ledger.checkpoint import Checkpoint, NoteSigner
from ledger.error_map import EXIT_USAGE, exit_code_for
from ledger.errors import BackendConfigurationError, BackendUnavailableError
from ledger.store.anchors import SqlAnchorStore
from ledger.store.integrator import Integrator
from ledger.store.keys import load_or_create_signer
from ledger.store.migrate import upgrade
from ledger.store.sql import SqlLedger
from tests.records import make_record

ROOT = Path(__file__).resolve().parents[2]
NATIVE = ROOT / "deploy" / "fabric" / "native.sh"
NEEDED = ("FABRIC_GATEWAY_ENDPOINT", "FABRIC_MSPID", "FABRIC_CERT", "FABRIC_KEY")
configured = all(os.environ.get(name) for name in NEEDED)
native = bool(os.environ.get("FABRIC_BIN")) and not configured

pytestmark = pytest.mark.skipif(
    not (configured or native),
    reason="no real Fabric network: set FABRIC_BIN (Fabric 2.5 binaries; native.sh starts "
           "one) or " + ", ".join(NEEDED))


@pytest.fixture(scope="module")
def network(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    if configured:
        yield {k: v for k, v in os.environ.items() if k.startswith("FABRIC_")}
        return
    work = tmp_path_factory.mktemp("fabric-native") / "net"
    env = dict(os.environ, FABRIC_NATIVE_DIR=str(work))
    up = subprocess.run([str(NATIVE), "up"], env=env, capture_output=True, text=True,
                        timeout=600)
    try:
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        values = {}
        for line in (work / "env").read_text().splitlines():
            name, _, value = line.removeprefix("export ").partition("=")
            values[name] = value
        values["FABRIC_NATIVE_DIR"] = str(work)
        yield values
    finally:
        subprocess.run([str(NATIVE), "down"], env=env, capture_output=True, timeout=120)


def gateway_of(values: dict[str, str], **kwargs: float) -> FabricGateway:
    tls = Path(values["FABRIC_TLS_CA"]) if values.get("FABRIC_TLS_CA") else None
    return FabricGateway(values["FABRIC_GATEWAY_ENDPOINT"],
                         Identity.from_files(values["FABRIC_MSPID"], Path(values["FABRIC_CERT"]),
                                             Path(values["FABRIC_KEY"])),
                         values.get("FABRIC_CHANNEL", "auditchannel"),
                         values.get("FABRIC_CHAINCODE", "anchor"), tls_ca=tls, **kwargs)


def test_anchor_on_a_real_network(network: dict[str, str]) -> None:
    gateway = gateway_of(network)
    origin = f"real-network-{uuid.uuid4().hex[:8]}/log"
    signer = NoteSigner(origin, Ed25519PrivateKey.generate())
    gateway.submit("InitLog", origin, signer.verifier().encode())
    tree = merkle.MemoryTree(merkle.hash_leaf(b"%d" % i) for i in range(5))
    note = signer.sign_checkpoint(Checkpoint(origin, 5, tree.root())).decode()
    tx_id, block, _ = gateway.submit("AnchorCheckpoint", note, "[]")
    assert json.loads(gateway.evaluate("GetLatest", origin))["txId"] == tx_id and block > 0
    assert gateway.block_of(tx_id) == block  # qscc on the channel agrees with CommitStatus
    # The same checkpoint again: refused at endorsement (nothing ordered), naming the
    # ORIGINAL transaction.
    with pytest.raises(ChaincodeRefusedError) as again:
        gateway.submit("AnchorCheckpoint", note, "[]")
    assert again.value.code == "ALREADY_ANCHORED" and tx_id in str(again.value)
    # The front-running jam: the note re-spelled (a junk character in the signature's
    # base64, which a lenient decoder skips) is refused by the real chaincode.
    head, blob = note.rstrip("\n").rsplit(" ", 1)
    with pytest.raises(ChaincodeRefusedError) as jam:
        gateway.submit("AnchorCheckpoint", f"{head} {blob[:10]}!{blob[10:]}\n", "[]")
    assert jam.value.code == "MALFORMED"
    with pytest.raises(ChaincodeRefusedError) as info:
        gateway.submit("AnchorCheckpoint", signer.sign_checkpoint(
            Checkpoint(origin, 3, tree.root(3))).decode(), "[]")
    assert info.value.code == "ROLLBACK"
    gateway.close()


def test_every_refusal_has_its_own_code_on_a_real_network(network: dict[str, str]) -> None:
    """The real peer carries the chaincode's refusal through Endorse as its own code."""
    gateway = gateway_of(network)
    origin = f"real-refusals-{uuid.uuid4().hex[:8]}/log"
    signer = NoteSigner(origin, Ed25519PrivateKey.generate())
    tree = merkle.MemoryTree(merkle.hash_leaf(b"%d" % i) for i in range(8))

    def note(size: int, root: bytes | None = None, by: NoteSigner = signer) -> str:
        return by.sign_checkpoint(Checkpoint(origin, size, root or tree.root(size))).decode()

    def refused(function: str, *args: str) -> str:
        with pytest.raises(ChaincodeRefusedError) as info:
            gateway.submit(function, *args)
        return info.value.code

    try:
        assert refused("AnchorCheckpoint", note(4), "[]") == "UNKNOWN_ORIGIN"
        gateway.submit("InitLog", origin, signer.verifier().encode())
        other = NoteSigner(origin, Ed25519PrivateKey.generate())
        assert refused("InitLog", origin, other.verifier().encode()) == "LOG_EXISTS"
        assert refused("AnchorCheckpoint", note(4, by=other), "[]") == "BAD_SIGNATURE"
        assert refused("AnchorCheckpoint", "not a note", "[]") == "MALFORMED"
        gateway.submit("AnchorCheckpoint", note(4), "[]")
        assert refused("AnchorCheckpoint", note(4, merkle.hash_leaf(b"other")), "[]") == "FORK"
        wrong = [h.hex() for h in tree.consistency_proof(3, 6)]
        assert refused("AnchorCheckpoint", note(6), json.dumps(wrong)) == "BAD_PROOF"
        assert refused("AnchorCheckpoint", note(2), "[]") == "ROLLBACK"
    finally:
        gateway.close()


def test_unknown_channel_or_chaincode_is_a_configuration_error(
        network: dict[str, str]) -> None:
    """The real gateway's answers (UNAVAILABLE on Evaluate for a channel its peer has not
    joined, FAILED_PRECONDITION otherwise) are configuration errors, not outages."""
    for channel, chaincode in (("nochannel", "anchor"), ("auditchannel", "nochaincode")):
        gateway = gateway_of(dict(network, FABRIC_CHANNEL=channel,
                                  FABRIC_CHAINCODE=chaincode))
        try:
            with pytest.raises(BackendConfigurationError) as evaluated:
                gateway.evaluate("GetLatest", "nobody/log")
            with pytest.raises(BackendConfigurationError) as submitted:
                gateway.submit("InitLog", "nobody/log", "key")
            for info in (evaluated, submitted):
                assert f"channel {channel!r} / chaincode {chaincode!r}" in str(info.value)
                assert exit_code_for(info.value) == EXIT_USAGE
        finally:
            gateway.close()


def test_an_mvcc_conflict_lands_in_the_winners_block(network: dict[str, str]) -> None:
    """What the peer double models, checked on the real thing: two anchors endorsed on the
    same state and ordered together; the second is MVCC_READ_CONFLICT in the SAME block."""
    from fabric_protos.gateway import gateway_pb2 as untyped

    messages: Any = untyped  # generated code without type stubs
    gateway = gateway_of(network)
    origin = f"real-mvcc-{uuid.uuid4().hex[:8]}/log"
    signer = NoteSigner(origin, Ed25519PrivateKey.generate())
    tree = merkle.MemoryTree(merkle.hash_leaf(b"%d" % i) for i in range(6))
    try:
        gateway.submit("InitLog", origin, signer.verifier().encode())
        prepared = []
        for size in (3, 5):  # both extend the empty log: both endorse
            note = signer.sign_checkpoint(Checkpoint(origin, size, tree.root(size))).decode()
            tx_id, signed = gateway._proposal("AnchorCheckpoint", [note, "[]"])
            endorsed = gateway._stub.Endorse(messages.EndorseRequest(
                transaction_id=tx_id, channel_id=gateway.channel, proposed_transaction=signed),
                timeout=30)
            envelope = endorsed.prepared_transaction
            envelope.signature = gateway.identity.sign(envelope.payload)
            prepared.append((tx_id, envelope))
        for tx_id, envelope in prepared:  # within one BatchTimeout: one block
            gateway._stub.Submit(messages.SubmitRequest(
                transaction_id=tx_id, channel_id=gateway.channel,
                prepared_transaction=envelope), timeout=30)
        (first, first_block), (second, second_block) = (
            gateway.commit_status(tx_id) for tx_id, _ in prepared)
        assert (first, second) == ("VALID", "MVCC_READ_CONFLICT")
        assert second_block == first_block
        latest = json.loads(gateway.evaluate("GetLatest", origin))
        assert (latest["size"], latest["txId"]) == (3, prepared[0][0])
    finally:
        gateway.close()


class LosesOneCommitStatus(FabricGateway):
    """Waits for the real commit, then reports the status lost once (as when the peer
    dies while the client waits): the transaction IS on the channel."""

    lost: tuple[str, int] | None = None

    def commit_status(self, tx_id: str) -> tuple[str, int]:
        code, block = super().commit_status(tx_id)
        if self.lost is None:
            self.lost = (tx_id, block)
            raise BackendUnavailableError("commit status lost (test)")
        return code, block


def test_a_lost_commit_status_is_reconciled_from_a_real_channel(
        network: dict[str, str], tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    upgrade(url)
    origin = f"real-lost-{uuid.uuid4().hex[:8]}.audit-ledger/log"
    signer = load_or_create_signer(tmp_path / "log.key", origin)
    tls = Path(network["FABRIC_TLS_CA"]) if network.get("FABRIC_TLS_CA") else None
    gateway = LosesOneCommitStatus(
        network["FABRIC_GATEWAY_ENDPOINT"],
        Identity.from_files(network["FABRIC_MSPID"], Path(network["FABRIC_CERT"]),
                            Path(network["FABRIC_KEY"])),
        network.get("FABRIC_CHANNEL", "auditchannel"),
        network.get("FABRIC_CHAINCODE", "anchor"), tls_ca=tls)
    gateway.lost = ("registration", 0)  # InitLog's status is not the one lost
    with SqlLedger(url) as ledger:
        store = SqlAnchorStore(ledger.engine)
        anchor = FabricAnchor(ledger, gateway, signer.verifier(), origin, store)
        anchor.register()
        gateway.lost = None
        integrator = Integrator(ledger, signer, origin)
        try:
            for i in range(4):
                ledger.append(make_record(i))
            sealed = integrator.seal_now()
            assert sealed is not None and sealed.size == 4
            recorded = anchor.anchor(sealed.note)
            assert gateway.lost is not None
            lost_tx, lost_block = gateway.lost
            # Recorded from the channel: the transaction whose status was lost, its block.
            assert recorded.size == 4
            assert recorded.ref == f"fabric:{gateway.channel}:{lost_tx}:{lost_block}"
            assert store.unreferenced_below(4) == 0
        finally:
            integrator.lease.release()
            gateway.close()


def _service(tmp_path: Path, network: dict[str, str]) -> tuple[SqlLedger, FabricAnchor,
                                                                Integrator, SqlAnchorStore]:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    upgrade(url)
    origin = f"real-outage-{uuid.uuid4().hex[:8]}.audit-ledger/log"
    signer = load_or_create_signer(tmp_path / "log.key", origin)
    ledger = SqlLedger(url)
    store = SqlAnchorStore(ledger.engine)
    anchor = FabricAnchor(ledger, gateway_of(network, timeout_s=5, commit_timeout_s=10),
                          signer.verifier(), origin, store)
    return ledger, anchor, Integrator(ledger, signer, origin), store


def test_worker_drains_after_a_real_peer_outage(network: dict[str, str],
                                                tmp_path: Path) -> None:
    if not native:
        pytest.skip("the outage test stops the peer that native.sh started")
    env = dict(os.environ, FABRIC_NATIVE_DIR=network["FABRIC_NATIVE_DIR"])
    ledger, anchor, integrator, store = _service(tmp_path, network)
    worker = AnchorWorker(ledger, anchor, interval_s=0.2, max_backoff_s=2.0, store=store)
    integrator.subscribe(worker.wake)
    worker.start()
    try:
        for i in range(3):
            ledger.append(make_record(i))
        integrator.seal_now()
        deadline = time.monotonic() + 120
        while worker.status().backlog and time.monotonic() < deadline:
            time.sleep(0.1)
        assert worker.status().anchored_size == 3
        subprocess.run([str(NATIVE), "stop-peer"], env=env, check=True, timeout=60)
        for i in range(3, 9):
            ledger.append(make_record(i))
            integrator.seal_now()
        subprocess.run([str(NATIVE), "start-peer"], env=env, check=True, timeout=120,
                       capture_output=True)
        deadline = time.monotonic() + 180
        while worker.status().backlog and time.monotonic() < deadline:
            time.sleep(0.2)
        assert worker.status().backlog == 0 and worker.status().anchored_size == 9
        assert store.unreferenced_below(9) == 0
        latest = anchor.latest_on_chain()
        assert latest is not None and latest["size"] == 9
        recorded = store.latest()
        assert recorded is not None and latest["txId"] in recorded.ref
    finally:
        worker.stop()
        integrator.lease.release()
        anchor.gateway.close()
        ledger.close()


def test_front_running_jam_refused_by_the_real_chaincode_and_the_service_anchors_on(
        network: dict[str, str], tmp_path: Path) -> None:
    """Issue 23's jam, on the real chaincode: another member of the channel (Org1's
    Admin) anchors re-spelled copies of the service's public note first; each is refused,
    and the service anchors its own note, then the next."""
    if not native:
        pytest.skip("needs a second member's identity: the Admin native.sh generated")
    from tests.fabric.test_channel_attacks import JAMS, respell

    org = Path(network["FABRIC_NATIVE_DIR"]) / "crypto" / "peerOrganizations" / \
        "org1.example.com" / "users" / "Admin@org1.example.com" / "msp"
    mallory = gateway_of(dict(
        network, FABRIC_CERT=str(org / "signcerts" / "Admin@org1.example.com-cert.pem"),
        FABRIC_KEY=str(next((org / "keystore").glob("*_sk")))))
    ledger, anchor, integrator, store = _service(tmp_path, network)
    try:
        anchor.register()
        for i in range(3):
            ledger.append(make_record(i))
        anchor.anchor(integrator.seal_now().note)  # type: ignore[union-attr]
        for i in range(3, 5):
            ledger.append(make_record(i))
        sealed = integrator.seal_now()
        assert sealed is not None and sealed.size == 5
        proof = json.dumps([h.hex() for h in ledger.consistency_proof(3, 5)])
        for how in JAMS:
            with pytest.raises(ChaincodeRefusedError) as refused:
                mallory.submit("AnchorCheckpoint", respell(sealed.note, how), proof)
            assert refused.value.code == "MALFORMED", (how, str(refused.value))
        assert anchor.anchor(sealed.note).size == 5
        latest = anchor.latest_on_chain()
        assert latest is not None and latest["note"] == sealed.note.decode()
        for i in range(5, 8):
            ledger.append(make_record(i))
        assert anchor.anchor(integrator.seal_now().note).size == 8  # type: ignore[union-attr]
        assert store.unreferenced_below(8) == 0
    finally:
        mallory.close()
        integrator.lease.release()
        anchor.gateway.close()
        ledger.close()
