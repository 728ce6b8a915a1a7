"""cosignature/v1 lines: key IDs, the signed message, and which pinned witnesses signed."""

from __future__ import annotations

import base64
import hashlib

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger.checkpoint import Checkpoint, NoteSigner
from ledger.cosignature import Cosigner, WitnessKey, add_cosignatures, valid_cosigners

ORIGIN = "audit-ledger.test/cosign"


def _note() -> tuple[bytes, bytes]:
    signer = NoteSigner(ORIGIN, Ed25519PrivateKey.generate())
    checkpoint = Checkpoint(ORIGIN, 7, hashlib.sha256(b"root").digest())
    return signer.sign_checkpoint(checkpoint), checkpoint.body()


def test_key_id_and_message_follow_the_spec() -> None:
    private = Ed25519PrivateKey.generate()
    cosigner = Cosigner("witness.test/w1", private)
    public = cosigner.witness_key.public_key
    assert cosigner.witness_key.key_id == hashlib.sha256(
        b"witness.test/w1\n\x04" + public).digest()[:4]
    body = b"o\n1\n" + base64.b64encode(b"\0" * 32) + b"\n"
    line = cosigner.cosign(body, 1679315147)
    name, blob_b64 = line.rstrip("\n").removeprefix("\u2014 ").split(" ")
    blob = base64.b64decode(blob_b64)
    assert name == "witness.test/w1" and len(blob) == 4 + 8 + 64
    assert int.from_bytes(blob[4:12], "big") == 1679315147
    message = b"cosignature/v1\ntime 1679315147\n" + body
    private.public_key().verify(blob[12:], message)  # raises if the message differs


def test_valid_cosigners_counts_only_pinned_valid_lines() -> None:
    note, body = _note()
    w1, w2, other = (Cosigner(f"witness.test/w{i}", Ed25519PrivateKey.generate())
                     for i in (1, 2, 3))
    cosigned = add_cosignatures(note, [w1.cosign(body, 100), other.cosign(body, 101)])
    pinned = [w1.witness_key, w2.witness_key]
    assert valid_cosigners(cosigned, pinned) == {"witness.test/w1": 100}
    # A line by w2's name over another body is not a cosignature of this note.
    forged = add_cosignatures(cosigned, [w2.cosign(body.replace(b"7", b"8", 1), 5)])
    assert valid_cosigners(forged, pinned) == {"witness.test/w1": 100}


def test_witness_key_round_trip_and_rejects_note_keys() -> None:
    key = Cosigner("witness.test/w1", Ed25519PrivateKey.generate()).witness_key
    assert WitnessKey.decode(key.encode()) == key
    log_key = NoteSigner(ORIGIN, Ed25519PrivateKey.generate()).verifier().encode()
    with pytest.raises(ValueError, match="0x04"):
        WitnessKey.decode(log_key)
