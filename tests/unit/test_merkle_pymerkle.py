"""Cross-check with an independent implementation (pymerkle) for every size 1..300."""

from __future__ import annotations

import warnings

from pymerkle import InmemoryTree, verify_consistency, verify_inclusion

from ledger import merkle


def test_roots_and_proofs_agree_with_pymerkle_for_sizes_1_to_300() -> None:
    ours = merkle.MemoryTree()
    theirs = InmemoryTree(algorithm="sha256")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        for n in range(1, 301):
            data = f"record {n}".encode()
            ours.append(merkle.hash_leaf(data))
            theirs.append_entry(data)
            root = ours.root()
            assert theirs.get_state(n) == root, n
            assert theirs.get_leaf(n) == ours.nodes[(0, n - 1)]
            for index in {0, n // 2, n - 1}:
                # pymerkle's proof checks against our root...
                verify_inclusion(theirs.get_leaf(index + 1), root,
                                 theirs.prove_inclusion(index + 1, n))
                # ...and ours against pymerkle's root.
                merkle.verify_inclusion(theirs.get_leaf(index + 1), index, n,
                                        ours.inclusion_proof(index), theirs.get_state(n))
            for m in {1, n // 3 or 1, n - 1 or 1}:
                verify_consistency(ours.root(m), root, theirs.prove_consistency(m, n))
                merkle.verify_consistency(m, n, ours.consistency_proof(m),
                                          theirs.get_state(m), theirs.get_state(n))


def test_extending_a_compact_range_by_runs_gives_pymerkles_roots() -> None:
    """``CompactRange.extend`` (runs of leaf hashes, as audit's workers send them) from
    any starting size gives the root pymerkle gives, as appending one by one does."""
    theirs = InmemoryTree(algorithm="sha256")
    leaves = [merkle.hash_leaf(f"record {n}".encode()) for n in range(1, 301)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        for n in range(1, 301):
            theirs.append_entry(f"record {n}".encode())
        for start in (0, 1, 5, 64, 127, 200):
            for length in (0, 1, 2, 3, 31, 64, 100):
                end = min(start + length, 300)
                compact = merkle.CompactRange()
                for leaf in leaves[:start]:
                    compact.append(leaf)
                compact.extend(b"".join(leaves[start:end]))
                assert compact.size == end
                assert compact.root() == (theirs.get_state(end) if end else merkle.EMPTY_ROOT)
