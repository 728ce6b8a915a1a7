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
    return commit_bytes(salt, text.encode("utf-8"))


def commit_bytes(salt: bytes, data: bytes) -> str:
    """Salted commitment of exact bytes: what ``commit_text`` commits to for a text."""
    if len(salt) != SALT_BYTES:
        raise InvalidInputError("salt", f"a salt has {SALT_BYTES} bytes, got {len(salt)}")
    return sha256_digest(salt + data)


def commitment_matches(commitment: str, salt: bytes, data: bytes | str) -> bool:
    """Constant-time check of a commitment against a salt and the committed bytes (a str
    stands for its UTF-8 bytes). Bytes are compared as given: no line ending or trailing
    newline is normalised, so a CRLF prompt opens only with its CRLF bytes."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    return hmac.compare_digest(commit_bytes(salt, raw), commitment)
