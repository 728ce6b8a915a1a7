"""Signed checkpoints: C2SP ``tlog-checkpoint`` bodies in C2SP ``signed-note`` envelopes.

A checkpoint note looks like::

    example.com/audit-ledger
    42
    <base64 of the 32-byte root hash>

    — example.com/audit-ledger <base64 of key hash (4 bytes) || Ed25519 signature>

The signature covers the body (first three lines and any extension lines, each ending
in a newline). Key hashes follow the signed-note spec: the first four bytes of
SHA-256(key name || 0x0A || 0x01 || public key).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from ledger import merkle
from ledger.errors import (
    CheckpointFormatError,
    ForkError,
    RollbackError,
    SignatureError,
)

ED25519_ALG = b"\x01"
SIGNATURE_PREFIX = "\u2014 "  # em dash and a space
MAX_SIGNATURES = 100


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


# A note larger than this is no checkpoint of ours (a body of three short lines and at
# most 100 signature lines fits in a few KiB): refused before any parsing, so junk
# appended to a note costs nothing per record.
MAX_NOTE_BYTES = 64 * 1024


def _unb64(text: str, what: str) -> bytes:
    """Canonical padded standard base64 only, as Go's strict decoder reads it: the bytes
    must encode back to the very same text (no missing padding, no non-zero padding
    bits, no other alphabet), so one value has one spelling."""
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise CheckpointFormatError(f"{what} is not base64") from exc
    if base64.b64encode(raw).decode("ascii") != text:
        raise CheckpointFormatError(f"{what} is not canonical base64 (padding)")
    return raw


def key_hash(name: str, public_key: bytes) -> bytes:
    """The 4-byte signed-note key hash of an Ed25519 key."""
    return hashlib.sha256(name.encode() + b"\n" + ED25519_ALG + public_key).digest()[:4]


def split_vkey(text: str, alg: bytes, what: str, wrong_alg: str) -> tuple[str, str, bytes]:
    """(name, key hash in hex, public key) of a signed-note vkey ``name+hash+base64(alg||key)``;
    ``what`` and ``wrong_alg`` word the errors (ValueError)."""
    parts = text.strip().split("+", 2)
    if len(parts) != 3:
        raise ValueError(f"{what} must be name+hash+key")
    name, hash_hex, key_b64 = parts
    try:
        raw = base64.b64decode(key_b64, validate=True)
    except binascii.Error as exc:
        raise ValueError(f"{what} is not base64") from exc
    if raw[:1] != alg:
        raise ValueError(wrong_alg)
    return name, hash_hex, raw[1:]


def _check_key_name(name: str) -> None:
    if not name or any(c.isspace() or c == "+" for c in name):
        raise ValueError(f"invalid key name {name!r}: no spaces or '+' allowed")


@dataclass(frozen=True)
class Checkpoint:
    """The body of a checkpoint: which log, how many entries, which root."""

    origin: str
    size: int
    root: bytes
    extensions: tuple[str, ...] = ()

    def body(self) -> bytes:
        if not self.origin or "\n" in self.origin:
            raise CheckpointFormatError("origin must be one non-empty line")
        if self.size < 0 or len(self.root) != merkle.HASH_SIZE:
            raise CheckpointFormatError("size must be >= 0 and root 32 bytes")
        lines = [self.origin, str(self.size), _b64(self.root), *self.extensions]
        return ("\n".join(lines) + "\n").encode("utf-8")

    @classmethod
    def peek(cls, note: bytes) -> Checkpoint:
        """The checkpoint inside a signed note, signature NOT checked: for sizing and
        routing only; trust comes from ``NoteVerifier.open_checkpoint``."""
        if len(note) > MAX_NOTE_BYTES:
            raise CheckpointFormatError(f"note of {len(note)} bytes (at most "
                                        f"{MAX_NOTE_BYTES})")
        split = note.rfind(b"\n\n")
        return cls.parse_body(note[: split + 1] if split >= 0 else note)

    @classmethod
    def parse_body(cls, body: bytes) -> Checkpoint:
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CheckpointFormatError("checkpoint is not UTF-8") from exc
        if not text.endswith("\n"):
            raise CheckpointFormatError("checkpoint body must end with a newline")
        lines = text[:-1].split("\n")
        if len(lines) < 3:
            raise CheckpointFormatError("checkpoint needs origin, size and root lines")
        origin, size_text, root_text, *extensions = lines
        if not origin:
            raise CheckpointFormatError("empty origin line")
        if not size_text.isdigit() or (size_text != "0" and size_text.startswith("0")):
            raise CheckpointFormatError(f"tree size {size_text!r} is not a decimal number")
        root = _unb64(root_text, "root hash")
        if len(root) != merkle.HASH_SIZE:
            raise CheckpointFormatError(f"root hash has {len(root)} bytes, expected 32")
        if any(not line for line in extensions):
            raise CheckpointFormatError("empty extension line")
        return cls(origin, int(size_text), root, tuple(extensions))


@dataclass(frozen=True)
class SignedNote:
    """A note's body and its signature lines, as they appeared."""

    body: bytes
    signatures: tuple[tuple[str, bytes, bytes], ...] = field(default=())  # name, hash, sig

    def serialize(self) -> bytes:
        lines = [
            f"{SIGNATURE_PREFIX}{name} {_b64(khash + sig)}\n"
            for name, khash, sig in self.signatures
        ]
        return self.body + b"\n" + "".join(lines).encode("utf-8")

    @classmethod
    def parse(cls, note: bytes) -> SignedNote:
        if len(note) > MAX_NOTE_BYTES:
            raise CheckpointFormatError(f"note of {len(note)} bytes (at most "
                                        f"{MAX_NOTE_BYTES})")
        try:
            text = note.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CheckpointFormatError("note is not UTF-8") from exc
        split_at = text.rfind("\n\n")
        if split_at < 0:
            raise CheckpointFormatError("note has no blank line before its signatures")
        body, sig_block = text[: split_at + 1], text[split_at + 2 :]
        if not sig_block.endswith("\n"):
            raise CheckpointFormatError("signature block must end with a newline")
        signatures = []
        for line in sig_block[:-1].split("\n"):
            if not line.startswith(SIGNATURE_PREFIX):
                raise CheckpointFormatError(f"malformed signature line {line[:40]!r}")
            parts = line[len(SIGNATURE_PREFIX) :].split(" ")
            if len(parts) != 2 or not parts[0]:
                raise CheckpointFormatError(f"malformed signature line {line[:40]!r}")
            blob = _unb64(parts[1], "signature")
            if len(blob) < 5:
                raise CheckpointFormatError("signature too short")
            signatures.append((parts[0], blob[:4], blob[4:]))
        if not signatures or len(signatures) > MAX_SIGNATURES:
            raise CheckpointFormatError("a note needs between 1 and 100 signatures")
        return cls(body.encode("utf-8"), tuple(signatures))


