"""A slow, obviously correct RFC 9162 reference: the section 2.1 definitions, verbatim
as recursion over lists of entries."""

from __future__ import annotations

import hashlib


def _k(n: int) -> int:
    k = 1
    while k * 2 < n:
        k *= 2
    return k


def mth(entries: list[bytes]) -> bytes:
    n = len(entries)
    if n == 0:
        return hashlib.sha256(b"").digest()
    if n == 1:
        return hashlib.sha256(b"\x00" + entries[0]).digest()
    k = _k(n)
    return hashlib.sha256(b"\x01" + mth(entries[:k]) + mth(entries[k:])).digest()


def path(m: int, entries: list[bytes]) -> list[bytes]:
    n = len(entries)
    if n == 1:
        return []
    k = _k(n)
    if m < k:
        return path(m, entries[:k]) + [mth(entries[k:])]
    return path(m - k, entries[k:]) + [mth(entries[:k])]


def subproof(m: int, entries: list[bytes], b: bool) -> list[bytes]:
    n = len(entries)
    if m == n:
        return [] if b else [mth(entries)]
    k = _k(n)
    if m <= k:
        return subproof(m, entries[:k], b) + [mth(entries[k:])]
    return subproof(m - k, entries[k:], False) + [mth(entries[:k])]


def proof(m: int, entries: list[bytes]) -> list[bytes]:
    return subproof(m, entries, True)
