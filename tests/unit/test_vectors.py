"""The shared vectors (also read by the chaincode's tests) hold for the Python core."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ledger import merkle
from ledger.checkpoint import CheckpointTracker, NoteVerifier
from ledger.errors import (
    ForkError,
    MalformedProofError,
    RollbackError,
    RootMismatchError,
    SignatureError,
)

VECTORS = Path(__file__).resolve().parents[1] / "vectors"
CASES = json.loads((VECTORS / "consistency.json").read_text())
ERRORS = {"root mismatch": RootMismatchError, "malformed": MalformedProofError}


@pytest.mark.parametrize("case", CASES, ids=[
    f"{c['size1']}-{c['size2']}-{'ok' if c['valid'] else c['error']}-{i}"
    for i, c in enumerate(CASES)])
def test_consistency_vector(case: dict[str, object]) -> None:
    args = (case["size1"], case["size2"], [bytes.fromhex(h) for h in case["proof"]],  # type: ignore[union-attr]
            bytes.fromhex(case["root1"]), bytes.fromhex(case["root2"]))  # type: ignore[arg-type]
    if case["valid"]:
        merkle.verify_consistency(*args)  # type: ignore[arg-type]
    else:
        with pytest.raises(ERRORS[case["error"]]):  # type: ignore[index]
            merkle.verify_consistency(*args)  # type: ignore[arg-type]


def test_checkpoint_vectors() -> None:
    data = json.loads((VECTORS / "checkpoints.json").read_text())
    verifier = NoteVerifier.decode(data["verifier_key"])
    tracker = CheckpointTracker(verifier, data["origin"])
    for step in data["sequence"]:
        tracker.advance(step["note"].encode(),
                        [bytes.fromhex(h) for h in step["consistency_from_previous"]])
    with pytest.raises(RollbackError):
        tracker.advance(data["rollback"]["note"].encode(), [])
    with pytest.raises(ForkError):
        tracker.advance(data["fork"]["note"].encode(), [])
    with pytest.raises(SignatureError):
        tracker.advance(data["bad_signature"].encode(), [])
    assert tracker.trusted is not None and tracker.trusted.size == 64
