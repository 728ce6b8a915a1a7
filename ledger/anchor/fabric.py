"""A Hyperledger Fabric Gateway client (grpcio + the Fabric protos + cryptography) and
the anchor that stores checkpoints through our chaincode.

``fabric-sdk-py`` does not install on Python 3.11 and predates the Gateway; the Gateway
protocol is small: build a signed proposal, Endorse, sign the prepared envelope, Submit,
then wait on CommitStatus. Field by field this follows the official Go and Node clients.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import (
    decode_dss_signature,
    encode_dss_signature,
)
from fabric_protos.common import common_pb2
from fabric_protos.gateway import gateway_pb2, gateway_pb2_grpc
from fabric_protos.msp import identities_pb2
from fabric_protos.peer import chaincode_pb2, proposal_pb2, transaction_pb2
from google.protobuf import timestamp_pb2

from ledger.checkpoint import NoteVerifier
from ledger.errors import (
    BackendConfigurationError,
    BackendError,
    BackendUnavailableError,
    InvalidInputError,
    VerificationError,
)
from ledger.store.log_api import AnchoredCheckpoint, AnchoredLog, AnchorStore

log = logging.getLogger(__name__)

# Order of the P-256 group: signatures must use the lower half of s (Fabric rejects high-S).
P256_ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551


class ChaincodeRefusedError(BackendError):
    """The chaincode refused the call; ``code`` is its error code (e.g. ROLLBACK)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        head = message.rsplit("chaincode response 500, ", 1)[-1]
        self.code = head.split(":", 1)[0].strip() if ":" in head else "UNKNOWN"


class AnchorConflictError(VerificationError):
    """The channel holds an anchor of this log that is not a checkpoint of its database
    (a restored backup, a fork, or an answer that is not an anchor at all)."""


def _chain_anchor(latest: dict[str, Any]) -> tuple[int, bytes, str]:
    """(size, root, tx id) of the chaincode's latest record, strictly read."""
    size, root, tx_id = latest.get("size"), latest.get("root"), latest.get("txId")
    if (isinstance(size, bool) or not isinstance(size, int) or size < 0
            or not isinstance(root, str) or len(root) != 64 or not isinstance(tx_id, str)
            or not tx_id):
        raise AnchorConflictError(f"the channel's latest anchor is not one this service "
                                  f"can read: {str(latest)[:200]}")
    try:
        return size, bytes.fromhex(root), tx_id
    except ValueError as exc:
        raise AnchorConflictError(f"the channel's latest anchor has root {root[:70]!r}, not "
                                  "hex") from exc


class InvalidTransactionError(BackendError):
    """The transaction was ordered but not valid (e.g. MVCC_READ_CONFLICT)."""

    def __init__(self, tx_id: str, code: str, block: int) -> None:
        super().__init__(f"transaction {tx_id} committed as {code} in block {block}")
        self.tx_id, self.code, self.block = tx_id, code, block


class CommitStatusLostError(BackendUnavailableError):
    """Submit was accepted but the commit status never came back: the transaction may
    have committed. Reconcile from the chain; never assume it failed."""

    def __init__(self, tx_id: str, cause: str) -> None:
        super().__init__(f"commit status of transaction {tx_id} lost: {cause}")
        self.tx_id = tx_id


def sign_low_s(key: ec.EllipticCurvePrivateKey, message: bytes) -> bytes:
    r, s = decode_dss_signature(key.sign(message, ec.ECDSA(hashes.SHA256())))
    if s > P256_ORDER // 2:
        s = P256_ORDER - s
    return encode_dss_signature(r, s)


@dataclass(frozen=True)
class Identity:
    """An MSP identity: the MSP id, the enrolment certificate (PEM) and its key."""

    mspid: str
    certificate_pem: bytes
    private_key: ec.EllipticCurvePrivateKey

    @classmethod
    def from_files(cls, mspid: str, certificate: Path, key: Path) -> Identity:
        for field, path in (("fabric certificate", certificate), ("fabric key", key)):
            if not Path(path).is_file():
                # e.g. cryptogen names the certificate <user>@<org>-cert.pem, not cert.pem
                raise InvalidInputError(field, f"no such file: {path}")
        private = serialization.load_pem_private_key(Path(key).read_bytes(), password=None)
        if not isinstance(private, ec.EllipticCurvePrivateKey):
            raise ValueError("the identity key must be an EC (P-256) key")
        x509.load_pem_x509_certificate(Path(certificate).read_bytes())  # fail early if bad
        return cls(mspid, Path(certificate).read_bytes(), private)

    def serialized(self) -> bytes:
        return identities_pb2.SerializedIdentity(
            mspid=self.mspid, id_bytes=self.certificate_pem).SerializeToString()

    def sign(self, message: bytes) -> bytes:
        return sign_low_s(self.private_key, message)