class NoteSigner:
    """Signs notes with one Ed25519 key under one key name."""

    def __init__(self, name: str, private_key: Ed25519PrivateKey) -> None:
        _check_key_name(name)
        self.name = name
        self._key = private_key
        self.public_key = private_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.key_hash = key_hash(name, self.public_key)

    def verifier(self) -> NoteVerifier:
        return NoteVerifier(self.name, self.public_key)

    def sign(self, body: bytes) -> bytes:
        signature = self._key.sign(body)
        return SignedNote(body, ((self.name, self.key_hash, signature),)).serialize()

    def sign_checkpoint(self, checkpoint: Checkpoint) -> bytes:
        return self.sign(checkpoint.body())


class NoteVerifier:
    """Checks a note's signature by one pinned Ed25519 key."""

    def __init__(self, name: str, public_key: bytes) -> None:
        _check_key_name(name)
        if len(public_key) != 32:
            raise ValueError("an Ed25519 public key has 32 bytes")
        self.name = name
        self.public_key = public_key
        self.key_hash = key_hash(name, public_key)
        self._key = Ed25519PublicKey.from_public_bytes(public_key)
        # Notes opened already (bytes -> body, or the error refusing them): a bundle
        # repeats one checkpoint for every record, and a signature check costs more than
        # all else per record; a refused note must not be parsed again either.
        self._verified: dict[bytes, bytes | CheckpointFormatError | SignatureError] = {}

    def encode(self) -> str:
        """The verifier key string ``name+hash+base64(0x01||key)`` of signed-note."""
        return f"{self.name}+{self.key_hash.hex()}+{_b64(ED25519_ALG + self.public_key)}"

    @classmethod
    def decode(cls, text: str) -> NoteVerifier:
        name, hash_hex, key = split_vkey(text, ED25519_ALG, "verifier key",
                                         "only Ed25519 verifier keys are supported")
        verifier = cls(name, key)
        if verifier.key_hash.hex() != hash_hex:
            raise ValueError("verifier key hash does not match its key")
        return verifier

    def open(self, note: bytes) -> bytes:
        """The note's body if it carries a valid signature by this key, else raise."""
        cached = self._verified.get(note)
        if cached is None:
            try:
                cached = self._open_uncached(note)
            except (CheckpointFormatError, SignatureError) as exc:
                cached = exc
            if len(self._verified) < 1024:
                self._verified[note] = cached
        if isinstance(cached, bytes):
            return cached
        raise type(cached)(str(cached))

    def _open_uncached(self, note: bytes) -> bytes:
        parsed = SignedNote.parse(note)
        named = {s[2] for s in parsed.signatures if s[0] == self.name and s[1] == self.key_hash}
        if not named:
            raise SignatureError(
                f"note carries no signature by key {self.name}+{self.key_hash.hex()}"
            )
        # Every line in this key's name must verify (identical repeats count once): a
        # note with a corrupted copy beside the genuine line is refused, whatever the order.
        for signature in named:
            try:
                self._key.verify(signature, parsed.body)
            except InvalidSignature:
                raise SignatureError(f"signature by key {self.name} does not verify"
                                     + (" (one of its repeated lines)" if len(named) > 1
                                        else "")) from None
        return parsed.body

    def open_checkpoint(self, note: bytes, origin: str | None = None) -> Checkpoint:
        """Verify the signature, then parse the checkpoint (and check its origin)."""
        checkpoint = Checkpoint.parse_body(self.open(note))
        if origin is not None and checkpoint.origin != origin:
            raise CheckpointFormatError(
                f"checkpoint is for origin {checkpoint.origin!r}, expected {origin!r}"
            )
        return checkpoint


