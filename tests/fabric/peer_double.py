"""A test double of a Fabric 2.5 peer with its Gateway, faithful to what
``shared/FABRIC_PROTOCOL.md`` records of a real peer, running the REAL chaincode.

The chaincode runs as chaincode-as-a-service (``fabric-chaincode-node server``); the
double dials it and speaks the chaincode protocol (REGISTER / REGISTERED / READY, then
TRANSACTION answered by GET_STATE, PUT_STATE, GET_STATE_BY_RANGE, QUERY_STATE_CLOSE,
COMPLETED) against an in-memory world state.

Faithful: transaction id = hex(SHA-256(nonce || creator)); ECDSA P-256 signatures checked
on proposals, envelopes and commit-status requests, high-S rejected; the chaincode
header extension must name the chaincode; Evaluate errors are UNKNOWN "chaincode
response 500, <message>" with a gateway.ErrorDetail, as are Endorse errors (ABORTED);
Endorse returns an unsigned envelope whose payload header is the proposal's header; Submit
of an unsigned envelope is INVALID_ARGUMENT, of one signed by another identity ABORTED
with the orderer's FORBIDDEN text and no ErrorDetail (the transaction id stays usable);
messages up to 100 MiB, as a real peer; TLS when started with a certificate; a
resubmitted committed envelope succeeds; CommitStatus waits until commit
(DEADLINE_EXCEEDED for unknown ids) and reports MVCC_READ_CONFLICT as a result code
with a block number; an unknown channel is UNAVAILABLE on Evaluate and
FAILED_PRECONDITION on Endorse, in the real gateway's words.

Ordering is modelled by a batch cutter: Submit queues the envelope; a block is cut when
``batch_timeout_s`` has passed since the first queued one (at once when it is 0), or when
a test releases a ``hold()``. Validation then runs in block order: a transaction whose read
versions changed is MVCC_READ_CONFLICT in the SAME block as the winner; a resubmitted
envelope (committed or already queued) is accepted by Submit, ordered again and marked
DUPLICATE_TXID, while CommitStatus keeps reporting the first copy. ``qscc``
GetBlockByTxID is served (block number, envelopes and the transactions filter), so a
client can find the block of a transaction it never saw commit. ``drop_commit_status``
makes the next N CommitStatus calls fail UNAVAILABLE after the transaction committed (a
peer dying while the client waits; with ``down_after_drop`` every later call fails too
until a test sets ``down`` back to False). The blocks and world state survive a gateway restart
(``stop_gateway`` returns them, ``start`` takes them back).

Differences from a real peer, on purpose (not modelled):
- one peer, one organisation, no orderer process: no Raft, no BatchSize in bytes or
  message count beyond ``max_batch``, no leader election delay (SERVICE_UNAVAILABLE);
- endorsement policy: one endorsement, never evaluated against a policy; no MSP
  validation of the certificate chain (any well-formed certificate of the configured MSP
  id is a member); Submit does not re-check the endorsement signature;
- range reads: no range-query info in the read set, so a phantom read (a key inserted
  into a range after it was read) is NOT detected at validation;
- iterators: every range result comes in the first response (``has_more`` is false);
  QUERY_STATE_NEXT answers an empty page;
- bookmarks: paginated ranges restart after the bookmark key; the peer's exact bookmark
  encoding and its cap on page sizes are not reproduced;
- no private data, no ``_lifecycle`` read in the read set, no ChaincodeEvents or block
  event streams, TLS only when asked for (``tls``), other qscc functions
  (GetChainInfo, GetBlockByNumber, GetTransactionByID) not served;
- an unknown transaction id in qscc answers like the peer's "entry not found" but the
  wording of the real message is approximated.
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


@dataclass
class PeerLedger:
    """What a peer keeps across restarts: world state and the blocks (by number)."""

    state: WorldState = field(default_factory=WorldState)
    committed: dict[str, Committed] = field(default_factory=dict)  # first copy of each tx
    # blocks[n] = [(tx id, envelope payload, validation code)]; block 0 is the genesis
    blocks: list[list[tuple[str, bytes, int]]] = field(default_factory=lambda: [[]])


class GatewayDouble(gateway_pb2_grpc.GatewayServicer):  # type: ignore[misc]
    def __init__(self, chaincode: ChaincodeConnection, channel: str, chaincode_name: str,
                 mspid: str, peer_identity: tuple[bytes, ec.EllipticCurvePrivateKey],
                 ledger: PeerLedger | None = None, batch_timeout_s: float = 0.0,
                 max_batch: int = 10) -> None:
        self.cc, self.channel, self.chaincode_name, self.mspid = (
            chaincode, channel, chaincode_name, mspid)
        self.peer_identity, self.peer_key = peer_identity
        self.ledger = ledger or PeerLedger()
        self.state, self.committed = self.ledger.state, self.ledger.committed
        self.endorsed: dict[str, Execution] = {}
        self.commit_lock = threading.Condition()
        self.batch_timeout_s, self.max_batch = batch_timeout_s, max_batch
        self.pending: list[tuple[str, bytes]] = []
        self._first_pending_at = 0.0
        self._held = False
        self.drop_commit_status = 0  # answer the next N CommitStatus calls UNAVAILABLE
        self.down_after_drop = False  # and then answer every call UNAVAILABLE (peer died)
        self.down = False
        self._closed = False
        self._cutter = threading.Thread(target=self._cut_loop, name="double-orderer",
                                        daemon=True)
        self._cutter.start()

    @property
    def block(self) -> int:
        return len(self.ledger.blocks) - 1

    def close(self) -> None:
        with self.commit_lock:
            self._closed = True
            self.commit_lock.notify_all()
        self._cutter.join(timeout=5)

    # --- the orderer, modelled as a batch cutter --------------------------------------

    def hold(self) -> None:
        """Queue submitted transactions without cutting a block until ``release``."""
        with self.commit_lock:
            self._held = True

    def release(self) -> None:
        """Cut everything queued into blocks (``max_batch`` transactions each)."""
        with self.commit_lock:
            self._held = False
            while self.pending:
                self._cut()

    def _cut_loop(self) -> None:
        with self.commit_lock:
            while not self._closed:
                if self.pending and not self._held and self.batch_timeout_s > 0:
                    due = self._first_pending_at + self.batch_timeout_s - time.monotonic()
                    if due <= 0:
                        self._cut()
                        continue
                    self.commit_lock.wait(timeout=due)
                else:
                    self.commit_lock.wait(timeout=1.0)

    def _cut(self) -> None:
        """Cut the queued transactions into one block and validate them in order
        (caller holds ``commit_lock``)."""
        if not self.pending:
            return
        batch, self.pending = self.pending[: self.max_batch], self.pending[self.max_batch:]
        self._first_pending_at = time.monotonic()
        number = len(self.ledger.blocks)
        entries: list[tuple[str, bytes, int]] = []
        with self.state.lock:
            for tx_id, payload in batch:
                run = self.endorsed.get(tx_id)
                if tx_id in self.committed or any(t == tx_id for t, _, _ in entries) \
                        or run is None:
                    entries.append((tx_id, payload, transaction_pb2.DUPLICATE_TXID))
                    continue
                conflict = any(self.state.get(k)[1] != v for k, v in run.reads.items())
                if not conflict:
                    self.state.apply(run.writes, number)
                code = transaction_pb2.MVCC_READ_CONFLICT if conflict else transaction_pb2.VALID
                entries.append((tx_id, payload, code))
                self.committed[tx_id] = Committed(code, number, payload)
        self.ledger.blocks.append(entries)
        self.commit_lock.notify_all()

    # --- checks every real peer makes -------------------------------------------------

    def _check_proposal(self, signed: Any, *, endorse: bool = False
                        ) -> tuple[Any, Any, Any, list[bytes]]:
        proposal = proposal_pb2.Proposal.FromString(signed.proposal_bytes)
        header = common_pb2.Header.FromString(proposal.header)
        channel_header = common_pb2.ChannelHeader.FromString(header.channel_header)
        signature_header = common_pb2.SignatureHeader.FromString(header.signature_header)
        if channel_header.channel_id != self.channel:
            # A real 2.5 gateway's words for a channel its peer has not joined: Evaluate
            # fails connecting the channel's peers (UNAVAILABLE), Endorse finds no
            # endorsement plan (FAILED_PRECONDITION).
            channel = channel_header.channel_id
            if endorse:
                named = proposal_pb2.ChaincodeHeaderExtension.FromString(
                    channel_header.extension).chaincode_id.name
                raise ProtocolError(grpc.StatusCode.FAILED_PRECONDITION,
                                    "no combination of peers can be derived which satisfy "
                                    "the endorsement policy: No metadata was found for "
                                    f"chaincode {named} in channel {channel}")
            raise ProtocolError(grpc.StatusCode.UNAVAILABLE,
                                f"failed to get config for channel [{channel}]: could not "
                                f"get last config for channel {channel}")
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
        if extension.chaincode_id.name not in (self.chaincode_name, "qscc"):
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
        extension = proposal_pb2.ChaincodeHeaderExtension.FromString(channel_header.extension)
        if extension.chaincode_id.name == "qscc":
            return gateway_pb2.EvaluateResponse(result=self._qscc(args))
        with self.state.lock:
            run = self.cc.execute(self.state, self.channel, channel_header.tx_id,
                                  request.proposed_transaction, args)
        if run.response.status >= 400:
            # The real gateway attaches an ErrorDetail to Evaluate errors too.
            raise ProtocolError(grpc.StatusCode.UNKNOWN, "evaluate call to endorser returned "
                                f"error: chaincode response {run.response.status}, "
                                f"{run.response.message}", f"chaincode response "
                                f"{run.response.status}, {run.response.message}")
        return gateway_pb2.EvaluateResponse(result=run.response)

    def _qscc(self, args: list[bytes]) -> Any:
        """The query system chaincode: only GetBlockByTxID(channel, tx id)."""
        function = args[0].decode() if args else ""
        if function != "GetBlockByTxID" or len(args) != 3:
            raise ProtocolError(grpc.StatusCode.UNKNOWN, "evaluate call to endorser returned "
                                f"error: chaincode response 500, {function} is not served "
                                "by this double")
        channel, tx_id = args[1].decode(), args[2].decode()
        with self.commit_lock:
            done = self.committed.get(tx_id) if channel == self.channel else None
            entries = list(self.ledger.blocks[done.block]) if done else []
        if done is None:
            raise ProtocolError(grpc.StatusCode.UNKNOWN, "evaluate call to endorser returned "
                                f"error: chaincode response 500, Failed to get block for "
                                f"txID {tx_id}, error entry not found in index")
        envelopes = [common_pb2.Envelope(payload=payload).SerializeToString()
                     for _, payload, _ in entries]
        metadata = [b""] * 5
        metadata[common_pb2.BlockMetadataIndex.TRANSACTIONS_FILTER] = bytes(
            code for _, _, code in entries)
        block = common_pb2.Block(header=common_pb2.BlockHeader(number=done.block),
                                 data=common_pb2.BlockData(data=envelopes),
                                 metadata=common_pb2.BlockMetadata(metadata=metadata))
        return proposal_response_pb2.Response(status=200, payload=block.SerializeToString())

    def Endorse(self, request: Any, context: Any) -> Any:
        return self._guard(context, lambda: self._endorse(request))

    def _endorse(self, request: Any) -> Any:
        proposal, header, channel_header, args = self._check_proposal(
            request.proposed_transaction, endorse=True)
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
            # The orderer's refusal: ABORTED with the FORBIDDEN text in the status message
            # and, unlike the gateway's own errors, no ErrorDetail attached.
            raise ProtocolError(
                grpc.StatusCode.ABORTED, "failed to submit transaction: orderer answered "
                "FORBIDDEN: implicit policy evaluation failed - 0 sub-policies were "
                f"satisfied, but this policy requires 1 of the 'Writers' sub-policies ({exc})"
            ) from exc
        with self.commit_lock:
            # A committed envelope submitted again is accepted and ordered again (the
            # peer marks that copy DUPLICATE_TXID); an unknown one was never endorsed.
            if tx_id not in self.committed and tx_id not in self.endorsed:
                raise ProtocolError(grpc.StatusCode.ABORTED, "failed to submit transaction",
                                    "transaction was not endorsed by this gateway")
            if not self.pending:
                self._first_pending_at = time.monotonic()
            self.pending.append((tx_id, bytes(envelope.payload)))
            if self._held:
                pass
            elif self.batch_timeout_s <= 0 or len(self.pending) >= self.max_batch:
                self._cut()
            else:
                self.commit_lock.notify_all()  # wake the cutter's timer
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
            dropped = self.drop_commit_status > 0
            if dropped:
                self.drop_commit_status -= 1
                self.down = self.down or self.down_after_drop
        if dropped:  # committed, but the client never hears of it
            raise ProtocolError(grpc.StatusCode.UNAVAILABLE, "connection reset by peer")
        return gateway_pb2.CommitStatusResponse(result=done.code, block_number=done.block)

    def _guard(self, context: Any, call: Any) -> Any:
        try:
            if self.down:
                raise ProtocolError(grpc.StatusCode.UNAVAILABLE, "connection refused")
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


MAX_MESSAGE_BYTES = 100 * 1024 * 1024


class PeerDouble:
    """Starts the chaincode server (Node) and the Gateway double; stop() ends both."""

    def __init__(self, channel: str, chaincode_name: str, mspid: str,
                 peer_identity: tuple[bytes, ec.EllipticCurvePrivateKey],
                 gateway_port: int, chaincode_port: int, batch_timeout_s: float = 0.0,
                 tls: tuple[bytes, bytes] | None = None) -> None:
        self.channel, self.chaincode_name, self.mspid = channel, chaincode_name, mspid
        self.tls = tls  # (certificate PEM, key PEM): serve TLS as a real peer does
        self.peer_identity = peer_identity
        self.gateway_port, self.chaincode_port = gateway_port, chaincode_port
        self.batch_timeout_s = batch_timeout_s
        self.server: grpc.Server | None = None
        self.node: subprocess.Popen[bytes] | None = None
        self.gateway: GatewayDouble | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.gateway_port}"

    def start_chaincode(self) -> None:
        # Started as Fabric's chaincode-as-a-service docs configure it (environment
        # variables), through the chaincode's own `npm start` file.
        import os

        env = dict(os.environ, CHAINCODE_SERVER_ADDRESS=f"127.0.0.1:{self.chaincode_port}",
                   CHAINCODE_ID=f"{self.chaincode_name}:double")
        self.node = subprocess.Popen(
            ["node", str(ROOT / "chaincode" / "start-server.js")], cwd=ROOT / "chaincode",
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def start(self, ledger: PeerLedger | None = None) -> PeerDouble:
        """Serve; with ``ledger`` (from ``stop_gateway``) the peer keeps its blocks."""
        if self.node is None:
            self.start_chaincode()
        connection = ChaincodeConnection(f"127.0.0.1:{self.chaincode_port}")
        gateway = GatewayDouble(connection, self.channel, self.chaincode_name, self.mspid,
                                self.peer_identity, ledger=ledger,
                                batch_timeout_s=self.batch_timeout_s)
        self.gateway = gateway
        # A real peer accepts and sends messages up to 100 MiB (grpc's default is 4 MiB).
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=16), options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)])
        gateway_pb2_grpc.add_GatewayServicer_to_server(gateway, self.server)
        if self.tls is None:
            self.server.add_insecure_port(self.endpoint)
        else:
            credentials = grpc.ssl_server_credentials([(self.tls[1], self.tls[0])])
            self.server.add_secure_port(self.endpoint, credentials)
        self.server.start()
        return self

    def stop_gateway(self) -> PeerLedger:
        """Stop serving (a peer outage); returns the ledger to restart with."""
        assert self.server is not None and self.gateway is not None
        self.server.stop(grace=None).wait()
        self.gateway.close()
        self.gateway.cc.close()
        ledger, self.server = self.gateway.ledger, None
        return ledger

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(grace=None)
        if self.gateway is not None:
            self.gateway.close()
            self.gateway.cc.close()
        if self.node is not None:
            self.node.terminate()
            self.node.wait(timeout=10)
