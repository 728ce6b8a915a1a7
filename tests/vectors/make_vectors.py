"""Regenerate the shared test vectors read by the Python tests and the chaincode tests.

    .venv/bin/python -m tests.vectors.make_vectors

Leaves are ``hash_leaf(b"leaf-<i>")``. The signing key is a fixed, test-only Ed25519
seed (Ed25519 signatures are deterministic, so the notes are reproducible). Each valid
case comes with mutated ones that must fail, and the name of the failure.
"""

from __future__ import annotations

import json
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger import merkle
from ledger.checkpoint import Checkpoint, NoteSigner

HERE = Path(__file__).parent
ORIGIN = "vectors.audit-ledger/log"
SEED = bytes(range(32))  # test only
OTHER_SEED = bytes(range(32, 64))  # test only


def tree(n: int) -> merkle.MemoryTree:
    return merkle.MemoryTree(merkle.hash_leaf(f"leaf-{i}".encode()) for i in range(n))


def flip_first_bit(hex_hash: str) -> str:
    raw = bytearray(bytes.fromhex(hex_hash))
    raw[0] ^= 0x80
    return raw.hex()


def consistency_cases() -> list[dict[str, object]]:
    big = tree(64)
    cases: list[dict[str, object]] = []
    for size1, size2 in [(1, 1), (1, 2), (1, 8), (2, 5), (3, 7), (4, 8), (5, 13), (6, 8),
                         (7, 64), (8, 9), (15, 16), (16, 33), (31, 64), (63, 64), (0, 5)]:
        proof = [h.hex() for h in big.consistency_proof(size1, size2)]
        base = {"size1": size1, "size2": size2, "root1": big.root(size1).hex(),
                "root2": big.root(size2).hex(), "proof": proof}
        cases.append({**base, "valid": True})
        if proof:
            cases.append({**base, "proof": [flip_first_bit(proof[0]), *proof[1:]],
                          "valid": False, "error": "root mismatch"})
            cases.append({**base, "proof": proof[:-1], "valid": False, "error": "malformed"})
            cases.append({**base, "proof": [*proof, proof[0]], "valid": False,
                          "error": "malformed"})
        if 0 < size1:  # every tree extends the empty one: nothing to mutate there
            cases.append({**base, "root2": flip_first_bit(str(base["root2"])), "valid": False,
                          "error": "root mismatch"})
    return cases


def checkpoint_cases() -> dict[str, object]:
    signer = NoteSigner(ORIGIN, Ed25519PrivateKey.from_private_bytes(SEED))
    other = NoteSigner(ORIGIN, Ed25519PrivateKey.from_private_bytes(OTHER_SEED))
    big = tree(64)
    notes = {size: signer.sign_checkpoint(Checkpoint(ORIGIN, size, big.root(size))).decode()
             for size in (3, 8, 21, 64)}
    forked = merkle.MemoryTree(merkle.hash_leaf(f"fork-{i}".encode()) for i in range(8))
    return {
        "origin": ORIGIN,
        "verifier_key": signer.verifier().encode(),
        "other_verifier_key": other.verifier().encode(),
        "sequence": [{"note": notes[s], "size": s,
                      "consistency_from_previous": [h.hex() for h in big.consistency_proof(p, s)]
                      if p else []}
                     for p, s in ((0, 3), (3, 8), (8, 21), (21, 64))],
        "rollback": {"note": notes[8], "size": 8},
        # Anchored after the whole sequence: same size as an anchored one, other root.
        "fork": {"note": signer.sign_checkpoint(Checkpoint(ORIGIN, 64, tree(63).root()
                                                           )).decode(), "size": 64},
        "bad_signature": other.sign_checkpoint(Checkpoint(ORIGIN, 70, bytes(32))).decode(),
        "unknown_origin": NoteSigner("elsewhere/log", Ed25519PrivateKey.from_private_bytes(
            SEED)).sign_checkpoint(Checkpoint("elsewhere/log", 3, big.root(3))).decode(),
        "bad_proof_extension": {
            "note": signer.sign_checkpoint(Checkpoint(ORIGIN, 30, forked.root())).decode(),
            "consistency_from_21": [h.hex() for h in big.consistency_proof(21, 30)]},
    }


def main() -> None:
    (HERE / "consistency.json").write_text(json.dumps(consistency_cases(), indent=1) + "\n")
    (HERE / "checkpoints.json").write_text(json.dumps(checkpoint_cases(), indent=1) + "\n")


if __name__ == "__main__":
    main()
