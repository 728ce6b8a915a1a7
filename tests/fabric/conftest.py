"""A Fabric peer double running the real chaincode, and identities for it."""

from __future__ import annotations

import datetime
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from ledger.anchor.fabric import Identity
from tests.fabric.peer_double import PeerDouble

MSPID = "Org1MSP"
CHANNEL = "auditchannel"
CHAINCODE = "anchor"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def make_identity(directory: Path, name: str, mspid: str = MSPID) -> Identity:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name),
                         x509.NameAttribute(NameOID.ORGANIZATION_NAME, mspid)])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
                   .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / f"{name}-cert.pem", directory / f"{name}-key.pem"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return Identity.from_files(mspid, cert_path, key_path)


@pytest.fixture()
def client_identity(tmp_path: Path) -> Identity:
    return make_identity(tmp_path, "client")


def new_double(directory: Path, batch_timeout_s: float = 0.0) -> PeerDouble:
    node_modules = Path(__file__).resolve().parents[2] / "chaincode" / "node_modules"
    assert node_modules.is_dir(), "run scripts/setup.sh (it installs the chaincode's packages)"
    peer_identity = make_identity(directory, "peer0")
    return PeerDouble(CHANNEL, CHAINCODE, MSPID,
                      (peer_identity.serialized(), peer_identity.private_key),
                      free_port(), free_port(), batch_timeout_s=batch_timeout_s)


@pytest.fixture()
def peer(tmp_path: Path) -> Iterator[PeerDouble]:
    double = new_double(tmp_path).start()
    yield double
    double.stop()


@pytest.fixture()
def stopped_peer(tmp_path: Path) -> Iterator[PeerDouble]:
    """A double that is NOT serving yet (its port is chosen): the test starts it."""
    double = new_double(tmp_path)
    yield double
    double.stop()


def gateway_for(peer: PeerDouble, identity: Identity, **kwargs: Any) -> Any:
    from ledger.anchor.fabric import FabricGateway

    return FabricGateway(peer.endpoint, identity, CHANNEL, CHAINCODE, **kwargs)
