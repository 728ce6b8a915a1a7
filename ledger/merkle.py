"""RFC 9162 section 2.1 Merkle tree hashing, proofs and their verification.

Everything works on raw 32-byte SHA-256 hashes. Proof *planning* (which subtrees a proof
needs) is separate from *fetching* node hashes, so a store can read exactly the O(log n)
perfect-subtree hashes it needs and no leaf is ever rehashed.

A perfect subtree is named ``(level, index)``: it covers leaves
``[index * 2**level, (index + 1) * 2**level)``. Level 0 nodes are leaf hashes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from ledger.errors import MalformedProofError, OutOfRangeError, RootMismatchError

HASH_SIZE = 32
LEAF_PREFIX = b"\x00"
NODE_PREFIX = b"\x01"
# RFC 9162 2.1.1: the hash of an empty list is the hash of the empty string.
EMPTY_ROOT = hashlib.sha256(b"").digest()

Node = tuple[int, int]  # (level, index) of a perfect subtree
NodeReader = Callable[[Sequence[Node]], Mapping[Node, bytes]]


def hash_leaf(data: bytes) -> bytes:
    """MTH({d}) = SHA-256(0x00 || d) (RFC 9162 2.1.1)."""
    return hashlib.sha256(LEAF_PREFIX + data).digest()


def hash_children(left: bytes, right: bytes) -> bytes:
    """SHA-256(0x01 || left || right) (RFC 9162 2.1.1)."""
    return hashlib.sha256(NODE_PREFIX + left + right).digest()


def _largest_power_of_two_below(n: int) -> int:
    """The k of RFC 9162: the largest power of two smaller than n (n > 1)."""
    return 1 << ((n - 1).bit_length() - 1)


# --- planning: which ranges and nodes a proof needs --------------------------------------


def range_nodes(start: int, end: int) -> list[Node]:
    """Split the leaf range ``[start, end)`` into maximal aligned perfect subtrees.

    For the ranges that occur in RFC 9162 trees the subtrees come out largest first, and
    the range's hash is the right fold of theirs (see ``fold_range``).
    """
    nodes: list[Node] = []
    while start < end:
        level = (start & -start).bit_length() - 1 if start else (end - start).bit_length()
        while (1 << level) > end - start:
            level -= 1
        nodes.append((level, start >> level))
        start += 1 << level
    return nodes


def fold_range(hashes: Sequence[bytes]) -> bytes:
    """Hash of a range from its perfect subtrees' hashes (largest first)."""
    result = hashes[-1]
    for left in reversed(hashes[:-1]):
        result = hash_children(left, result)
    return result


def inclusion_ranges(index: int, tree_size: int) -> list[tuple[int, int]]:
    """The subtree ranges whose hashes form PATH(index, D[tree_size]), leaf upwards."""
    if not 0 <= index < tree_size:
        raise OutOfRangeError(f"index {index} is outside a tree of size {tree_size}")
    ranges: list[tuple[int, int]] = []
    lo, hi = 0, tree_size
    while hi - lo > 1:
        k = _largest_power_of_two_below(hi - lo)
        if index < lo + k:
            ranges.append((lo + k, hi))
            hi = lo + k
        else:
            ranges.append((lo, lo + k))
            lo = lo + k
    ranges.reverse()
    return ranges


def consistency_ranges(size1: int, size2: int) -> list[tuple[int, int]]:
    """The subtree ranges whose hashes form PROOF(size1, D[size2]) (RFC 9162 2.1.4.1)."""
    if not 0 <= size1 <= size2:
        raise OutOfRangeError(f"no consistency proof from size {size1} to size {size2}")
    if size1 == 0 or size1 == size2:
        return []
    ranges: list[tuple[int, int]] = []
    lo, hi, m = 0, size2, size1
    complete = True  # the RFC's flag b: the subtree [lo, lo+m) is a root of the old tree
    while m != hi - lo:
        k = _largest_power_of_two_below(hi - lo)
        if m <= k:
            ranges.append((lo + k, hi))
            hi = lo + k
        else:
            ranges.append((lo, lo + k))
            lo, m = lo + k, m - k
            complete = False
    if not complete:
        ranges.append((lo, hi))
    ranges.reverse()
    return ranges


def nodes_for(ranges: Iterable[tuple[int, int]]) -> list[Node]:
    """Every perfect node the given ranges need, without repeats."""
    seen: dict[Node, None] = {}
    for start, end in ranges:
        for node in range_nodes(start, end):
            seen[node] = None
    return list(seen)


