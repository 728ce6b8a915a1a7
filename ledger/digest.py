"""Digests that name their algorithm (``sha256:<hex>``) and salted commitments."""

from __future__ import annotations

import hashlib
import hmac
import secrets

from ledger.errors import InvalidInputError

SHA256_PREFIX = "sha256:"
SALT_BYTES = 32


def sha256_digest(data: bytes) -> str:
    """``sha256:<hex>`` of ``data``."""
    return SHA256_PREFIX + hashlib.sha256(data).hexdigest()


def parse_sha256_digest(digest: str, field: str = "digest") -> bytes:
    """The raw 32 bytes of a ``sha256:<hex>`` digest."""
    if not digest.startswith(SHA256_PREFIX):
        raise InvalidInputError(field, f"expected 'sha256:<hex>', got {digest[:20]!r}")
    try:
        raw = bytes.fromhex(digest[len(SHA256_PREFIX) :])
    except ValueError as exc:
        raise InvalidInputError(field, "digest is not hex") from exc
    if len(raw) != 32:
        raise InvalidInputError(field, "a SHA-256 digest has 32 bytes")
    return raw


def new_salt() -> bytes:
    """A fresh random salt for one commitment."""
    return secrets.token_bytes(SALT_BYTES)


def commit_text(salt: bytes, text: str) -> str:
    """Salted commitment ``sha256:`` of SHA-256(salt || UTF-8 text).

    The salt is fixed-length, so the concatenation is unambiguous; without the salt a
    short prompt could be guessed from its hash.
    """
    if len(salt) != SALT_BYTES:
        raise InvalidInputError("salt", f"a salt has {SALT_BYTES} bytes, got {len(salt)}")
    return sha256_digest(salt + text.encode("utf-8"))


def commitment_matches(commitment: str, salt: bytes, text: str) -> bool:
    """Constant-time check of a commitment against a salt and a text."""
    return hmac.compare_digest(commit_text(salt, text), commitment)
