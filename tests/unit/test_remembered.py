"""ledger.remembered: a log held against the checkpoint an auditor saw last."""

from __future__ import annotations

from ledger import merkle
from ledger.checkpoint import Checkpoint
from ledger.remembered import FORK, ROLLBACK, against_seen


def _tree(n: int, salt: str = "") -> merkle.MemoryTree:
    return merkle.MemoryTree(merkle.hash_leaf(f"{salt}{i}".encode()) for i in range(n))


def _cp(tree: merkle.MemoryTree, size: int) -> Checkpoint:
    return Checkpoint("o", size, tree.root(size))


def test_an_extension_of_the_seen_checkpoint_passes() -> None:
    tree = _tree(40)
    assert against_seen(_cp(tree, 20), _cp(tree, 40), 40, tree.read) is None
    assert against_seen(_cp(tree, 40), _cp(tree, 40), 40, tree.read) is None


def test_a_smaller_newest_checkpoint_or_tree_is_a_rollback() -> None:
    tree = _tree(40)
    found = against_seen(_cp(tree, 40), _cp(tree, 35), 40, tree.read)
    assert found is not None and found.kind == ROLLBACK and found.seen_size == 40
    short = _tree(30)
    found = against_seen(_cp(tree, 35), _cp(tree, 35), 30, short.read)
    assert found is not None and found.kind == ROLLBACK and "30 leaves" in found.message


def test_a_rewritten_tree_behind_the_seen_checkpoint_is_a_fork() -> None:
    honest, forged = _tree(40), _tree(40, salt="x")
    found = against_seen(_cp(honest, 20), _cp(forged, 40), 40, forged.read)
    assert found is not None and found.kind == FORK and "size 20 has root" in found.message
    # The stored tree still hashes to the seen root, but the newest checkpoint is another
    # tree's: it does not extend what was seen.
    found = against_seen(_cp(honest, 20), _cp(forged, 40), 40, honest.read)
    assert found is not None and found.kind == FORK and "does not extend" in found.message
