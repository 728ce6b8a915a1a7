"""C2SP signed-note checkpoints and the tracker that refuses rollbacks and forks."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger import merkle
from ledger.checkpoint import (
    Checkpoint,
    CheckpointTracker,
    NoteSigner,
    NoteVerifier,
    SignedNote,
)
from ledger.errors import (
    CheckpointFormatError,
    ForkError,
    RollbackError,
    RootMismatchError,
    SignatureError,
)

ORIGIN = "audit-ledger.example/log"


@pytest.fixture()
def signer() -> NoteSigner:
    return NoteSigner(ORIGIN, Ed25519PrivateKey.generate())


def tree(n: int) -> merkle.MemoryTree:
    return merkle.MemoryTree(merkle.hash_leaf(bytes([i % 256, i // 256])) for i in range(n))


def test_note_layout_and_round_trip(signer: NoteSigner) -> None:
    cp = Checkpoint(ORIGIN, 3, bytes(range(32)))
    note = signer.sign_checkpoint(cp)
    text = note.decode()
    lines = text.split("\n")
    assert lines[:4] == [ORIGIN, "3", "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=", ""]
    assert lines[4].startswith(f"\u2014 {ORIGIN} ")
    assert text.endswith("\n")
    assert SignedNote.parse(note).serialize() == note
    assert signer.verifier().open_checkpoint(note) == cp


def test_verifier_key_string_round_trips(signer: NoteSigner) -> None:
    encoded = signer.verifier().encode()
    assert encoded.startswith(f"{ORIGIN}+{signer.key_hash.hex()}+")
    assert NoteVerifier.decode(encoded).public_key == signer.public_key


def test_checkpoint_signed_by_another_key_rejected(signer: NoteSigner) -> None:
    impostor = NoteSigner(ORIGIN, Ed25519PrivateKey.generate())
    note = impostor.sign_checkpoint(Checkpoint(ORIGIN, 1, bytes(32)))
    with pytest.raises(SignatureError, match="no signature by key"):
        signer.verifier().open(note)


def test_edited_checkpoint_body_rejected(signer: NoteSigner) -> None:
    note = signer.sign_checkpoint(Checkpoint(ORIGIN, 10, bytes(32)))
    forged = note.replace(b"\n10\n", b"\n11\n")
    with pytest.raises(SignatureError, match="does not verify"):
        signer.verifier().open(forged)


@pytest.mark.parametrize("body", [
    b"origin\n12\n", b"origin\n012\nAAAA\n", b"origin\n-1\n" + b"A" * 44 + b"\n",
    b"origin\n1\nnot base64!\n", b"origin\n1\nAAAA\n",
])
def test_malformed_bodies_rejected(body: bytes) -> None:
    with pytest.raises(CheckpointFormatError):
        Checkpoint.parse_body(body)


def test_note_without_signatures_rejected() -> None:
    with pytest.raises(CheckpointFormatError):
        SignedNote.parse(b"origin\n1\nAAAA\n")


def test_tracker_accepts_consistent_extensions(signer: NoteSigner) -> None:
    big = tree(50)
    tracker = CheckpointTracker(signer.verifier(), ORIGIN)
    previous = 0
    for size in (1, 7, 8, 33, 50, 50):
        note = signer.sign_checkpoint(Checkpoint(ORIGIN, size, big.root(size)))
        tracker.advance(note, big.consistency_proof(previous, size) if previous else [])
        previous = size
    assert tracker.trusted is not None and tracker.trusted.size == 50


def test_rollback_to_smaller_tree_rejected(signer: NoteSigner) -> None:
    big = tree(20)
    trusted = signer.sign_checkpoint(Checkpoint(ORIGIN, 20, big.root()))
    tracker = CheckpointTracker(signer.verifier(), ORIGIN, trusted)
    with pytest.raises(RollbackError) as info:
        tracker.advance(signer.sign_checkpoint(Checkpoint(ORIGIN, 12, big.root(12))), [])
    assert (info.value.trusted_size, info.value.offered_size) == (20, 12)


def test_split_view_same_size_other_root_rejected(signer: NoteSigner) -> None:
    honest, other = tree(9), merkle.MemoryTree(merkle.hash_leaf(b"x%d" % i) for i in range(9))
    tracker = CheckpointTracker(signer.verifier(), ORIGIN,
                                signer.sign_checkpoint(Checkpoint(ORIGIN, 9, honest.root())))
    with pytest.raises(ForkError) as info:
        tracker.advance(signer.sign_checkpoint(Checkpoint(ORIGIN, 9, other.root())), [])
    assert info.value.size == 9


def test_extension_without_valid_consistency_proof_rejected(signer: NoteSigner) -> None:
    honest = tree(30)
    rewritten = merkle.MemoryTree(
        [honest.nodes[(0, i)] for i in range(10)] + [merkle.hash_leaf(b"evil")] * 20
    )
    tracker = CheckpointTracker(signer.verifier(), ORIGIN,
                                signer.sign_checkpoint(Checkpoint(ORIGIN, 12, honest.root(12))))
    offered = signer.sign_checkpoint(Checkpoint(ORIGIN, 30, rewritten.root()))
    with pytest.raises(RootMismatchError):
        tracker.advance(offered, rewritten.consistency_proof(12))
    assert tracker.trusted is not None and tracker.trusted.size == 12


def test_checkpoint_for_another_origin_rejected(signer: NoteSigner) -> None:
    note = signer.sign_checkpoint(Checkpoint("other.example/log", 1, bytes(32)))
    with pytest.raises(CheckpointFormatError, match="expected"):
        signer.verifier().open_checkpoint(note, ORIGIN)