class FabricGateway:
    """Evaluate and submit transactions of one chaincode on one channel."""

    def __init__(self, endpoint: str, identity: Identity, channel: str, chaincode: str, *,
                 tls_ca: Path | None = None, timeout_s: float = 30.0,
                 commit_timeout_s: float = 60.0) -> None:
        self.identity, self.channel, self.chaincode = identity, channel, chaincode
        self.timeout_s, self.commit_timeout_s = timeout_s, commit_timeout_s
        self.endpoint, self.tls = endpoint, tls_ca is not None
        # gRPC's own reconnect backoff grows to 120 s by default: a peer back after an
        # outage would stay unused for minutes. Our worker backs off itself.
        # A peer sends messages up to 100 MiB; grpc's default receive limit is 4 MiB.
        options = [("grpc.initial_reconnect_backoff_ms", 200),
                   ("grpc.max_reconnect_backoff_ms", 5000),
                   ("grpc.max_receive_message_length", 100 * 1024 * 1024)]
        if tls_ca is not None:
            credentials = grpc.ssl_channel_credentials(Path(tls_ca).read_bytes())
            self._grpc = grpc.secure_channel(endpoint, credentials, options=options)
        else:
            self._grpc = grpc.insecure_channel(endpoint, options=options)
        self._stub = gateway_pb2_grpc.GatewayStub(self._grpc)

    def close(self) -> None:
        self._grpc.close()

    def _proposal(self, function: str, args: Sequence[str],
                  chaincode: str | None = None) -> tuple[str, Any]:
        creator = self.identity.serialized()
        nonce = os.urandom(24)
        tx_id = hashlib.sha256(nonce + creator).hexdigest()
        now = timestamp_pb2.Timestamp()
        now.GetCurrentTime()
        chaincode_id = chaincode_pb2.ChaincodeID(name=chaincode or self.chaincode)
        channel_header = common_pb2.ChannelHeader(
            type=common_pb2.ENDORSER_TRANSACTION, timestamp=now, channel_id=self.channel,
            tx_id=tx_id, extension=proposal_pb2.ChaincodeHeaderExtension(
                chaincode_id=chaincode_id).SerializeToString())
        header = common_pb2.Header(
            channel_header=channel_header.SerializeToString(),
            signature_header=common_pb2.SignatureHeader(
                creator=creator, nonce=nonce).SerializeToString())
        spec = chaincode_pb2.ChaincodeSpec(
            type=chaincode_pb2.ChaincodeSpec.NODE, chaincode_id=chaincode_id,
            input=chaincode_pb2.ChaincodeInput(
                args=[function.encode(), *(a.encode() for a in args)]))
        payload = proposal_pb2.ChaincodeProposalPayload(
            input=chaincode_pb2.ChaincodeInvocationSpec(
                chaincode_spec=spec).SerializeToString())
        proposal = proposal_pb2.Proposal(
            header=header.SerializeToString(), payload=payload.SerializeToString())
        proposal_bytes = proposal.SerializeToString()
        signed = proposal_pb2.SignedProposal(
            proposal_bytes=proposal_bytes, signature=self.identity.sign(proposal_bytes))
        return tx_id, signed

    def _call(self, method: Any, request: Any, timeout: float) -> Any:
        try:
            return method(request, timeout=timeout)
        except grpc.RpcError as exc:
            code, details = exc.code(), exc.details() or ""
            extra = _error_details(exc)
            if code == grpc.StatusCode.UNAVAILABLE and details.startswith(
                    "failed to get config for channel"):
                # A real 2.5 gateway's Evaluate on a channel its peer has not joined: the
                # peer answered, so this is the configuration, not an outage.
                raise self._misconfigured("the peer has not joined the channel", details) from exc
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                hint = "" if self.tls else (
                    " (no TLS CA given: a TLS network, as every Raft one is, needs the peer's "
                    "TLS CA certificate)")
                raise BackendUnavailableError(
                    f"Fabric gateway unavailable: {details}{hint}") from exc
            message = "; ".join(extra) or details
            if code == grpc.StatusCode.FAILED_PRECONDITION:
                # An unknown channel or chaincode, or an identity the channel refuses:
                # the configuration is wrong, and retrying soon will not change that.
                raise self._misconfigured("FAILED_PRECONDITION", message) from exc
            if code in (grpc.StatusCode.ABORTED, grpc.StatusCode.UNKNOWN) and (
                    "chaincode response" in message or extra):
                raise ChaincodeRefusedError(message) from exc
            raise BackendError(f"Fabric gateway: {code.name}: {details} {extra}") from exc

    def _misconfigured(self, why: str, detail: str) -> BackendConfigurationError:
        return BackendConfigurationError(
            f"Fabric gateway {self.endpoint} refused channel {self.channel!r} / "
            f"chaincode {self.chaincode!r} for MSP {self.identity.mspid!r} ({why}); check "
            "the channel, chaincode and identity settings", detail=detail)

    def evaluate(self, function: str, *args: str, chaincode: str | None = None) -> bytes:
        tx_id, signed = self._proposal(function, args, chaincode)
        response = self._call(self._stub.Evaluate, gateway_pb2.EvaluateRequest(
            transaction_id=tx_id, channel_id=self.channel, proposed_transaction=signed),
            self.timeout_s)
        return bytes(response.result.payload)

    def submit(self, function: str, *args: str) -> tuple[str, int, bytes]:
        """Endorse, sign, submit and wait for commit; returns (tx id, block, result)."""
        tx_id, signed = self._proposal(function, args)
        endorsed = self._call(self._stub.Endorse, gateway_pb2.EndorseRequest(
            transaction_id=tx_id, channel_id=self.channel, proposed_transaction=signed),
            self.timeout_s)
        envelope = endorsed.prepared_transaction
        envelope.signature = self.identity.sign(envelope.payload)
        self._call(self._stub.Submit, gateway_pb2.SubmitRequest(
            transaction_id=tx_id, channel_id=self.channel, prepared_transaction=envelope),
            self.timeout_s)
        try:
            code, block = self.commit_status(tx_id)
        except BackendUnavailableError as exc:
            raise CommitStatusLostError(tx_id, str(exc)) from exc
        if code != "VALID":
            raise InvalidTransactionError(tx_id, code, block)
        return tx_id, block, _result_of(envelope)

    def commit_status(self, tx_id: str) -> tuple[str, int]:
        """Wait until ``tx_id`` commits; its validation code name and block number."""
        request = gateway_pb2.CommitStatusRequest(
            transaction_id=tx_id, channel_id=self.channel,
            identity=self.identity.serialized()).SerializeToString()
        status = self._call(self._stub.CommitStatus, gateway_pb2.SignedCommitStatusRequest(
            request=request, signature=self.identity.sign(request)), self.commit_timeout_s)
        return transaction_pb2.TxValidationCode.Name(status.result), int(status.block_number)


    def block_of(self, tx_id: str) -> int:
        """The number of the block holding ``tx_id``, read from the channel (qscc
        GetBlockByTxID); raises ``InvalidTransactionError`` if it is there but not valid."""
        raw = self.evaluate("GetBlockByTxID", self.channel, tx_id, chaincode="qscc")
        block = common_pb2.Block.FromString(raw)
        number = int(block.header.number)
        flags = block.metadata.metadata[common_pb2.BlockMetadataIndex.TRANSACTIONS_FILTER] \
            if len(block.metadata.metadata) > common_pb2.BlockMetadataIndex.TRANSACTIONS_FILTER \
            else b""
        for position, data in enumerate(block.data.data):
            payload = common_pb2.Payload.FromString(common_pb2.Envelope.FromString(data).payload)
            header = common_pb2.ChannelHeader.FromString(payload.header.channel_header)
            if header.tx_id != tx_id:
                continue
            code = flags[position] if position < len(flags) else transaction_pb2.VALID
            if code == transaction_pb2.VALID:
                return number
            # A DUPLICATE_TXID copy may come after the valid original in the same block.
            if code != transaction_pb2.DUPLICATE_TXID:
                raise InvalidTransactionError(tx_id, transaction_pb2.TxValidationCode.Name(code),
                                              number)
        raise BackendError(f"block {number} returned for transaction {tx_id} does not hold "
                           "it as a valid transaction")


