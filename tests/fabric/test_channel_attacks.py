"""A channel member against the anchoring, on the peer double running the real chaincode:
the front-running jam (the service's public note re-spelled and anchored first), a
channel already jammed by the old chaincode, a replayed checkpoint, and what the
service shows meanwhile (metrics refreshed on a timer, the conflict named). Also the
double's fidelity where it once differed from a real peer (ErrorDetail on Evaluate, the
orderer's FORBIDDEN without one, 100 MiB messages, TLS)."""

from __future__ import annotations

import asyncio
import datetime
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from ledger.anchor.fabric import (
    AnchorConflictError,
    ChaincodeRefusedError,
    FabricGateway,
    Identity,
)
from ledger.errors import BackendError
from ledger.store.anchors import SqlAnchorStore
from ledger.store.keys import load_or_create_signer
from tests.cli_runs import cli_json
from tests.fabric.anchored_log import AnchoredLog, anchored_log
from tests.fabric.conftest import CHAINCODE, CHANNEL, MSPID, free_port, gateway_for, make_identity
from tests.fabric.peer_double import GatewayDouble, PeerDouble

ORIGIN = "channel-attacks.audit-ledger/log"


@pytest.fixture()
def service(peer: PeerDouble, client_identity: Identity, tmp_path: Path) -> Iterator[AnchoredLog]:
    with anchored_log(peer, client_identity, tmp_path, ORIGIN) as log:
        yield log