class CheckpointTracker:
    """Keeps the last trusted checkpoint and accepts only consistent extensions of it.

    The state is one note; persisting it (a verifier's state file, a chaincode's world
    state) is the caller's business.
    """

    def __init__(self, verifier: NoteVerifier, origin: str, trusted_note: bytes | None = None):
        self.verifier = verifier
        self.origin = origin
        self.trusted_note = trusted_note
        self.trusted = (
            verifier.open_checkpoint(trusted_note, origin) if trusted_note is not None else None
        )

    def advance(self, note: bytes, consistency: Sequence[bytes]) -> Checkpoint:
        """Trust ``note`` if it is signed and extends the trusted checkpoint; raise if not."""
        offered = self.verifier.open_checkpoint(note, self.origin)
        check_extends(self.trusted, offered, consistency)
        if self.trusted is None or offered.size > self.trusted.size:
            self.trusted, self.trusted_note = offered, note
        return offered


def check_extends(
    trusted: Checkpoint | None, offered: Checkpoint, consistency: Sequence[bytes]
) -> None:
    """Raise unless ``offered`` is an append-only extension of ``trusted``."""
    if trusted is None:
        return
    if offered.size < trusted.size:
        raise RollbackError(trusted.size, offered.size)
    if offered.size == trusted.size:
        if offered.root != trusted.root:
            raise ForkError(offered.size, trusted.root, offered.root)
        return
    merkle.verify_consistency(trusted.size, offered.size, consistency, trusted.root, offered.root)
