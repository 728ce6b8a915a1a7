"""Hold a log's stored tree against the checkpoint an auditor saw last (pure).

``audit`` and ``log fsck`` check a database against itself and the pinned key; what they
also remember (one signed checkpoint per log, as ``verify`` does) is what an insider
without the key cannot rewrite: a tail truncated behind it is a rollback, a tree that no
longer hashes to it, or whose newest checkpoint does not extend it, is a fork.
"""

from __future__ import annotations

from dataclasses import dataclass

from ledger import merkle
from ledger.checkpoint import Checkpoint, check_extends
from ledger.errors import VerificationError

ROLLBACK = "rollback"
FORK = "fork"


@dataclass(frozen=True)
class Divergence:
    kind: str  # ROLLBACK or FORK
    seen_size: int
    message: str


def against_seen(seen: Checkpoint, latest: Checkpoint | None, tree_size: int,
                 read: merkle.NodeReader) -> Divergence | None:
    """None if the log (its newest signed checkpoint ``latest``, its stored tree of
    ``tree_size`` leaves read through ``read``) still extends ``seen``."""
    offered = latest.size if latest is not None else 0
    if offered < seen.size:
        return Divergence(ROLLBACK, seen.size, f"rollback: this auditor saw the signed "
                          f"checkpoint of size {seen.size}; the log's newest is {offered}")
    if tree_size < seen.size:
        return Divergence(ROLLBACK, seen.size, f"rollback: this auditor saw the signed "
                          f"checkpoint of size {seen.size}; the log's tree has {tree_size} "
                          "leaves")
    try:
        root = merkle.tree_root(seen.size, read)
    except LookupError as exc:
        return Divergence(FORK, seen.size, f"fork: the log's tree at size {seen.size} is "
                          f"incomplete ({exc})")
    if root != seen.root:
        return Divergence(FORK, seen.size, f"fork: the log's tree at size {seen.size} has "
                          f"root {root.hex()}, the checkpoint this auditor saw signs "
                          f"{seen.root.hex()}")
    assert latest is not None
    try:
        check_extends(seen, latest, merkle.consistency_proof(seen.size, latest.size, read))
    except (VerificationError, LookupError) as exc:
        return Divergence(FORK, seen.size, f"fork: the log's newest checkpoint ({latest.size}) "
                          f"does not extend the one this auditor saw ({seen.size}): {exc}")
    return None