def respell(note: bytes, how: str) -> str:
    """The note as another channel member re-spells it: Node's lenient base64 decoder
    reads each spelling as the same signature."""
    text = note.decode()
    at = text.rindex("\n\n") + 2
    body, line = text[:at], text[at:-1]
    prefix, blob = line.rsplit(" ", 1)
    return {
        "junk character": f"{body}{prefix} {blob[:10]}!{blob[10:]}\n",
        "stripped padding": f"{body}{prefix} {blob.rstrip('=')}\n",
        "extra field": f"{body}{prefix} {blob} extra\n",
        "101 signature lines": body + (line + "\n") * 101,
        "512 KiB note": body + line + "\n" + "\u2014 other AAAAAAAA\n" * (512 * 1024 // 16),
    }[how]


JAMS = ["junk character", "stripped padding", "extra field", "101 signature lines",
        "512 KiB note"]


@pytest.mark.parametrize("how", JAMS)
def test_front_running_jam_is_refused_and_the_service_anchors_on(
        service: AnchoredLog, peer: PeerDouble, tmp_path: Path, how: str) -> None:
    service.grow(3)
    assert service.worker().run_once()  # size 3 anchored by the service
    sealed = service.grow(5)  # size 8, its note public through the API
    mallory = gateway_for(peer, make_identity(tmp_path, "mallory"))  # another Org1 client
    try:
        with pytest.raises(ChaincodeRefusedError) as refused:
            mallory.submit("AnchorCheckpoint", respell(sealed.note, how),
                           service.proof(3, 8))
        assert refused.value.code == "MALFORMED"
    finally:
        mallory.close()
    assert service.worker().run_once()  # the service anchors its own note
    latest = service.anchor.latest_on_chain()
    assert latest is not None and latest["size"] == 8
    assert latest["note"] == sealed.note.decode()
    assert service.store.unreferenced_below(8) == 0


def _stored_by_old_chaincode(double: GatewayDouble, size: int, note: str) -> None:
    """Rewrite the chain's record of ``size`` as the old (lenient) chaincode stored a
    re-spelled note: same size, root and transaction, another spelling."""
    with double.state.lock:
        for key in double.state.keys():
            value, version = double.state.get(key)
            if value is None or ("latest" not in key and "checkpoint" not in key):
                continue
            record = json.loads(value)
            if record.get("size") == size:
                record["note"] = note
                double.state.apply({key: json.dumps(record).encode()}, int(version or 0))


def test_a_channel_jammed_by_the_old_chaincode_does_not_stop_anchoring(
        service: AnchoredLog, peer: PeerDouble, tmp_path: Path) -> None:
    service.grow(3)
    service.worker().run_once()
    sealed = service.grow(2)
    # Mallory anchored the service's size-5 note first; the old chaincode kept her
    # spelling (a "!" inside the signature's base64), which no verifier can parse.
    mallory = gateway_for(peer, make_identity(tmp_path, "mallory"))
    try:
        mallory_tx, _, _ = mallory.submit("AnchorCheckpoint", sealed.note.decode(),
                                          service.proof(3, 5))
    finally:
        mallory.close()
    _stored_by_old_chaincode(service.double, 5, respell(sealed.note, "junk character"))
    latest = service.anchor.latest_on_chain()
    assert latest is not None and "!" in latest["note"]

    assert service.worker().run_once()  # reconciled: size 5 is anchored
    recorded = service.store.get(5)
    assert recorded is not None and recorded.note == sealed.note  # our own spelling
    assert mallory_tx in recorded.ref  # the chain's transaction
    newer = service.grow(3)
    assert service.worker().run_once()  # and anchoring goes on
    chain = service.anchor.latest_on_chain()
    assert chain is not None and chain["size"] == newer.size == 8
    assert service.store.unreferenced_below(8) == 0


def test_a_replayed_anchored_checkpoint_orders_no_transaction(service: AnchoredLog) -> None:
    first = service.grow(3)
    service.anchor.anchor(first.note)
    blocks = len(service.double.ledger.blocks)
    original = service.anchor.latest_on_chain()
    assert original is not None
    recorded = service.anchor.submit(first.note, since=3)  # a replay, e.g. after a crash
    assert len(service.double.ledger.blocks) == blocks  # refused at endorsement
    assert original["txId"] in recorded.ref
    with pytest.raises(ChaincodeRefusedError) as refused:
        service.gateway.submit("AnchorCheckpoint", first.note.decode(), "[]")
    assert refused.value.code == "ALREADY_ANCHORED" and original["txId"] in str(refused.value)


def _poll(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"never happened: {what}")
        time.sleep(0.05)


def test_anchor_metrics_refresh_on_a_timer_while_the_worker_backs_off(
        service: AnchoredLog) -> None:
    service.anchor.anchor(service.grow(2).note)
    service.double.down = True  # an outage: every attempt fails, the backoff is long
    worker = service.worker(interval_s=0.05, max_backoff_s=3600.0, refresh_s=0.05).start()
    try:
        service.grow(1)
        worker.wake()
        _poll(lambda: worker.failures >= 1, "an attempt failed")
        for count in range(2, 5):  # checkpoints sealed while the worker sleeps
            service.grow(1)
            _poll(lambda count=count: worker.current().backlog == count,  # type: ignore[misc]
                  f"backlog {count} shown")
        assert worker.current().lag_s > 0
    finally:
        service.double.down = False
        worker.stop()


def test_an_anchor_on_another_history_is_named_and_not_retried_soon(
        service: AnchoredLog, tmp_path: Path) -> None:
    from ledger import merkle
    from ledger.checkpoint import Checkpoint

    service.grow(3)
    signer = load_or_create_signer(tmp_path / "log.key", ORIGIN)
    foreign = signer.sign_checkpoint(Checkpoint(ORIGIN, 3, merkle.hash_leaf(b"elsewhere")))
    service.gateway.submit("AnchorCheckpoint", foreign.decode(), "[]")
    worker = service.worker(interval_s=0.05, config_backoff_s=3600.0, refresh_s=0.05).start()
    try:
        _poll(lambda: worker.conflict is not None, "the conflict named")
        assert "not a checkpoint of this log's database" in str(worker.conflict)
        assert worker.failures == 1  # backing off for an hour, not spinning
    finally:
        worker.stop()
    with pytest.raises(AnchorConflictError):
        service.anchor.reconcile()


# --- the double, where it once differed from a real peer --------------------------------

def test_evaluate_errors_carry_an_error_detail_like_the_real_gateway(
        peer: PeerDouble, client_identity: Identity) -> None:
    from ledger.anchor.fabric import _error_details

    gateway = gateway_for(peer, client_identity)
    try:
        tx_id, signed = gateway._proposal("GetLatest", ["nobody/log"])
        from fabric_protos.gateway import gateway_pb2

        with pytest.raises(grpc.RpcError) as raw:
            gateway._stub.Evaluate(gateway_pb2.EvaluateRequest(
                transaction_id=tx_id, channel_id=CHANNEL, proposed_transaction=signed))
        assert raw.value.code() == grpc.StatusCode.UNKNOWN
        assert any("chaincode response 500, NOT_FOUND" in d for d in _error_details(raw.value))
    finally:
        gateway.close()


def test_an_envelope_signed_by_another_member_is_the_orderers_forbidden_without_detail(
        peer: PeerDouble, client_identity: Identity, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    gateway = gateway_for(peer, client_identity)
    mallory = make_identity(tmp_path, "mallory")
    # The proposal signed by the client, the envelope by another member of the channel.
    real, calls = Identity.sign, []

    def sign(self: Identity, message: bytes) -> bytes:
        calls.append(message)
        return real(mallory if len(calls) == 2 else self, message)

    monkeypatch.setattr(Identity, "sign", sign)
    try:
        with pytest.raises(BackendError) as refused:
            gateway.submit("InitLog", ORIGIN, load_or_create_signer(
                tmp_path / "log.key", ORIGIN).verifier().encode())
        assert not isinstance(refused.value, ChaincodeRefusedError)
        assert "FORBIDDEN" in str(refused.value) and "ABORTED" in str(refused.value)
    finally:
        gateway.close()


def test_a_note_over_the_chaincodes_cap_is_refused_not_resource_exhausted(
        service: AnchoredLog) -> None:
    sealed = service.grow(3)
    # 5 MiB: past grpc's default 4 MiB, within a real peer's 100 MiB.
    big = sealed.note.decode() + "\u2014 other AAAAAAAA\n" * (5 * 1024 * 1024 // 16)
    with pytest.raises(ChaincodeRefusedError) as refused:
        service.gateway.submit("AnchorCheckpoint", big, "[]")
    assert refused.value.code == "MALFORMED" and "larger than" in str(refused.value)


def _tls_pair(host: str = "127.0.0.1") -> tuple[bytes, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "peer0.double")])
    now = datetime.datetime.now(datetime.UTC)
    import ipaddress

    certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.SubjectAlternativeName(
                       [x509.IPAddress(ipaddress.ip_address(host))]), critical=False)
                   .sign(key, hashes.SHA256()))
    return (certificate.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


def test_the_double_serves_tls_and_a_plaintext_client_is_refused(
        tmp_path: Path, client_identity: Identity) -> None:
    from ledger.errors import BackendUnavailableError

    peer_identity = make_identity(tmp_path, "peer0")
    certificate, key = _tls_pair()
    (tmp_path / "tls-ca.pem").write_bytes(certificate)
    double = PeerDouble(CHANNEL, CHAINCODE, MSPID,
                        (peer_identity.serialized(), peer_identity.private_key),
                        free_port(), free_port(), tls=(certificate, key)).start()
    try:
        secure = FabricGateway(double.endpoint, client_identity, CHANNEL, CHAINCODE,
                               tls_ca=tmp_path / "tls-ca.pem", timeout_s=10)
        _, block, _ = secure.submit("InitLog", ORIGIN, load_or_create_signer(
            tmp_path / "log.key", ORIGIN).verifier().encode())
        assert block == 1
        secure.close()
        plain = FabricGateway(double.endpoint, client_identity, CHANNEL, CHAINCODE,
                              timeout_s=2)
        with pytest.raises(BackendUnavailableError, match="TLS"):
            plain.evaluate("GetLatest", ORIGIN)
        plain.close()
    finally:
        double.stop()


async def test_an_anchor_on_another_history_is_named_on_readyz_and_metrics(
        aiohttp_client: Any, tiny_generator: Any, tmp_path: Path) -> None:
    """End to end through the service (its embedded local anchor): an anchors row of
    another history, signed with the log's key, stops anchoring; /readyz names it and
    /metrics flags it, instead of a silent retry loop."""
    from prometheus_client.parser import text_string_to_metric_families

    from inference_wrapper.server.app import (
        ANCHOR_WORKER,
        INTEGRATOR,
        KEYS,
        LEDGER,
        SIGNER,
        create_app,
    )
    from inference_wrapper.server.settings import Settings
    from ledger import merkle
    from ledger.checkpoint import Checkpoint

    settings = Settings(database_url=f"sqlite:///{tmp_path / 'ledger.db'}",
                        log_key_path=tmp_path / "log.key", checkpoint_interval_s=3600,
                        anchor_interval_s=3600)
    app = create_app(settings, tiny_generator)
    client = await aiohttp_client(app)
    token = app[KEYS].create("bank-a", "client")[0]
    signer, origin = app[SIGNER], app[SIGNER].name
    foreign = signer.sign_checkpoint(Checkpoint(origin, 1, merkle.hash_leaf(b"elsewhere")))
    SqlAnchorStore(app[LEDGER].engine).record(1, foreign, "local", "local:1")  # a restored copy
    for _ in range(2):
        answer = await client.post("/v1/generate", json={"prompt": "hi", "max_new_tokens": 2},
                                   headers={"Authorization": f"Bearer {token}"})
        assert answer.status == 200
    assert app[INTEGRATOR].seal_now() is not None  # wakes the anchoring worker

    deadline = time.monotonic() + 60
    while app[ANCHOR_WORKER].conflict is None:
        assert time.monotonic() < deadline, "the conflict was never named"
        await asyncio.sleep(0.05)
    ready = await (await client.get("/readyz")).json()
    assert ready["anchor_error"] == app[ANCHOR_WORKER].conflict
    samples = {s.name: s.value for f in text_string_to_metric_families(
        await (await client.get("/metrics")).text()) for s in f.samples}
    assert samples["audit_anchor_conflict"] == 1.0
    assert samples["audit_anchor_consecutive_failures"] >= 1.0


@pytest.mark.parametrize("how", JAMS)
def test_verify_reads_the_anchor_of_a_channel_jammed_by_the_old_chaincode(
        service: AnchoredLog, peer: PeerDouble, tmp_path: Path,
        capsys: pytest.CaptureFixture[str], how: str) -> None:
    """The old chaincode kept a member's re-spelling of the service's note as the latest
    anchor. A verifier reading the channel takes the signature lines the old decoder
    accepted, spelled canonically, and checks them with the pinned key as always."""
    service.grow(3)
    service.worker().run_once()
    sealed = service.grow(2)
    assert service.worker().run_once()  # size 5 anchored, then the old chaincode's copy
    _stored_by_old_chaincode(service.double, 5, respell(sealed.note, how))
    latest = service.anchor.latest_on_chain()
    assert latest is not None and latest["size"] == 5
    assert latest["note"] != sealed.note.decode()
    identity = tmp_path / "client-cert.pem", tmp_path / "client-key.pem"
    code, result = cli_json(
        capsys, "verify", _record_id(service, 1), "--db", service.ledger.url,
        "--log-key", load_or_create_signer(tmp_path / "log.key", ORIGIN).verifier().encode(),
        "--fabric-endpoint", peer.endpoint, "--fabric-mspid", MSPID,
        "--fabric-cert", str(identity[0]), "--fabric-key", str(identity[1]),
        "--fabric-channel", CHANNEL)
    assert code == 0, result["checks"][3]
    assert result["checks"][3]["status"] == "pass"
    assert "fabric:" in result["checks"][3]["reason"], result["checks"][3]


def _record_id(service: AnchoredLog, leaf_index: int) -> str:
    row = service.ledger.record_at(leaf_index)
    assert row is not None
    return row.record_id