def _fields(data: bytes) -> list[tuple[int, int, bytes | int]]:
    """A minimal protobuf wire-format reader: (field number, wire type, value)."""
    out: list[tuple[int, int, bytes | int]] = []
    i = 0

    def varint() -> int:
        nonlocal i
        shift = result = 0
        while True:
            byte = data[i]
            i += 1
            result |= (byte & 0x7F) << shift
            if byte < 0x80:
                return result
            shift += 7

    while i < len(data):
        key = varint()
        number, wire = key >> 3, key & 7
        if wire == 0:
            out.append((number, wire, varint()))
        elif wire == 2:
            length = varint()
            out.append((number, wire, data[i:i + length]))
            i += length
        else:  # fixed 32/64-bit: not used by google.rpc.Status
            size = 8 if wire == 1 else 4
            out.append((number, wire, data[i:i + size]))
            i += size
    return out


def _error_details(exc: grpc.RpcError) -> list[str]:
    """The ``gateway.ErrorDetail`` messages a Fabric gateway attaches to its status
    (``grpc-status-details-bin``: a google.rpc.Status whose field 3 holds Any messages)."""
    trailers = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    raw = dict(trailers or ()).get("grpc-status-details-bin")
    if not isinstance(raw, bytes):
        return []
    messages = []
    for number, _, value in _fields(raw):
        if number != 3 or not isinstance(value, bytes):
            continue
        parts = {n: v for n, _, v in _fields(value) if isinstance(v, bytes)}
        if parts.get(1, b"").decode("utf-8", "replace").endswith("gateway.ErrorDetail"):
            detail = gateway_pb2.ErrorDetail.FromString(parts.get(2, b""))
            messages.append(detail.message)
    return messages