def hashes_for(ranges: Sequence[tuple[int, int]], read: NodeReader) -> list[bytes]:
    """Fetch the nodes of ``ranges`` with one call of ``read`` and fold each range."""
    needed = nodes_for(ranges)
    found = read(needed)
    missing = [node for node in needed if node not in found]
    if missing:
        raise LookupError(f"tree nodes missing from store: {missing[:5]}")
    return [fold_range([found[n] for n in range_nodes(a, b)]) for a, b in ranges]


def inclusion_proof(index: int, tree_size: int, read: NodeReader) -> list[bytes]:
    """The audit path of leaf ``index`` in the tree of ``tree_size`` leaves."""
    return hashes_for(inclusion_ranges(index, tree_size), read)


def consistency_proof(size1: int, size2: int, read: NodeReader) -> list[bytes]:
    """The consistency proof from ``size1`` to ``size2``."""
    return hashes_for(consistency_ranges(size1, size2), read)


def tree_root(tree_size: int, read: NodeReader) -> bytes:
    """MTH of the first ``tree_size`` leaves, from at most log2(n) perfect nodes."""
    if tree_size == 0:
        return EMPTY_ROOT
    return hashes_for([(0, tree_size)], read)[0]


# --- building: the right border of a growing tree ----------------------------------------


@dataclass
class CompactRange:
    """The perfect subtrees covering ``[0, size)``: enough to append and to take the root.

    ``append`` returns every perfect node that the new leaf completes, so a store can
    persist them and later serve any proof from O(log n) reads.
    """

    size: int = 0
    border: list[bytes] | None = None  # hashes of range_nodes(0, size), largest first

    def __post_init__(self) -> None:
        if self.border is None:
            self.border = []
        if len(self.border) != len(range_nodes(0, self.size)):
            raise ValueError("border does not match the tree size")

    @classmethod
    def load(cls, size: int, read: NodeReader) -> CompactRange:
        nodes = range_nodes(0, size)
        found = read(nodes)
        return cls(size, [found[n] for n in nodes])

    def append(self, leaf_hash: bytes) -> list[tuple[Node, bytes]]:
        assert self.border is not None
        created: list[tuple[Node, bytes]] = [((0, self.size), leaf_hash)]
        self.border.append(leaf_hash)
        self.size += 1
        level, merged = 0, self.size
        # Each trailing one bit of the old size is a subtree the new leaf completes.
        while merged & 1 == 0:
            right = self.border.pop()
            left = self.border.pop()
            node_hash = hash_children(left, right)
            self.border.append(node_hash)
            level += 1
            merged >>= 1
            created.append(((level, (self.size >> level) - 1), node_hash))
        return created

    def extend(self, leaf_hashes: bytes) -> None:
        """``append`` each of ``leaf_hashes`` (32-byte hashes, concatenated) in turn,
        keeping none of the nodes they complete: a scan that only wants the root."""
        border = self.border
        assert border is not None
        size = self.size
        for at in range(0, len(leaf_hashes), 32):
            node = leaf_hashes[at:at + 32]
            size += 1
            merged = size
            while merged & 1 == 0:  # as in ``append``: each subtree the leaf completes
                node = hash_children(border.pop(), node)
                merged >>= 1
            border.append(node)
        self.size = size

    def root(self) -> bytes:
        assert self.border is not None
        return fold_range(self.border) if self.border else EMPTY_ROOT


class MemoryTree:
    """All perfect nodes of a tree in memory: the reference store for tests and bundles."""

    def __init__(self, leaf_hashes: Iterable[bytes] = ()) -> None:
        self.nodes: dict[Node, bytes] = {}
        self.compact = CompactRange()
        for leaf in leaf_hashes:
            self.append(leaf)

    @property
    def size(self) -> int:
        return self.compact.size

    def append(self, leaf_hash: bytes) -> int:
        index = self.compact.size
        self.nodes.update(self.compact.append(leaf_hash))
        return index

    def read(self, keys: Sequence[Node]) -> dict[Node, bytes]:
        return {k: self.nodes[k] for k in keys if k in self.nodes}

    def root(self, tree_size: int | None = None) -> bytes:
        return tree_root(self.size if tree_size is None else tree_size, self.read)

    def inclusion_proof(self, index: int, tree_size: int | None = None) -> list[bytes]:
        return inclusion_proof(index, self.size if tree_size is None else tree_size, self.read)

    def consistency_proof(self, size1: int, size2: int | None = None) -> list[bytes]:
        return consistency_proof(size1, self.size if size2 is None else size2, self.read)


def root_of(leaf_hashes: Iterable[bytes]) -> bytes:
    """MTH of a list of leaf hashes, in O(n) time and O(log n) memory."""
    compact = CompactRange()
    for leaf in leaf_hashes:
        compact.append(leaf)
    return compact.root()


