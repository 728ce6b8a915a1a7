"""Evidence sources behind one narrow interface, and the gathering of evidence.

A source only fetches; every decision is made by ``ledger.verify``.
"""

from __future__ import annotations

import base64
import contextlib
import urllib.error
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any, Protocol

from ledger.canonical import parse_strict, strict_int
from ledger.checkpoint import Checkpoint
from ledger.client import safe_http
from ledger.errors import (
    BackendError,
    BackendUnavailableError,
    InvalidInputError,
    LedgerError,
)
from ledger.verify import Evidence, LeafEvidence


@dataclass(frozen=True)
class StoredLeaf:
    """A v2 leaf as a source holds it: index, envelope and body (no proof yet)."""

    leaf_index: int
    envelope: bytes
    body: bytes


@dataclass(frozen=True)
class RecordEvidence:
    record_id: str
    canonical: bytes
    leaf_index: int
    log_leaf_hash: bytes | None
    anchor_ref: str | None
    body: bytes | None = None  # a v2 leaf's body (``canonical`` is its envelope)
    environment: StoredLeaf | None = None  # the environment leaf a v2 record names
    # The stream start leaf a streamed v2 record names (None: none named, or the source
    # has no leaf of that id; check 1 then fails naming it).
    stream_start: StoredLeaf | None = None


class RecordNotFoundError(BackendError):
    """The source has no such record (or will not say it has)."""


class ProofUnavailableError(BackendError):
    """The source answered but cannot produce the proof (e.g. its tree lacks a node)."""


class EvidenceSource(Protocol):
    def record(self, record_id: str) -> RecordEvidence: ...
    def inclusion(self, record: RecordEvidence) -> tuple[list[bytes] | None, bytes]: ...
    def leaf_inclusion(self, record: RecordEvidence, leaf_index: int, size: int
                       ) -> list[bytes]: ...
    def consistency(self, size1: int, size2: int) -> list[bytes]: ...
    def anchored(self) -> tuple[bytes, str] | None: ...


def gather(source: EvidenceSource, record_id: str,
           seen_note: bytes | None | Callable[[bytes], bytes | None],
           anchor_reader: Callable[[], tuple[bytes, str] | None] | None = None) -> Evidence:
    """Fetch one record's evidence: bytes, inclusion proof, checkpoint, anchor and the
    consistency proofs that link the checkpoint to the anchor and to ``seen_note`` (the
    verifier's last-seen checkpoint, or a function of the source's checkpoint note that
    returns it, for a verifier that keeps one state per log).

    Only proofs that can exist are asked for: none from a seen checkpoint at least as
    large as the source's (a rollback or a fork shows without one, and a source
    pretending to be smaller could not produce one). A proof the source refuses to give
    is left out (None) for ``ledger.verify`` to fail check 4 on; only an unreachable
    source is an error here.

    ``anchor_reader`` reads the anchored checkpoint from the anchor itself (the Fabric
    channel) instead of trusting the source's word for it.
    """
    record = source.record(record_id)
    proof, note = source.inclusion(record)
    environment = _with_proof(source, record, record.environment, _size(note))
    stream_start = _with_proof(source, record, record.stream_start, _size(note))
    anchored = anchor_reader() if anchor_reader is not None else source.anchored()
    anchor_consistency: list[bytes] | None = []
    seen_consistency: list[bytes] | None = []
    if callable(seen_note):
        seen_note = seen_note(note)
    size = _size(note)
    if size is not None:  # an unreadable checkpoint fails check 3 in ledger.verify
        anchored_size = _size(anchored[0]) if anchored is not None else None
        if anchored_size is not None:
            low, high = sorted((anchored_size, size))
            anchor_consistency = _proof(source, low, high)
        seen_size = _size(seen_note) if seen_note is not None else None
        if seen_size is not None and seen_size < size:
            seen_consistency = _proof(source, seen_size, size)
    return Evidence(
        record_id=record_id, canonical=record.canonical, leaf_index=record.leaf_index,
        inclusion_proof=proof, checkpoint_note=note,
        anchored_note=anchored[0] if anchored else None,
        anchor_ref=anchored[1] if anchored else record.anchor_ref,
        anchor_consistency=anchor_consistency, seen_consistency=seen_consistency,
        log_leaf_hash=record.log_leaf_hash,
        anchor_from_fabric=anchor_reader is not None and anchored is not None,
        body=record.body, environment=environment, stream_start=stream_start,
        log_size=source.log_size() if hasattr(source, "log_size") else None,
    )


