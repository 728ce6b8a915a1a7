"""May a witness cosign this checkpoint? The decision of C2SP ``tlog-witness`` add-checkpoint.

Pure: it takes the request body, the log keys the witness trusts per origin and what the
witness stored last for that origin, and either returns the verified checkpoint or raises
``WitnessRefusal`` carrying the HTTP status the spec prescribes. Persisting the new state
atomically (compare-and-swap) is the caller's business (``ledger.witness.state``).

The checks run in the spec's order, so each refusal names its true cause:

1. the body is malformed                                   -> 400
2. the checkpoint's origin is not configured               -> 404
3. no signature verifies against a trusted key for it      -> 403
4. ``old`` is larger than the checkpoint's size            -> 400
5. ``old`` differs from the stored size (0 if none)        -> 409, body: stored size
6. the consistency proof from ``old`` does not verify      -> 422
7. same size as stored but another root (a fork)           -> 409

A rollback (a checkpoint smaller than the stored one) fails 4 when the client names the
stored size as ``old``, else 5. A fork at a larger size fails 6: no proof can link two
different trees.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ledger import merkle
from ledger.checkpoint import Checkpoint, NoteVerifier
from ledger.errors import CheckpointFormatError, SignatureError, VerificationError

MAX_PROOF_LINES = 63  # the spec's bound on consistency proof lines
MAX_BODY_BYTES = 64 * 1024  # a checkpoint, 63 hashes and a few signatures fit easily
SIZE_CONTENT_TYPE = "text/x.tlog.size"  # the spec's Content-Type of a 409 body


class WitnessRefusal(Exception):
    """The witness will not cosign; ``status`` is the HTTP status the spec asks for."""

    def __init__(self, status: int, reason: str, stored_size: int | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.stored_size = stored_size  # set on a 409 for an ``old`` size mismatch

    def body(self) -> tuple[bytes, str]:
        """The response body and its content type."""
        if self.stored_size is not None:
            return f"{self.stored_size}\n".encode(), SIZE_CONTENT_TYPE
        return f"{self.reason}\n".encode(), "text/plain"


@dataclass(frozen=True)
class AddCheckpoint:
    """A parsed add-checkpoint request body."""

    old_size: int
    proof: tuple[bytes, ...]
    note: bytes

    def encode(self) -> bytes:
        """The request body, as a client sends it."""
        lines = [f"old {self.old_size}\n"]
        lines += [base64.b64encode(h).decode() + "\n" for h in self.proof]
        return "".join(lines).encode() + b"\n" + self.note


@dataclass(frozen=True)
class WitnessedState:
    """The latest checkpoint a witness cosigned for one origin."""

    size: int
    root: bytes


def _decimal(text: str) -> int | None:
    if not text.isascii() or not text.isdigit() or (text != "0" and text.startswith("0")):
        return None
    return int(text)


def parse_request(body: bytes) -> AddCheckpoint:
    """Parse ``old <size>``, proof lines, a blank line, then the checkpoint note."""
    if len(body) > MAX_BODY_BYTES:
        raise WitnessRefusal(400, f"body larger than {MAX_BODY_BYTES} bytes")
    header, sep, note = body.partition(b"\n\n")
    if not sep:
        raise WitnessRefusal(400, "no empty line before the checkpoint")
    try:
        lines = header.decode("ascii").split("\n")
    except UnicodeDecodeError:
        raise WitnessRefusal(400, "old size and proof lines must be ASCII") from None
    first = lines[0]
    old = _decimal(first[4:]) if first.startswith("old ") else None
    if old is None:
        raise WitnessRefusal(400, "first line must be 'old <size>' in decimal")
    if len(lines) - 1 > MAX_PROOF_LINES:
        raise WitnessRefusal(400, f"more than {MAX_PROOF_LINES} consistency proof lines")
    proof = []
    for line in lines[1:]:
        try:
            node = base64.b64decode(line, validate=True)
        except binascii.Error:
            raise WitnessRefusal(400, "a consistency proof line is not base64") from None
        if base64.b64encode(node).decode("ascii") != line:  # one spelling per hash
            raise WitnessRefusal(400, "a consistency proof line is not canonical base64")
        if len(node) != merkle.HASH_SIZE:
            raise WitnessRefusal(400, "a consistency proof line is not a 32-byte hash")
        proof.append(node)
    return AddCheckpoint(old, tuple(proof), note)


def decide(
    request: AddCheckpoint,
    trusted: Mapping[str, Sequence[NoteVerifier]],
    stored: WitnessedState | None,
) -> Checkpoint:
    """The checkpoint to cosign, or raise ``WitnessRefusal`` with the spec's status.

    ``trusted`` maps each configured origin to the log keys the witness accepts for it;
    ``stored`` is what it cosigned last for the request's origin (None: never).
    """
    try:
        claimed = Checkpoint.peek(request.note)
    except CheckpointFormatError as exc:
        raise WitnessRefusal(400, f"malformed checkpoint: {exc}") from None
    keys = trusted.get(claimed.origin)
    if not keys:
        raise WitnessRefusal(404, f"unknown log origin {claimed.origin!r}")
    checkpoint = _open(request.note, claimed.origin, keys)
    if request.old_size > checkpoint.size:
        raise WitnessRefusal(400, f"old size {request.old_size} is larger than the "
                                  f"checkpoint size {checkpoint.size}")
    stored_size = stored.size if stored is not None else 0
    if request.old_size != stored_size:
        raise WitnessRefusal(409, f"old size {request.old_size} is not the witnessed size "
                                  f"{stored_size}", stored_size=stored_size)
    if stored is None:
        if request.proof:
            raise WitnessRefusal(422, "the consistency proof from size 0 must be empty")
        return checkpoint
    if checkpoint.size == stored.size:
        if request.proof:
            raise WitnessRefusal(422, "the consistency proof between equal sizes must be "
                                      "empty")
        if checkpoint.root != stored.root:
            raise WitnessRefusal(409, f"fork: another root at the witnessed size {stored.size}")
        return checkpoint
    try:
        merkle.verify_consistency(stored.size, checkpoint.size, request.proof, stored.root,
                                  checkpoint.root)
    except VerificationError as exc:
        raise WitnessRefusal(422, f"consistency proof from {stored.size} to "
                                  f"{checkpoint.size} does not verify: {exc}") from None
    return checkpoint


def _open(note: bytes, origin: str, keys: Sequence[NoteVerifier]) -> Checkpoint:
    """The checkpoint if any trusted key signed it; signatures of other keys are ignored."""
    malformed: CheckpointFormatError | None = None
    for key in keys:
        try:
            return key.open_checkpoint(note, origin)
        except SignatureError:
            continue
        except CheckpointFormatError as exc:
            malformed = exc
    if malformed is not None:
        raise WitnessRefusal(400, f"malformed checkpoint note: {malformed}")
    raise WitnessRefusal(403, "no signature by a key trusted for this origin verifies")
