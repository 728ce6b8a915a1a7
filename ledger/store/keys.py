"""The log's Ed25519 signing key, kept in a file readable by its owner only.

File format (one line, like Go's ``note`` signer keys):
``PRIVATE+KEY+<name>+<key hash hex>+<base64(0x01 || 32-byte seed)>``.
"""

from __future__ import annotations

import base64
import logging
import os
import stat
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from ledger.checkpoint import ED25519_ALG, NoteSigner, key_hash

log = logging.getLogger(__name__)
PREFIX = "PRIVATE+KEY+"


def encode_signer_key(name: str, private_key: Ed25519PrivateKey) -> str:
    seed = private_key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    public = NoteSigner(name, private_key).public_key
    blob = base64.b64encode(ED25519_ALG + seed).decode()
    return f"{PREFIX}{name}+{key_hash(name, public).hex()}+{blob}"


def decode_signer_key(text: str) -> NoteSigner:
    if not text.startswith(PREFIX):
        raise ValueError("not a PRIVATE+KEY signer key")
    name, hash_hex, blob = text[len(PREFIX):].strip().split("+", 2)
    raw = base64.b64decode(blob, validate=True)
    if raw[:1] != ED25519_ALG or len(raw) != 33:
        raise ValueError("only Ed25519 signer keys are supported")
    signer = NoteSigner(name, Ed25519PrivateKey.from_private_bytes(raw[1:]))
    if signer.key_hash.hex() != hash_hex:
        raise ValueError("signer key hash does not match its key")
    return signer


def load_or_create_signer(path: Path, name: str) -> NoteSigner:
    """Load the key at ``path``; create it (mode 0600) on first start."""
    path = Path(path)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        text = encode_signer_key(name, Ed25519PrivateKey.generate()) + "\n"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass  # another process created it first: use theirs
        else:
            with os.fdopen(fd, "w") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            log.info("created log signing key %s", path)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        log.warning("log signing key %s is readable by others (mode %o)", path, mode)
    signer = decode_signer_key(path.read_text())
    if signer.name != name:
        raise ValueError(f"key {path} is for log {signer.name!r}, expected {name!r}")
    return signer
