"""A test double of a Fabric 2.5 peer with its Gateway, faithful to what
``shared/FABRIC_PROTOCOL.md`` records of a real peer, running the REAL chaincode.

The chaincode runs as chaincode-as-a-service (``fabric-chaincode-node server``); the
double dials it and speaks the chaincode protocol (REGISTER / REGISTERED / READY, then
TRANSACTION answered by GET_STATE, PUT_STATE, GET_STATE_BY_RANGE, QUERY_STATE_CLOSE,
COMPLETED) against an in-memory world state.

Faithful: transaction id = hex(SHA-256(nonce || creator)); ECDSA P-256 signatures checked
on proposals, envelopes and commit-status requests, high-S rejected; the chaincode
header extension must name the chaincode; Evaluate errors are UNKNOWN "chaincode
response 500, <message>"; Endorse errors are ABORTED with a gateway.ErrorDetail; Endorse
returns an unsigned envelope whose payload header is the proposal's header; Submit of an
unsigned envelope is INVALID_ARGUMENT, of one signed by another identity ABORTED (the
transaction id stays usable); a resubmitted committed envelope succeeds; CommitStatus
waits until commit (DEADLINE_EXCEEDED for unknown ids) and reports MVCC_READ_CONFLICT as
a result code with a block number; an unknown channel is UNAVAILABLE.

Differences from a real peer, on purpose: one peer, one organisation, no orderer (each
Submit is cut into its own block at once), no MSP validation of the certificate chain
(any well-formed certificate of the configured MSP id is a member), no _lifecycle read in
the read set, no ChaincodeEvents stream, no TLS.
"""

from __future__ import annotations

import hashlib
import queue
import subprocess
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from fabric_protos.common import common_pb2
from fabric_protos.gateway import gateway_pb2, gateway_pb2_grpc
from fabric_protos.ledger.queryresult import kv_query_result_pb2
from fabric_protos.ledger.rwset import rwset_pb2
from fabric_protos.ledger.rwset.kvrwset import kv_rwset_pb2
from fabric_protos.msp import identities_pb2
from fabric_protos.peer import (
    chaincode_pb2,
    chaincode_shim_pb2,
    chaincode_shim_pb2_grpc,
    proposal_pb2,
    proposal_response_pb2,
    transaction_pb2,
)
from google.protobuf import any_pb2

from ledger.anchor.fabric import P256_ORDER, sign_low_s

M = chaincode_shim_pb2.ChaincodeMessage
ROOT = Path(__file__).resolve().parents[2]


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def status_with_details(code: grpc.StatusCode, message: str, details: list[Any]) -> bytes:
    """google.rpc.Status {code, message, details} in wire format (no extra dependency)."""
    body = _varint(1 << 3) + _varint(code.value[0]) + _field(2, message.encode())
    return body + b"".join(_field(3, d.SerializeToString()) for d in details)


class ProtocolError(Exception):
    def __init__(self, code: grpc.StatusCode, message: str, detail: str | None = None):
        super().__init__(message)
        self.code, self.message, self.detail = code, message, detail


def verify_signature(identity_bytes: bytes, message: bytes, signature: bytes) -> str:
    """Check an ECDSA P-256 / SHA-256 low-S signature by a serialized identity."""
    identity = identities_pb2.SerializedIdentity.FromString(identity_bytes)
    certificate = x509.load_pem_x509_certificate(identity.id_bytes)
    key = certificate.public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise InvalidSignature("not an EC key")
    _, s = decode_dss_signature(signature)
    if s > P256_ORDER // 2:
        raise InvalidSignature("high-S signature")
    key.verify(signature, message, ec.ECDSA(hashes.SHA256()))
    return str(identity.mspid)


@dataclass
class Execution:
    response: Any
    reads: dict[str, int | None] = field(default_factory=dict)  # key -> version read
    writes: dict[str, bytes | None] = field(default_factory=dict)
    event: Any = None


