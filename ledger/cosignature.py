"""Witness cosignatures: C2SP ``tlog-cosignature`` (``cosignature/v1``, Ed25519).

A cosignature is one more signature line on a checkpoint note::

    — <witness name> base64(key ID (4) || timestamp (8, big-endian) || Ed25519 sig (64))

The key ID is ``SHA-256(name || 0x0A || 0x04 || public key)[:4]`` and the signed message
is ``cosignature/v1\\ntime <timestamp>\\n`` followed by the whole checkpoint body. A
cosignature says: as of that time, this is the largest consistent checkpoint the witness
has seen for this origin. Pure: no I/O.
"""

from __future__ import annotations

import base64
import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from ledger.checkpoint import SIGNATURE_PREFIX, SignedNote, split_vkey
from ledger.errors import CheckpointFormatError

COSIGNATURE_ALG = b"\x04"
HEADER = b"cosignature/v1\n"
MAX_TIMESTAMP = 2**63 - 1


def cosigner_key_id(name: str, public_key: bytes) -> bytes:
    """The 4-byte key ID of an Ed25519 cosigner (signature type 0x04)."""
    return hashlib.sha256(name.encode() + b"\n" + COSIGNATURE_ALG + public_key).digest()[:4]


def signed_message(body: bytes, timestamp: int) -> bytes:
    """What a cosigner signs: header line, time line, then the checkpoint body."""
    if not 0 <= timestamp <= MAX_TIMESTAMP:
        raise CheckpointFormatError(f"cosignature timestamp {timestamp} out of range")
    return HEADER + b"time " + str(timestamp).encode() + b"\n" + body


def _check_name(name: str) -> None:
    if not name or any(c.isspace() or c == "+" for c in name):
        raise ValueError(f"invalid witness name {name!r}: no spaces or '+' allowed")


class Cosigner:
    """A witness's signing half: turns a checkpoint body into one signature line."""

    def __init__(self, name: str, private_key: Ed25519PrivateKey) -> None:
        _check_name(name)
        self.name = name
        self._key = private_key
        public = private_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.witness_key = WitnessKey(name, public)

    def cosign(self, body: bytes, timestamp: int) -> str:
        """The signature line (with its newline) cosigning ``body`` at ``timestamp``."""
        signature = self._key.sign(signed_message(body, timestamp))
        blob = self.witness_key.key_id + struct.pack(">Q", timestamp) + signature
        return f"{SIGNATURE_PREFIX}{self.name} {base64.b64encode(blob).decode()}\n"


@dataclass(frozen=True)
class WitnessKey:
    """A witness's verifying half, as a verifier pins it."""

    name: str
    public_key: bytes

    def __post_init__(self) -> None:
        _check_name(self.name)
        if len(self.public_key) != 32:
            raise ValueError("an Ed25519 public key has 32 bytes")

    @property
    def key_id(self) -> bytes:
        return cosigner_key_id(self.name, self.public_key)

    def encode(self) -> str:
        """The vkey ``name+<key ID hex>+base64(0x04 || public key)``."""
        blob = base64.b64encode(COSIGNATURE_ALG + self.public_key).decode()
        return f"{self.name}+{self.key_id.hex()}+{blob}"

    @classmethod
    def decode(cls, text: str) -> WitnessKey:
        name, hash_hex, public = split_vkey(
            text, COSIGNATURE_ALG, "witness key",
            "a witness key has signature type 0x04 (cosignature/v1)")
        key = cls(name, public)
        if key.key_id.hex() != hash_hex:
            raise ValueError("witness key hash does not match its key")
        return key

    def timestamp_of(self, body: bytes, blob: bytes) -> int | None:
        """The timestamp of a valid cosignature ``blob`` (key ID stripped) over ``body``,
        or None when it is not one."""
        if len(blob) != 8 + 64:
            return None
        (timestamp,) = struct.unpack(">Q", blob[:8])
        if timestamp > MAX_TIMESTAMP:
            return None
        try:
            Ed25519PublicKey.from_public_bytes(self.public_key).verify(
                blob[8:], signed_message(body, timestamp))
        except InvalidSignature:
            return None
        return int(timestamp)


def valid_cosigners(note: bytes, witnesses: Sequence[WitnessKey]) -> dict[str, int]:
    """Witness name -> cosignature time, for each pinned witness whose valid cosignature
    the note carries. Lines of unknown keys are ignored, as the spec asks."""
    parsed = SignedNote.parse(note)
    found: dict[str, int] = {}
    for witness in witnesses:
        for name, key_id, blob in parsed.signatures:
            if name != witness.name or key_id != witness.key_id:
                continue
            timestamp = witness.timestamp_of(parsed.body, blob)
            if timestamp is not None:
                found[witness.name] = timestamp
                break
    return found


def well_formed_line(line: str) -> bool:
    """Whether ``line`` (newline optional) is one signature line a note may carry: the
    prefix, a name, one canonical base64 blob. A stored line that is not must be left
    out of served notes, or it would spoil the log's own signature check (check 3)."""
    text = line[:-1] if line.endswith("\n") else line
    if "\n" in text:
        return False
    try:
        SignedNote.parse(b"-\n\n" + text.encode("utf-8") + b"\n")
    except (CheckpointFormatError, UnicodeEncodeError):
        return False
    return True


def add_cosignatures(note: bytes, lines: Sequence[str]) -> bytes:
    """The note with extra signature lines appended (duplicates dropped)."""
    if not note.endswith(b"\n"):
        raise CheckpointFormatError("a signed note ends with a newline")
    present = set(note.decode("utf-8").split("\n"))
    extra = [line for line in lines if line.rstrip("\n") not in present]
    return note + "".join(line if line.endswith("\n") else line + "\n"
                          for line in extra).encode("utf-8")