# --- verification ------------------------------------------------------------------------


def _check_hashes(proof: Sequence[bytes], *roots: bytes) -> None:
    for item in (*proof, *roots):
        if len(item) != HASH_SIZE:
            raise MalformedProofError(f"a hash has {len(item)} bytes, expected {HASH_SIZE}")


def _decompose(index: int, size: int) -> tuple[int, int]:
    """Split an audit path into its inner part (below the point where the paths to
    ``index`` and to the last leaf part) and its border part (left siblings above)."""
    inner = (index ^ (size - 1)).bit_length()
    border = bin(index >> inner).count("1")
    return inner, border


def _chain_inner(seed: bytes, proof: Sequence[bytes], index: int) -> bytes:
    for i, sibling in enumerate(proof):
        if (index >> i) & 1:
            seed = hash_children(sibling, seed)
        else:
            seed = hash_children(seed, sibling)
    return seed


def _chain_inner_left_siblings_only(seed: bytes, proof: Sequence[bytes], index: int) -> bytes:
    for i, sibling in enumerate(proof):
        if (index >> i) & 1:
            seed = hash_children(sibling, seed)
    return seed


def _chain_border(seed: bytes, proof: Sequence[bytes]) -> bytes:
    for sibling in proof:
        seed = hash_children(sibling, seed)
    return seed


def root_from_inclusion_proof(
    leaf_hash: bytes, index: int, tree_size: int, proof: Sequence[bytes]
) -> bytes:
    """The root that ``proof`` implies for ``leaf_hash`` at ``index`` (RFC 9162 2.1.3.2)."""
    if not 0 <= index < tree_size:
        raise OutOfRangeError(f"index {index} is outside a tree of size {tree_size}")
    _check_hashes(proof, leaf_hash)
    inner, border = _decompose(index, tree_size)
    if len(proof) != inner + border:
        raise MalformedProofError(
            f"inclusion proof for index {index} in size {tree_size} has {len(proof)} "
            f"hashes, expected {inner + border}"
        )
    result = _chain_inner(leaf_hash, proof[:inner], index)
    return _chain_border(result, proof[inner:])


def verify_inclusion(
    leaf_hash: bytes, index: int, tree_size: int, proof: Sequence[bytes], root: bytes
) -> None:
    """Raise unless ``proof`` shows leaf ``index`` of the tree with ``root`` is ``leaf_hash``."""
    _check_hashes((), root)
    calculated = root_from_inclusion_proof(leaf_hash, index, tree_size, proof)
    if calculated != root:
        raise RootMismatchError(expected=root, calculated=calculated)


def verify_consistency(
    size1: int, size2: int, proof: Sequence[bytes], root1: bytes, root2: bytes
) -> None:
    """Raise unless the tree (size2, root2) extends the tree (size1, root1) (RFC 9162 2.1.4.2)."""
    if not 0 <= size1 <= size2:
        raise OutOfRangeError(f"size1 {size1} must be between 0 and size2 {size2}")
    _check_hashes(proof, root1, root2)
    if size1 == size2 or size1 == 0:
        if proof:
            raise MalformedProofError(
                f"consistency proof from {size1} to {size2} must be empty"
            )
        if size1 == size2 and root1 != root2:
            raise RootMismatchError(expected=root2, calculated=root1)
        if size1 == 0 and root1 != EMPTY_ROOT:
            raise RootMismatchError(expected=EMPTY_ROOT, calculated=root1)
        return

    # Shift away the levels where the old tree is a complete subtree of the new one.
    level = (size1 & -size1).bit_length() - 1
    index = (size1 - 1) >> level
    inner, border = _decompose(index, ((size2 - 1) >> level) + 1)
    if index == 0:  # the old tree is a perfect subtree: its root seeds both chains
        seed, rest = root1, list(proof)
    elif proof:
        seed, rest = proof[0], list(proof[1:])
    else:
        raise MalformedProofError(f"consistency proof from {size1} to {size2} is empty")
    if len(rest) != inner + border:
        expected = inner + border + (0 if index == 0 else 1)
        raise MalformedProofError(
            f"consistency proof from {size1} to {size2} has {len(proof)} hashes, "
            f"expected {expected}"
        )
    calculated1 = _chain_border(
        _chain_inner_left_siblings_only(seed, rest[:inner], index), rest[inner:]
    )
    if calculated1 != root1:
        raise RootMismatchError(expected=root1, calculated=calculated1)
    calculated2 = _chain_border(_chain_inner(seed, rest[:inner], index), rest[inner:])
    if calculated2 != root2:
        raise RootMismatchError(expected=root2, calculated=calculated2)