class ChaincodeConnection:
    """The peer's side of the chaincode protocol, over one stream to a CCaaS server."""

    def __init__(self, address: str) -> None:
        self._channel = grpc.insecure_channel(address)
        grpc.channel_ready_future(self._channel).result(timeout=30)
        self._outbox: queue.Queue[Any] = queue.Queue()
        stub = chaincode_shim_pb2_grpc.ChaincodeStub(self._channel)
        self._inbox = stub.Connect(iter(self._outbox.get, None))
        first = next(self._inbox)
        if first.type != M.REGISTER:
            raise RuntimeError(f"chaincode opened with {M.Type.Name(first.type)}")
        self._outbox.put(M(type=M.REGISTERED))
        self._outbox.put(M(type=M.READY))
        self._lock = threading.Lock()

    def close(self) -> None:
        self._outbox.put(None)
        self._channel.close()

    def execute(self, state: WorldState, channel: str, tx_id: str, signed_proposal: Any,
                args: list[bytes]) -> Execution:
        with self._lock:
            run = Execution(response=None)
            self._outbox.put(M(type=M.TRANSACTION, txid=tx_id, channel_id=channel,
                               proposal=signed_proposal,
                               payload=chaincode_pb2.ChaincodeInput(args=args).SerializeToString()))
            for message in self._inbox:
                if message.type == M.COMPLETED:
                    run.response = proposal_response_pb2.Response.FromString(message.payload)
                    run.event = message.chaincode_event if message.HasField(
                        "chaincode_event") else None
                    return run
                if message.type == M.ERROR:
                    run.response = proposal_response_pb2.Response(
                        status=500, message=message.payload.decode(errors="replace"))
                    return run
                reply = self._serve(state, run, message)
                self._outbox.put(M(type=M.RESPONSE, txid=message.txid,
                                   channel_id=message.channel_id, payload=reply))
            raise RuntimeError("chaincode stream ended")

    def _serve(self, state: WorldState, run: Execution, message: Any) -> bytes:
        if message.type == M.GET_STATE:
            key = chaincode_shim_pb2.GetState.FromString(message.payload).key
            if key in run.writes:
                return run.writes[key] or b""
            value, version = state.get(key)
            run.reads.setdefault(key, version)
            return value or b""
        if message.type == M.PUT_STATE:
            put = chaincode_shim_pb2.PutState.FromString(message.payload)
            run.writes[put.key] = put.value
            return b""
        if message.type == M.DEL_STATE:
            run.writes[chaincode_shim_pb2.DelState.FromString(message.payload).key] = None
            return b""
        if message.type == M.GET_STATE_BY_RANGE:
            request = chaincode_shim_pb2.GetStateByRange.FromString(message.payload)
            meta = chaincode_shim_pb2.QueryMetadata.FromString(request.metadata)
            start = meta.bookmark or request.startKey
            keys = [k for k in state.keys() if start <= k < request.endKey
                    and not (meta.bookmark and k == meta.bookmark)]
            page = keys[: meta.pageSize] if meta.pageSize else keys
            results = []
            for key in page:
                value, version = state.get(key)
                run.reads.setdefault(key, version)
                kv = kv_query_result_pb2.KV(key=key, value=value or b"")
                results.append(chaincode_shim_pb2.QueryResultBytes(resultBytes=kv.SerializeToString()))
            bookmark = page[-1] if meta.pageSize and len(page) == meta.pageSize else ""
            return chaincode_shim_pb2.QueryResponse(
                results=results, has_more=False, id="range",
                metadata=chaincode_shim_pb2.QueryResponseMetadata(
                    fetched_records_count=len(page), bookmark=bookmark).SerializeToString(),
            ).SerializeToString()
        if message.type in (M.QUERY_STATE_CLOSE, M.QUERY_STATE_NEXT):
            return chaincode_shim_pb2.QueryResponse(has_more=False).SerializeToString()
        raise RuntimeError(f"chaincode asked for unsupported {M.Type.Name(message.type)}")


class WorldState:
    def __init__(self) -> None:
        self._data: dict[str, tuple[bytes, int]] = {}
        self.lock = threading.Lock()

    def get(self, key: str) -> tuple[bytes | None, int | None]:
        item = self._data.get(key)
        return (item[0], item[1]) if item else (None, None)

    def keys(self) -> list[str]:
        return sorted(self._data)

    def apply(self, writes: dict[str, bytes | None], block: int) -> None:
        for key, value in writes.items():
            if value is None:
                self._data.pop(key, None)
            else:
                self._data[key] = (value, block)


