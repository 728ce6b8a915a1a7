"""A tlog-tiles reader written from the specifications alone (c2sp.org/tlog-tiles,
c2sp.org/tlog-checkpoint, c2sp.org/signed-note, RFC 6962 2.1), sharing no code with the
server: it is the independent party the tiles are checked against.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

Fetch = Callable[[str], bytes]


def _sha(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def index_path(n: int) -> str:
    digits = str(n)
    digits = "0" * (-len(digits) % 3) + digits
    groups = [digits[i:i + 3] for i in range(0, len(digits), 3)]
    return "/".join(["x" + g for g in groups[:-1]] + [groups[-1]])


def tile_url(level: int | str, n: int, width: int) -> str:
    return f"tile/{level}/{index_path(n)}" + ("" if width == 256 else f".p/{width}")


def open_checkpoint(note: bytes, name: str, public_key: bytes) -> tuple[str, int, bytes]:
    """(origin, size, root) of a note signed by the Ed25519 key ``name``/``public_key``."""
    text = note.decode()
    body, _, signatures = text.rpartition("\n\n")
    body += "\n"
    key_id = _sha(name.encode() + b"\n\x01" + public_key)[:4]
    for line in signatures.splitlines():
        signer, blob = line.removeprefix("\u2014 ").split(" ")
        raw = base64.b64decode(blob)
        if signer == name and raw[:4] == key_id:
            Ed25519PublicKey.from_public_bytes(public_key).verify(raw[4:], body.encode())
            origin, size, root = body.split("\n")[:3]
            return origin, int(size), base64.b64decode(root)
    raise AssertionError("no signature by the pinned key")


class SpecReader:
    """Hashes, roots and proofs of a tree of ``size`` leaves, from its tiles only."""

    def __init__(self, fetch: Fetch, size: int) -> None:
        self.fetch, self.size = fetch, size
        self.tiles: dict[tuple[int, int], list[bytes]] = {}

    def tile(self, level: int, n: int) -> list[bytes]:
        if (level, n) not in self.tiles:
            # "The partial tile at level l for a tree of size s has floor(s / 256**l) mod
            # 256 entries": every tile left of it is full.
            count = self.size // 256 ** level
            width = 256 if (n + 1) * 256 <= count else count % 256
            assert width > 0, f"tile {level}/{n} does not exist at size {self.size}"
            data = self.fetch(tile_url(level, n, width))
            assert len(data) == 32 * width, (level, n, width, len(data))
            self.tiles[(level, n)] = [data[i:i + 32] for i in range(0, len(data), 32)]
        return self.tiles[(level, n)]

    def entries(self, n: int) -> list[bytes]:
        count = self.size
        width = 256 if (n + 1) * 256 <= count else count % 256
        data = self.fetch(tile_url("entries", n, width))
        out, at = [], 0
        while at < len(data):
            length = int.from_bytes(data[at:at + 2], "big")
            out.append(data[at + 2:at + 2 + length])
            at += 2 + length
        assert len(out) == width
        return out

    def mth(self, lo: int, hi: int) -> bytes:
        """MTH(D[lo:hi]) (RFC 6962 2.1), reading the largest tile hash that covers a
        perfect aligned subtree, recomputing the levels between tile levels."""
        n = hi - lo
        if n & (n - 1) == 0 and lo % n == 0:
            height = n.bit_length() - 1
            level = height // 8
            span = 256 ** level
            hashes = [self.tile(level, k // 256)[k % 256] for k in range(lo // span, hi // span)]
            while len(hashes) > 1:
                hashes = [_sha(b"\x01" + hashes[i] + hashes[i + 1])
                          for i in range(0, len(hashes), 2)]
            return hashes[0]
        k = 1 << ((n - 1).bit_length() - 1)
        return _sha(b"\x01" + self.mth(lo, lo + k) + self.mth(lo + k, hi))

    def path(self, m: int, lo: int, hi: int) -> list[bytes]:
        """PATH(m, D[lo:hi]), leaf upwards (RFC 6962 2.1.1)."""
        n = hi - lo
        if n == 1:
            return []
        k = 1 << ((n - 1).bit_length() - 1)
        if m < k:
            return self.path(m, lo, lo + k) + [self.mth(lo + k, hi)]
        return self.path(m - k, lo + k, hi) + [self.mth(lo, lo + k)]

    def subproof(self, m: int, lo: int, hi: int, whole: bool) -> list[bytes]:
        """SUBPROOF(m, D[lo:hi], b) (RFC 6962 2.1.2)."""
        n = hi - lo
        if m == n:
            return [] if whole else [self.mth(lo, hi)]
        k = 1 << ((n - 1).bit_length() - 1)
        if m <= k:
            return self.subproof(m, lo, lo + k, whole) + [self.mth(lo + k, hi)]
        return self.subproof(m - k, lo + k, hi, False) + [self.mth(lo, lo + k)]
