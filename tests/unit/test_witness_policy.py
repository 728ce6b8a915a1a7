"""The witness's decision (C2SP tlog-witness add-checkpoint), without HTTP or storage,
and the cosignature line checked byte for byte against the C2SP tlog-cosignature layout."""

from __future__ import annotations

import base64
import hashlib
import struct

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from ledger import merkle
from ledger.checkpoint import Checkpoint, NoteSigner, NoteVerifier
from ledger.cosignature import Cosigner, add_cosignatures, valid_cosigners
from ledger.witness_policy import (
    SIZE_CONTENT_TYPE,
    AddCheckpoint,
    WitnessedState,
    WitnessRefusal,
    decide,
    parse_request,
)

ORIGIN = "audit-ledger.test/witnessed"


@pytest.fixture(scope="module")
def log() -> tuple[NoteSigner, merkle.MemoryTree]:
    tree = merkle.MemoryTree(merkle.hash_leaf(b"leaf %d" % i) for i in range(20))
    return NoteSigner(ORIGIN, Ed25519PrivateKey.generate()), tree


def _note(signer: NoteSigner, tree: merkle.MemoryTree, size: int) -> bytes:
    return signer.sign_checkpoint(Checkpoint(ORIGIN, size, tree.root(size)))


def _trusted(signer: NoteSigner) -> dict[str, list[NoteVerifier]]:
    return {ORIGIN: [signer.verifier()]}


def _refusal(request: AddCheckpoint, trusted: dict[str, list[NoteVerifier]],
             stored: WitnessedState | None) -> WitnessRefusal:
    with pytest.raises(WitnessRefusal) as caught:
        decide(request, trusted, stored)
    return caught.value


def test_first_checkpoint_and_consistent_extension_are_cosigned(log) -> None:  # type: ignore[no-untyped-def]
    signer, tree = log
    first = decide(AddCheckpoint(0, (), _note(signer, tree, 8)), _trusted(signer), None)
    assert (first.size, first.root) == (8, tree.root(8))
    stored = WitnessedState(8, tree.root(8))
    proof = tuple(tree.consistency_proof(8, 13))
    second = decide(AddCheckpoint(8, proof, _note(signer, tree, 13)), _trusted(signer), stored)
    assert second.size == 13
    # The same checkpoint again (old == size, same root) is cosigned again.
    again = decide(AddCheckpoint(8, (), _note(signer, tree, 8)), _trusted(signer), stored)
    assert again.size == 8


def test_each_refusal_has_the_specs_status(log) -> None:  # type: ignore[no-untyped-def]
    signer, tree = log
    trusted = _trusted(signer)
    stored = WitnessedState(8, tree.root(8))
    note13 = _note(signer, tree, 13)
    proof = tuple(tree.consistency_proof(8, 13))

    other = NoteSigner("audit-ledger.test/other", Ed25519PrivateKey.generate())
    unknown = other.sign_checkpoint(Checkpoint("audit-ledger.test/other", 3, tree.root(3)))
    assert _refusal(AddCheckpoint(0, (), unknown), trusted, None).status == 404

    impostor = NoteSigner(ORIGIN, Ed25519PrivateKey.generate())
    assert _refusal(AddCheckpoint(8, proof, _note(impostor, tree, 13)), trusted,
                    stored).status == 403

    # Rollback: a smaller checkpoint, "old" naming the stored size -> 400 (old > size) ...
    assert _refusal(AddCheckpoint(8, (), _note(signer, tree, 5)), trusted, stored).status == 400
    # ... or naming its own size -> 409 with the stored size.
    refusal = _refusal(AddCheckpoint(5, (), _note(signer, tree, 5)), trusted, stored)
    assert (refusal.status, refusal.stored_size) == (409, 8)
    assert refusal.body() == (b"8\n", SIZE_CONTENT_TYPE)

    # Wrong old size (not what it cosigned) -> 409 with its size; never cosigned -> size 0.
    refusal = _refusal(AddCheckpoint(5, tuple(tree.consistency_proof(5, 13)), note13),
                       trusted, stored)
    assert (refusal.status, refusal.body()) == (409, (b"8\n", SIZE_CONTENT_TYPE))
    refusal = _refusal(AddCheckpoint(8, proof, note13), trusted, None)
    assert (refusal.status, refusal.body()) == (409, (b"0\n", SIZE_CONTENT_TYPE))

    # Bad proof: one hash flipped, a hash missing -> 422.
    flipped = (bytes([proof[0][0] ^ 1]) + proof[0][1:], *proof[1:])
    assert _refusal(AddCheckpoint(8, flipped, note13), trusted, stored).status == 422
    assert _refusal(AddCheckpoint(8, proof[:-1], note13), trusted, stored).status == 422
    assert _refusal(AddCheckpoint(0, proof, _note(signer, tree, 8)), trusted,
                    None).status == 422  # a proof from size 0 must be empty

    # Fork at the stored size: same size, other root -> 409 (no size body).
    forked = merkle.MemoryTree(merkle.hash_leaf(b"forged %d" % i) for i in range(13))
    refusal = _refusal(AddCheckpoint(8, (), _note(signer, forked, 8)), trusted, stored)
    assert refusal.status == 409 and refusal.stored_size is None
    # Fork at a larger size: no proof links the two trees -> 422.
    refusal = _refusal(AddCheckpoint(8, tuple(forked.consistency_proof(8, 13)),
                                     _note(signer, forked, 13)), trusted, stored)
    assert refusal.status == 422