@dataclass
class Committed:
    code: int
    block: int
    envelope: bytes


class GatewayDouble(gateway_pb2_grpc.GatewayServicer):  # type: ignore[misc]
    def __init__(self, chaincode: ChaincodeConnection, channel: str, chaincode_name: str,
                 mspid: str, peer_identity: tuple[bytes, ec.EllipticCurvePrivateKey]) -> None:
        self.cc, self.channel, self.chaincode_name, self.mspid = (
            chaincode, channel, chaincode_name, mspid)
        self.peer_identity, self.peer_key = peer_identity
        self.state = WorldState()
        self.endorsed: dict[str, Execution] = {}
        self.committed: dict[str, Committed] = {}
        self.block = 0
        self.commit_lock = threading.Condition()

    # --- checks every real peer makes -------------------------------------------------

    def _check_proposal(self, signed: Any) -> tuple[Any, Any, Any, list[bytes]]:
        proposal = proposal_pb2.Proposal.FromString(signed.proposal_bytes)
        header = common_pb2.Header.FromString(proposal.header)
        channel_header = common_pb2.ChannelHeader.FromString(header.channel_header)
        signature_header = common_pb2.SignatureHeader.FromString(header.signature_header)
        if channel_header.channel_id != self.channel:
            raise ProtocolError(grpc.StatusCode.UNAVAILABLE,
                                f"channel {channel_header.channel_id} not found")
        expected = hashlib.sha256(signature_header.nonce + signature_header.creator).hexdigest()
        if channel_header.tx_id != expected:
            raise ProtocolError(grpc.StatusCode.FAILED_PRECONDITION,
                                "error validating proposal: incorrectly computed txid")
        try:
            creator = identities_pb2.SerializedIdentity.FromString(signature_header.creator)
            if creator.mspid != self.mspid:
                raise InvalidSignature(f"unknown MSP {creator.mspid}")
            verify_signature(signature_header.creator, signed.proposal_bytes, signed.signature)
        except (InvalidSignature, ValueError) as exc:
            raise ProtocolError(grpc.StatusCode.FAILED_PRECONDITION,
                                f"error validating proposal: access denied: channel "
                                f"[{self.channel}] creator org [{self.mspid}]: {exc}") from exc
        extension = proposal_pb2.ChaincodeHeaderExtension.FromString(channel_header.extension)
        if not extension.HasField("chaincode_id") or not extension.chaincode_id.name:
            raise ProtocolError(grpc.StatusCode.FAILED_PRECONDITION,
                                "ChaincodeHeaderExtension.ChaincodeId is nil")
        if extension.chaincode_id.name != self.chaincode_name:
            raise ProtocolError(grpc.StatusCode.FAILED_PRECONDITION,
                                f"no peers available to evaluate chaincode "
                                f"{extension.chaincode_id.name} in channel {self.channel}")
        payload = proposal_pb2.ChaincodeProposalPayload.FromString(proposal.payload)
        spec = chaincode_pb2.ChaincodeInvocationSpec.FromString(payload.input)
        return proposal, header, channel_header, list(spec.chaincode_spec.input.args)

    # --- the Gateway service ----------------------------------------------------------

    def Evaluate(self, request: Any, context: Any) -> Any:
        return self._guard(context, lambda: self._evaluate(request))

    def _evaluate(self, request: Any) -> Any:
        _, _, channel_header, args = self._check_proposal(request.proposed_transaction)
        with self.state.lock:
            run = self.cc.execute(self.state, self.channel, channel_header.tx_id,
                                  request.proposed_transaction, args)
        if run.response.status >= 400:
            raise ProtocolError(grpc.StatusCode.UNKNOWN, "evaluate call to endorser returned "
                                f"error: chaincode response {run.response.status}, "
                                f"{run.response.message}")
        return gateway_pb2.EvaluateResponse(result=run.response)

    def Endorse(self, request: Any, context: Any) -> Any:
        return self._guard(context, lambda: self._endorse(request))

    def _endorse(self, request: Any) -> Any:
        proposal, header, channel_header, args = self._check_proposal(request.proposed_transaction)
        tx_id = channel_header.tx_id
        if tx_id in self.committed:
            raise ProtocolError(grpc.StatusCode.ABORTED, "failed to endorse transaction, see "
                                "attached details", f"duplicate transaction found [{tx_id}]")
        with self.state.lock:
            run = self.cc.execute(self.state, self.channel, tx_id,
                                  request.proposed_transaction, args)
        if run.response.status >= 400:
            raise ProtocolError(grpc.StatusCode.ABORTED, "failed to endorse transaction, see "
                                "attached details", f"chaincode response "
                                f"{run.response.status}, {run.response.message}")
        self.endorsed[tx_id] = run
        kv = kv_rwset_pb2.KVRWSet(
            reads=[kv_rwset_pb2.KVRead(
                key=k, version=None if v is None else kv_rwset_pb2.Version(block_num=v))
                for k, v in run.reads.items()],
            writes=[kv_rwset_pb2.KVWrite(key=k, is_delete=v is None, value=v or b"")
                    for k, v in run.writes.items()])
        results = rwset_pb2.TxReadWriteSet(data_model=rwset_pb2.TxReadWriteSet.KV, ns_rwset=[
            rwset_pb2.NsReadWriteSet(namespace=self.chaincode_name,
                                     rwset=kv.SerializeToString())])
        payload = proposal_pb2.ChaincodeProposalPayload.FromString(proposal.payload)
        stripped = proposal_pb2.ChaincodeProposalPayload(input=payload.input).SerializeToString()
        proposal_hash = hashlib.sha256(header.channel_header + header.signature_header
                                       + stripped).digest()
        action = proposal_pb2.ChaincodeAction(
            results=results.SerializeToString(),
            events=run.event.SerializeToString() if run.event is not None else b"",
            response=run.response,
            chaincode_id=chaincode_pb2.ChaincodeID(name=self.chaincode_name, version="1"))
        prp = proposal_response_pb2.ProposalResponsePayload(
            proposal_hash=proposal_hash, extension=action.SerializeToString()).SerializeToString()
        endorsement = proposal_response_pb2.Endorsement(
            endorser=self.peer_identity,
            signature=sign_low_s(self.peer_key, prp + self.peer_identity))
        transaction = transaction_pb2.Transaction(actions=[transaction_pb2.TransactionAction(
            header=header.signature_header,
            payload=transaction_pb2.ChaincodeActionPayload(
                chaincode_proposal_payload=stripped,
                action=transaction_pb2.ChaincodeEndorsedAction(
                    proposal_response_payload=prp, endorsements=[endorsement]),
            ).SerializeToString())])
        envelope = common_pb2.Envelope(payload=common_pb2.Payload(
            header=header, data=transaction.SerializeToString()).SerializeToString())
        return gateway_pb2.EndorseResponse(prepared_transaction=envelope)

    def Submit(self, request: Any, context: Any) -> Any:
        return self._guard(context, lambda: self._submit(request))

    def _submit(self, request: Any) -> Any:
        if request.channel_id != self.channel:
            raise ProtocolError(grpc.StatusCode.UNAVAILABLE, f"no orderers for channel "
                                f"{request.channel_id}")
        envelope = request.prepared_transaction
        if not envelope.signature:
            raise ProtocolError(grpc.StatusCode.INVALID_ARGUMENT,
                                "prepared transaction must be signed")
        payload = common_pb2.Payload.FromString(envelope.payload)
        channel_header = common_pb2.ChannelHeader.FromString(payload.header.channel_header)
        signature_header = common_pb2.SignatureHeader.FromString(payload.header.signature_header)
        tx_id = channel_header.tx_id
        try:
            verify_signature(signature_header.creator, envelope.payload, envelope.signature)
        except (InvalidSignature, ValueError) as exc:
            raise ProtocolError(
                grpc.StatusCode.ABORTED, "failed to submit transaction",
                f"FORBIDDEN: implicit policy evaluation failed - Writers: {exc}") from exc
        with self.commit_lock:
            if tx_id in self.committed:
                return gateway_pb2.SubmitResponse()
            run = self.endorsed.get(tx_id)
            if run is None:
                raise ProtocolError(grpc.StatusCode.ABORTED, "failed to submit transaction",
                                    "transaction was not endorsed by this gateway")
            self.block += 1
            with self.state.lock:
                conflict = any(self.state.get(k)[1] != v for k, v in run.reads.items())
                if not conflict:
                    self.state.apply(run.writes, self.block)
            code = (transaction_pb2.MVCC_READ_CONFLICT if conflict else transaction_pb2.VALID)
            self.committed[tx_id] = Committed(code, self.block, envelope.payload)
            self.commit_lock.notify_all()
        return gateway_pb2.SubmitResponse()

    def CommitStatus(self, request: Any, context: Any) -> Any:
        return self._guard(context, lambda: self._commit_status(request, context))

    def _commit_status(self, signed: Any, context: Any) -> Any:
        request = gateway_pb2.CommitStatusRequest.FromString(signed.request)
        try:
            verify_signature(request.identity, signed.request, signed.signature)
        except (InvalidSignature, ValueError) as exc:
            raise ProtocolError(grpc.StatusCode.PERMISSION_DENIED, f"access denied: {exc}") from exc
        with self.commit_lock:
            while request.transaction_id not in self.committed:
                remaining = context.time_remaining()
                if remaining is not None and remaining <= 0:
                    raise ProtocolError(grpc.StatusCode.DEADLINE_EXCEEDED, "context deadline "
                                        "exceeded")
                self.commit_lock.wait(timeout=min(remaining or 1.0, 1.0))
            done = self.committed[request.transaction_id]
        return gateway_pb2.CommitStatusResponse(result=done.code, block_number=done.block)

    def _guard(self, context: Any, call: Any) -> Any:
        try:
            return call()
        except ProtocolError as error:
            if error.detail is not None:
                detail = gateway_pb2.ErrorDetail(address="peer0.double:7051", msp_id=self.mspid,
                                                 message=error.detail)
                packed = any_pb2.Any()
                packed.Pack(detail, type_url_prefix="type.googleapis.com/")
                context.set_trailing_metadata((("grpc-status-details-bin",
                                                status_with_details(error.code, error.message,
                                                                    [packed])),))
            context.abort(error.code, error.message)


