"""Merkle math against the slow reference, and every single-bit mutation rejected."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger import merkle
from ledger.errors import MalformedProofError, OutOfRangeError, RootMismatchError
from tests import merkle_reference as ref


def entries(n: int) -> list[bytes]:
    return [f"entry-{i}".encode() for i in range(n)]


def tree_of(n: int) -> merkle.MemoryTree:
    return merkle.MemoryTree(merkle.hash_leaf(e) for e in entries(n))


def flip(data: bytes, bit: int) -> bytes:
    raw = bytearray(data)
    raw[bit // 8] ^= 1 << (bit % 8)
    return bytes(raw)


def test_empty_tree_root_is_sha256_of_empty_string() -> None:
    # Recipe: printf '' | sha256sum
    expected = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert merkle.root_of([]).hex() == expected
    assert merkle.MemoryTree().root().hex() == expected


def test_one_leaf_root_is_its_leaf_hash() -> None:
    # Recipe: printf '\x00hello' | sha256sum
    leaf = merkle.hash_leaf(b"hello")
    assert leaf == hashlib.sha256(b"\x00hello").digest()
    assert merkle.root_of([leaf]) == leaf


def test_known_answer_two_leaves() -> None:
    # Recipe: SHA-256(0x01 || SHA-256(0x00 || "a") || SHA-256(0x00 || "b")).
    a, b = hashlib.sha256(b"\x00a").digest(), hashlib.sha256(b"\x00b").digest()
    assert merkle.root_of([a, b]) == hashlib.sha256(b"\x01" + a + b).digest()


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 140), data=st.data())
def test_inclusion_matches_reference_and_verifies(n: int, data: st.DataObject) -> None:
    items = entries(n)
    tree = tree_of(n)
    root = ref.mth(items)
    assert tree.root() == root
    index = data.draw(st.integers(0, n - 1))
    proof = tree.inclusion_proof(index)
    assert proof == ref.path(index, items)
    merkle.verify_inclusion(merkle.hash_leaf(items[index]), index, n, proof, root)


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 140), data=st.data())
def test_consistency_matches_reference_and_verifies(n: int, data: st.DataObject) -> None:
    items = entries(n)
    tree = tree_of(n)
    m = data.draw(st.integers(1, n))
    proof = tree.consistency_proof(m)
    assert proof == (ref.proof(m, items) if m < n else [])
    merkle.verify_consistency(m, n, proof, ref.mth(items[:m]), ref.mth(items))


def test_every_inclusion_and_consistency_proof_up_to_40() -> None:
    for n in range(1, 41):
        items = entries(n)
        tree = tree_of(n)
        root = tree.root()
        for i in range(n):
            merkle.verify_inclusion(merkle.hash_leaf(items[i]), i, n, tree.inclusion_proof(i), root)
        for m in range(0, n + 1):
            merkle.verify_consistency(m, n, tree.consistency_proof(m), tree.root(m), root)


@settings(max_examples=120, deadline=None)
@given(n=st.integers(2, 80), data=st.data())
def test_any_flipped_bit_in_inclusion_evidence_fails(n: int, data: st.DataObject) -> None:
    tree = tree_of(n)
    index = data.draw(st.integers(0, n - 1))
    leaf = tree.nodes[(0, index)]
    proof = tree.inclusion_proof(index)
    root = tree.root()
    target = data.draw(st.sampled_from(["proof", "root", "leaf"]))
    bit = data.draw(st.integers(0, 255))
    if target == "proof":
        which = data.draw(st.integers(0, len(proof) - 1))
        proof = [flip(h, bit) if i == which else h for i, h in enumerate(proof)]
    elif target == "root":
        root = flip(root, bit)
    else:
        leaf = flip(leaf, bit)
    with pytest.raises(RootMismatchError) as info:
        merkle.verify_inclusion(leaf, index, n, proof, root)
    assert info.value.expected == root and info.value.calculated != root


@settings(max_examples=120, deadline=None)
@given(n=st.integers(3, 80), data=st.data())
def test_any_flipped_bit_in_consistency_evidence_fails(n: int, data: st.DataObject) -> None:
    tree = tree_of(n)
    m = data.draw(st.integers(1, n - 1))
    proof, root1, root2 = tree.consistency_proof(m), tree.root(m), tree.root()
    target = data.draw(st.sampled_from(["proof", "root1", "root2"]))
    bit = data.draw(st.integers(0, 255))
    if target == "proof":
        which = data.draw(st.integers(0, len(proof) - 1))
        proof = [flip(h, bit) if i == which else h for i, h in enumerate(proof)]
    elif target == "root1":
        root1 = flip(root1, bit)
    else:
        root2 = flip(root2, bit)
    with pytest.raises(RootMismatchError):
        merkle.verify_consistency(m, n, proof, root1, root2)


@settings(max_examples=100, deadline=None)
@given(n=st.integers(2, 80), data=st.data())
def test_inclusion_proof_checked_against_wrong_size_fails(n: int, data: st.DataObject) -> None:
    # A proof made for size n, presented as if for another size of the same log (whose
    # signed checkpoint carries that size's root). The root alone does not commit to the
    # size, which is why checkpoints sign size and root together.
    tree = tree_of(n + 40)
    index = data.draw(st.integers(0, n - 2))
    proof = tree.inclusion_proof(index, n)
    wrong = data.draw(st.integers(index + 1, n + 40).filter(lambda s: s != n))
    with pytest.raises((RootMismatchError, MalformedProofError)):
        merkle.verify_inclusion(tree.nodes[(0, index)], index, wrong, proof, tree.root(wrong))


def test_truncated_and_extended_proofs_are_malformed() -> None:
    tree = tree_of(21)
    proof = tree.inclusion_proof(5)
    leaf, root = tree.nodes[(0, 5)], tree.root()
    with pytest.raises(MalformedProofError, match="expected 5"):
        merkle.verify_inclusion(leaf, 5, 21, proof[:-1], root)
    with pytest.raises(MalformedProofError):
        merkle.verify_inclusion(leaf, 5, 21, [*proof, proof[0]], root)
    with pytest.raises(MalformedProofError, match="33 bytes"):
        merkle.verify_inclusion(leaf, 5, 21, [proof[0] + b"\x00", *proof[1:]], root)
    consistency = tree.consistency_proof(7)
    with pytest.raises(MalformedProofError):
        merkle.verify_consistency(7, 21, consistency[:-1], tree.root(7), root)


def test_out_of_range_index_and_sizes() -> None:
    tree = tree_of(8)
    with pytest.raises(OutOfRangeError):
        merkle.verify_inclusion(tree.nodes[(0, 0)], 8, 8, [], tree.root())
    with pytest.raises(OutOfRangeError):
        merkle.verify_consistency(9, 8, [], tree.root(), tree.root())
    with pytest.raises(OutOfRangeError):
        tree.inclusion_proof(8)


def test_equal_sizes_need_equal_roots_and_no_proof() -> None:
    tree = tree_of(6)
    merkle.verify_consistency(6, 6, [], tree.root(), tree.root())
    with pytest.raises(RootMismatchError):
        merkle.verify_consistency(6, 6, [], tree.root(5), tree.root())
    with pytest.raises(MalformedProofError):
        merkle.verify_consistency(6, 6, [tree.root()], tree.root(), tree.root())