def _with_proof(source: EvidenceSource, record: RecordEvidence, leaf: StoredLeaf | None,
                size: int | None) -> LeafEvidence | None:
    """A leaf the record names, with its inclusion proof at the checkpoint's size (empty
    when the source cannot give one: check 2 then fails on that leaf and says so)."""
    if leaf is None:
        return None
    proof: list[bytes] = []
    if size is not None:
        try:
            proof = source.leaf_inclusion(record, leaf.leaf_index, size)
        except BackendUnavailableError:
            raise
        except (BackendError, InvalidInputError, LookupError):
            pass
    return LeafEvidence(leaf.leaf_index, leaf.envelope, leaf.body, proof)


def named_start_id(body: bytes | None) -> str | None:
    """The stream start record id a v2 record's body names, read to fetch that leaf
    (nothing here is trusted: check 1 opens both leaves). None for any other body."""
    if body is None:
        return None
    try:
        content = parse_strict(body)
    except ValueError:
        return None
    stream = content.get("stream") if isinstance(content, dict) else None
    named = stream.get("start_record_id") if isinstance(stream, dict) else None
    return named if isinstance(named, str) and named else None


def _size(note: bytes) -> int | None:
    """The size a note claims (unverified: only to ask for the right proofs)."""
    try:
        return Checkpoint.peek(note).size
    except LedgerError:
        return None


def _proof(source: EvidenceSource, low: int, high: int) -> list[bytes] | None:
    if low >= high:
        return []
    try:
        return source.consistency(low, high)
    except BackendUnavailableError:
        raise
    except (BackendError, InvalidInputError):
        return None  # the source answered but could not prove it: check 4 will say so


class MalformedAnswerError(BackendError):
    """The source answered, but not with evidence (not JSON, a field missing or of the
    wrong type): nothing can be checked (exit 3, like a source that cannot be reached)."""


@contextlib.contextmanager
def _fields(path: str) -> Iterator[None]:
    try:
        yield
    except (KeyError, TypeError, ValueError) as exc:  # binascii.Error is a ValueError
        raise MalformedAnswerError(f"{path}: the server's answer lacks a valid field "
                                   f"({type(exc).__name__}: {exc})") from exc