def _result_of(envelope: Any) -> bytes:
    """The chaincode's response payload inside a prepared transaction."""
    from fabric_protos.peer import proposal_response_pb2

    payload = common_pb2.Payload.FromString(envelope.payload)
    transaction = transaction_pb2.Transaction.FromString(payload.data)
    action = transaction_pb2.ChaincodeActionPayload.FromString(
        transaction.actions[0].payload)
    prp = proposal_response_pb2.ProposalResponsePayload.FromString(
        action.action.proposal_response_payload)
    chaincode_action = proposal_pb2.ChaincodeAction.FromString(prp.extension)
    return bytes(chaincode_action.response.payload)


class FabricAnchor:
    """Anchors checkpoints through the chaincode and records the transaction the chain
    stored (tx id, block) in the anchor store.

    The chain is the source of truth: before each anchor, and after any commit status that
    was lost or not VALID, ``reconcile`` reads the chain's latest anchor and records it
    locally if it is newer than what the store holds. So a transaction that committed while
    the client was not listening is recorded with its own tx id and block, and its rows get
    their reference.
    """

    kind = "fabric"

    def __init__(self, ledger: AnchoredLog, gateway: FabricGateway, verifier: NoteVerifier,
                 origin: str, store: AnchorStore | None = None) -> None:
        self.ledger, self.gateway, self.verifier, self.origin = ledger, gateway, verifier, origin
        self.store: AnchorStore = store or ledger.anchors

    def prepare(self) -> None:
        """Register the log's key (idempotent: the chaincode accepts the same key again)."""
        self.register()

    def register(self) -> None:
        # Two replicas registering at once: both write the new key, one comes back
        # MVCC_READ_CONFLICT. Submitting again reads the registration and stores nothing.
        for attempt in range(3):
            try:
                self.gateway.submit("InitLog", self.origin, self.verifier.encode())
                return
            except InvalidTransactionError as exc:
                if exc.code != "MVCC_READ_CONFLICT" or attempt == 2:
                    raise

    def latest_on_chain(self) -> dict[str, Any] | None:
        try:
            raw = self.gateway.evaluate("GetLatest", self.origin)
        except ChaincodeRefusedError as exc:
            if exc.code == "NOT_FOUND":
                return None
            raise
        try:
            latest = json.loads(raw)
        except ValueError as exc:
            raise AnchorConflictError("the channel's latest anchor is not JSON") from exc
        if not isinstance(latest, dict):
            raise AnchorConflictError("the channel's latest anchor is not a JSON object")
        return latest

    def latest_size(self) -> int:
        latest = self.latest_on_chain()
        return _chain_anchor(latest)[0] if latest else 0

    def checkpoint(self, size: int) -> dict[str, Any]:
        return dict(json.loads(self.gateway.evaluate("GetCheckpoint", self.origin, str(size))))

    def ref(self, tx_id: str, block: int) -> str:
        return f"fabric:{self.gateway.channel}:{tx_id}:{block}"

    def reconcile(self) -> tuple[int, AnchoredCheckpoint | None]:
        """Record the chain's latest anchor if the store lacks it; returns (the size the
        chain holds, the store's latest anchor afterwards)."""
        latest = self.latest_on_chain()
        local = self.store.latest()
        if latest is None:
            return 0, local
        size, root, tx_id = _chain_anchor(latest)
        if local is not None and local.size >= size:
            return size, local
        # The chaincode verified the note's signature and the consistency of its size and
        # root before storing them: those two are what the chain vouches for. The note's
        # own spelling is not re-read (a copy another channel member re-spelled, which
        # this parser refuses, must not stop anchoring for good): the store keeps this
        # database's own note of that size, once its root is the chain's.
        ours = self.ledger.checkpoint(size)
        if ours is None or ours.root != root:
            # Not a checkpoint of this database: a restored backup or a fork. Nothing is
            # recorded; an operator must look (the worker reports it on /readyz).
            raise AnchorConflictError(f"the channel's anchor of size {size} (root "
                                      f"{root.hex()[:16]}...) is not a checkpoint of this "
                                      "log's database")
        block = self.gateway.block_of(tx_id)
        log.info("reconciled anchor of size %d from the channel (tx %s, block %d)",
                 size, tx_id, block)
        return size, self.store.record(size, ours.note, self.kind, self.ref(tx_id, block))

    def submit(self, note: bytes, since: int) -> AnchoredCheckpoint:
        """Submit ``note`` (extending the chain's anchor of size ``since``) and record the
        transaction that STORED it. The chaincode refuses a checkpoint already anchored
        (ALREADY_ANCHORED, at endorsement: no transaction is ordered); the chain's own
        record of it is then read and kept."""
        offered = self.verifier.open_checkpoint(note, self.origin)
        proof = (self.ledger.consistency_proof(since, offered.size)
                 if since and offered.size > since else [])
        try:
            tx_id, block, result = self.gateway.submit("AnchorCheckpoint", note.decode(),
                                                       json.dumps([h.hex() for h in proof]))
        except ChaincodeRefusedError as exc:
            if exc.code != "ALREADY_ANCHORED":
                raise
            _, anchored = self.reconcile()
            if anchored is None or anchored.size < offered.size:
                raise
            return anchored
        stored = json.loads(result)
        stored_tx = str(stored.get("txId") or tx_id)
        if int(stored.get("size", offered.size)) != offered.size:
            raise BackendError(f"the chaincode stored size {stored.get('size')} for a "
                               f"checkpoint of size {offered.size}")
        if stored_tx != tx_id:
            block = self.gateway.block_of(stored_tx)
        return self.store.record(offered.size, note, self.kind, self.ref(stored_tx, block))

    def anchor(self, note: bytes) -> AnchoredCheckpoint:
        offered = self.verifier.open_checkpoint(note, self.origin)
        chain_size, anchored = self.reconcile()
        if anchored is not None and anchored.size >= offered.size:
            return anchored
        try:
            return self.submit(note, since=chain_size)
        except (BackendUnavailableError, InvalidTransactionError, ChaincodeRefusedError) as exc:
            # Lost status, MVCC conflict with another replica, a peer gone mid-call, or
            # ROLLBACK because another replica anchored a newer one since we looked: the
            # chain may hold this checkpoint (or a newer one) all the same.
            if isinstance(exc, ChaincodeRefusedError) and exc.code not in (
                    "ROLLBACK", "ALREADY_ANCHORED"):
                raise
            log.warning("anchoring size %d: %s; reconciling from the channel",
                        offered.size, exc)
            try:
                _, anchored = self.reconcile()
            except BackendError:
                raise exc from None  # still unreachable: the next attempt reconciles
            if anchored is not None and anchored.size >= offered.size:
                return anchored
            raise