def test_signatures_of_unknown_keys_are_ignored(log) -> None:  # type: ignore[no-untyped-def]
    signer, tree = log
    note = _note(signer, tree, 4)
    stranger = NoteSigner("someone.else/key", Ed25519PrivateKey.generate())
    extra = stranger.sign(Checkpoint(ORIGIN, 4, tree.root(4)).body()).split(b"\n\n", 1)[1]
    both = note + extra  # a second signature line by a key the witness does not know
    assert decide(AddCheckpoint(0, (), both), _trusted(signer), None).size == 4


@pytest.mark.parametrize(("body", "why"), [
    (b"old 1\n", "empty line"),
    (b"old 01\n\nx", "decimal"),
    (b"olds 1\n\nx", "decimal"),
    (b"old -1\n\nx", "decimal"),
    (b"old 1\nnot base64!\n\nx", "base64"),
    (b"old 1\n" + base64.b64encode(b"short") + b"\n\nx", "32-byte"),
    (b"old 1\n" + (base64.b64encode(b"\0" * 32) + b"\n") * 64 + b"\nx", "63"),
])
def test_malformed_bodies_are_400(body: bytes, why: str) -> None:
    with pytest.raises(WitnessRefusal, match=why) as caught:
        parse_request(body)
    assert caught.value.status == 400


def test_request_encoding_round_trips(log) -> None:  # type: ignore[no-untyped-def]
    signer, tree = log
    request = AddCheckpoint(8, tuple(tree.consistency_proof(8, 13)), _note(signer, tree, 13))
    encoded = request.encode()
    assert encoded.startswith(b"old 8\n") and b"\n\n" + request.note in encoded
    assert parse_request(encoded) == request
    garbled = AddCheckpoint(0, (), b"not a note\n")
    assert _refusal(garbled, _trusted(signer), None).status == 400


def test_cosignature_line_is_byte_for_byte_c2sp() -> None:
    """Rebuild the line by hand from the spec: key ID = SHA-256(name || 0x0A || 0x04 ||
    pub)[:4], then the u64 big-endian timestamp, then Ed25519 (deterministic) over
    'cosignature/v1\\ntime <t>\\n' || body; base64 after '— <name> '."""
    private = Ed25519PrivateKey.generate()
    public = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    name, timestamp = "witness.example.com/w1", 1679315147
    body = (b"example.com/behind-the-sofa\n20852163\n"
            b"CsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n")
    key_id = hashlib.sha256(name.encode() + b"\n\x04" + public).digest()[:4]
    signature = private.sign(b"cosignature/v1\ntime 1679315147\n" + body)
    expected = ("\u2014 " + name + " " +
                base64.b64encode(key_id + struct.pack(">Q", timestamp) + signature).decode()
                + "\n").encode("utf-8")
    line = Cosigner(name, private).cosign(body, timestamp)
    assert line.encode("utf-8") == expected
    # The timestamp bytes sit where the spec's own example carries them (bytes 4..12 of
    # "jWbPPwAAAABkGFDL..." are 1679315147 big-endian, the time of its signed message).
    spec_blob = base64.b64decode("jWbPPwAAAABkGFDLEZMHwSRaJNiIDoe9DYn/zXcrtPHeolMI5OWXEhZCB9"
                                 "dlrDJsX3b2oyin1nPZqhf5nNo0xUe+mbIUBkBIfZ+qnA==")
    assert spec_blob[4:12] == base64.b64decode(expected.split(b" ")[-1])[4:12]
    assert len(spec_blob) == len(base64.b64decode(expected.split(b" ")[-1])) == 76


def test_quorum_two_of_two_with_valid_cosigners(log) -> None:  # type: ignore[no-untyped-def]
    """The verify CLI's --witness-quorum lives on another branch; the quorum rule it uses
    (count of pinned witnesses with a valid line) is checked here directly."""
    signer, tree = log
    note = _note(signer, tree, 8)
    body = Checkpoint(ORIGIN, 8, tree.root(8)).body()
    w1, w2 = (Cosigner(f"witness.test/w{i}", Ed25519PrivateKey.generate()) for i in (1, 2))
    pinned = [w1.witness_key, w2.witness_key]
    both = add_cosignatures(note, [w1.cosign(body, 10), w2.cosign(body, 11)])
    assert len(valid_cosigners(both, pinned)) == 2
    one = add_cosignatures(note, [w1.cosign(body, 10)])
    assert valid_cosigners(one, pinned) == {"witness.test/w1": 10}