class ServerSource:
    """The service's auditor routes over HTTP (standard library only)."""

    def __init__(self, base_url: str, api_key: str, timeout_s: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout_s = timeout_s
        self._proofs: dict[str, dict[str, Any]] = {}
        self._starts: dict[str, str] = {}  # record id -> the stream start id it names

    def get(self, path: str, **query: Any) -> dict[str, Any]:
        url = self.base_url + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        headers = {"Authorization": f"Bearer {self.api_key}", "Accept": "application/json"}
        try:
            answer = parse_strict(safe_http.get(url, headers, self.timeout_s))
            if not isinstance(answer, dict):
                raise ValueError("not a JSON object")
            return answer
        except ValueError as exc:  # JSON (and UTF-8) errors: the source gave no evidence
            raise MalformedAnswerError(f"{path}: the server's answer is not evidence "
                                       f"({exc})") from exc
        except urllib.error.HTTPError as exc:
            detail = exc.read(300).decode(errors="replace")
            if exc.code == 404:
                raise RecordNotFoundError(f"{path}: not found ({detail})") from exc
            if exc.code in (401, 403):
                raise InvalidInputError("api_key", f"the server refused it: {detail}") from exc
            raise BackendError(f"{path}: HTTP {exc.code}: {detail}") from exc
        except (urllib.error.URLError, OSError, TimeoutError) as exc:
            raise BackendUnavailableError(f"cannot reach {self.base_url}: {exc}") from exc

    def record(self, record_id: str) -> RecordEvidence:
        quoted = urllib.parse.quote(record_id, safe="")
        body = self.get(f"/v1/records/{quoted}")
        proof = self.get(f"/v1/records/{quoted}/proof")
        self._proofs[record_id] = proof
        with _fields(f"/v1/records/{quoted}"):
            anchor_ref = body.get("anchor_ref")
            environment = body.get("environment")
            leaf_body = (base64.b64decode(body["body_base64"], validate=True)
                         if "body_base64" in body else None)
            evidence = RecordEvidence(
                record_id, base64.b64decode(body["canonical_base64"], validate=True),
                strict_int(body["leaf_index"], "leaf_index"),
                bytes.fromhex(proof["leaf_hash"]),
                None if anchor_ref is None else str(anchor_ref), leaf_body,
                None if environment is None else StoredLeaf(
                    strict_int(environment["leaf_index"], "environment.leaf_index"),
                    base64.b64decode(environment["envelope_base64"], validate=True),
                    base64.b64decode(environment["body_base64"], validate=True)))
        start_id = named_start_id(leaf_body)
        if start_id is None:
            return evidence
        self._starts[record_id] = start_id
        return replace(evidence, stream_start=self._stream_start(start_id))

    def _stream_start(self, start_id: str) -> StoredLeaf | None:
        """The leaf of that id as this key may read it; None when the server has none
        (it answers another tenant's record as none)."""
        path = f"/v1/records/{urllib.parse.quote(start_id, safe='')}"
        try:
            start = self.get(path)
        except RecordNotFoundError:
            return None
        with _fields(path):
            if "body_base64" not in start:  # a v1 leaf: no v2 record names one
                return None
            return StoredLeaf(strict_int(start["leaf_index"], "leaf_index"),
                              base64.b64decode(start["canonical_base64"], validate=True),
                              base64.b64decode(start["body_base64"], validate=True))

    def leaf_inclusion(self, record: RecordEvidence, leaf_index: int, size: int
                       ) -> list[bytes]:
        if record.stream_start is not None and leaf_index == record.stream_start.leaf_index:
            quoted = urllib.parse.quote(self._starts[record.record_id], safe="")
            path = f"/v1/records/{quoted}/proof"
            answer = self.get(path, tree_size=size)
            with _fields(path):
                if strict_int(answer["leaf_index"], "leaf_index") != leaf_index:
                    raise MalformedAnswerError(f"{path}: the proof is for leaf "
                                               f"{answer['leaf_index']}")
                return [bytes.fromhex(h) for h in answer["inclusion_proof"]]
        # The record's proof answer carries its environment's proof at the same size.
        path = f"/v1/records/{urllib.parse.quote(record.record_id, safe='')}/proof"
        proof = self._proofs.get(record.record_id) or self.get(path)
        with _fields(path):
            environment = proof["environment"]
            if (strict_int(environment["leaf_index"], "environment.leaf_index") != leaf_index
                    or strict_int(proof["tree_size"], "tree_size") != size):
                raise MalformedAnswerError(f"{path}: the environment proof is for leaf "
                                           f"{environment['leaf_index']} at size "
                                           f"{proof['tree_size']}")
            return [bytes.fromhex(h) for h in environment["inclusion_proof"]]

    def inclusion(self, record: RecordEvidence) -> tuple[list[bytes], bytes]:
        # The server answers a record's proof by record id; record() fetched it.
        path = f"/v1/records/{urllib.parse.quote(record.record_id, safe='')}/proof"
        proof = self._proofs.get(record.record_id) or self.get(path)
        with _fields(path):
            return ([bytes.fromhex(h) for h in proof["inclusion_proof"]],
                    str(proof["checkpoint"]).encode())

    def consistency(self, size1: int, size2: int) -> list[bytes]:
        body = self.get("/v1/checkpoints/consistency", **{"from": size1, "to": size2})
        with _fields("/v1/checkpoints/consistency"):
            return [bytes.fromhex(h) for h in body["proof"]]

    def anchored(self) -> tuple[bytes, str] | None:
        try:
            body = self.get("/v1/checkpoints/anchored")
        except RecordNotFoundError:
            return None
        with _fields("/v1/checkpoints/anchored"):
            return str(body["checkpoint"]).encode(), str(body["ref"])
