"""What a witness costs per checkpoint: the pure decision + cosignature against a full
add-checkpoint round trip (HTTP on loopback, compare-and-swap in SQLite), side by side.

    .venv/bin/python bench/bench_witness.py [--checkpoints 300]

A log is simulated with an in-memory tree (7-11 leaves between checkpoints); each step
submits the next checkpoint with its consistency proof from the previous one, as the
log's witness client does. The SQLite state is written with synchronous=FULL.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ledger import merkle  # noqa: E402
from ledger.checkpoint import Checkpoint, NoteSigner, SignedNote  # noqa: E402
from ledger.cosignature import Cosigner  # noqa: E402
from ledger.witness_policy import AddCheckpoint, WitnessedState, decide  # noqa: E402
from tests.integration.witness_proc import start_witness  # noqa: E402

ORIGIN = "bench.audit-ledger/log"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoints", type=int, default=300)
    args = parser.parse_args()
    signer = NoteSigner(ORIGIN, Ed25519PrivateKey.generate())
    tree = merkle.MemoryTree()
    requests: list[AddCheckpoint] = []
    old = 0
    for step in range(1, args.checkpoints + 1):
        for _ in range(7 + step % 5):  # a few records between checkpoints
            tree.append(merkle.hash_leaf(b"record %d" % tree.size))
        note = signer.sign_checkpoint(Checkpoint(ORIGIN, tree.size, tree.root()))
        proof = tuple(tree.consistency_proof(old, tree.size)) if old else ()
        requests.append(AddCheckpoint(old, proof, note))
        old = tree.size

    cosigner = Cosigner("bench.witness/w", Ed25519PrivateKey.generate())
    trusted = {ORIGIN: [signer.verifier()]}
    pure: list[float] = []
    state: WitnessedState | None = None
    for request in requests:
        started = time.perf_counter()
        checkpoint = decide(request, trusted, state)
        cosigner.cosign(SignedNote.parse(request.note).body, int(time.time()))
        pure.append(time.perf_counter() - started)
        state = WitnessedState(checkpoint.size, checkpoint.root)

    with tempfile.TemporaryDirectory() as tmp:
        witness = start_witness(Path(tmp) / "w", [(ORIGIN, signer.verifier().encode())])
        try:
            http: list[float] = []
            for request in requests:
                body = request.encode()
                started = time.perf_counter()
                status, _, answer = witness.post(body)
                http.append(time.perf_counter() - started)
                assert status == 200, answer
        finally:
            witness.stop()

    def row(label: str, times: list[float]) -> str:
        median = statistics.median(times) * 1000
        return f"{label:34} {len(times) / sum(times):9.0f}/s  median {median:7.3f} ms"

    print(f"{args.checkpoints} checkpoints up to tree size {tree.size}")
    print(row("decide + cosign (pure)", pure))
    print(row("add-checkpoint over HTTP + SQLite", http))
    print(f"ratio HTTP+storage / pure: {statistics.median(http) / statistics.median(pure):.1f}x")


if __name__ == "__main__":
    main()