class PeerDouble:
    """Starts the chaincode server (Node) and the Gateway double; stop() ends both."""

    def __init__(self, channel: str, chaincode_name: str, mspid: str,
                 peer_identity: tuple[bytes, ec.EllipticCurvePrivateKey],
                 gateway_port: int, chaincode_port: int) -> None:
        self.channel, self.chaincode_name, self.mspid = channel, chaincode_name, mspid
        self.peer_identity = peer_identity
        self.gateway_port, self.chaincode_port = gateway_port, chaincode_port
        self.server: grpc.Server | None = None
        self.node: subprocess.Popen[bytes] | None = None
        self.gateway: GatewayDouble | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.gateway_port}"

    def start_chaincode(self) -> None:
        binary = ROOT / "chaincode" / "node_modules" / ".bin" / "fabric-chaincode-node"
        self.node = subprocess.Popen(
            [str(binary), "server", "--chaincode-address", f"127.0.0.1:{self.chaincode_port}",
             "--chaincode-id", f"{self.chaincode_name}:double", "--module-path",
             str(ROOT / "chaincode")], cwd=ROOT / "chaincode",
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def start(self, world: WorldState | None = None) -> PeerDouble:
        if self.node is None:
            self.start_chaincode()
        connection = ChaincodeConnection(f"127.0.0.1:{self.chaincode_port}")
        gateway = GatewayDouble(connection, self.channel, self.chaincode_name, self.mspid,
                                self.peer_identity)
        if world is not None:
            gateway.state = world
        self.gateway = gateway
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        gateway_pb2_grpc.add_GatewayServicer_to_server(gateway, self.server)
        self.server.add_insecure_port(self.endpoint)
        self.server.start()
        return self

    def stop_gateway(self) -> WorldState:
        """Stop serving (a peer outage); returns the world state to restart with."""
        assert self.server is not None and self.gateway is not None
        self.server.stop(grace=None).wait()
        self.gateway.cc.close()
        return self.gateway.state

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(grace=None)
        if self.gateway is not None:
            self.gateway.cc.close()
        if self.node is not None:
            self.node.terminate()
            self.node.wait(timeout=10)
        time.sleep(0)
