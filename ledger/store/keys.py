"""The log's Ed25519 signing key, kept in a file readable by its owner only, and the
log's identity (origin + key) checked by every replica when it starts.

File format (one line, like Go's ``note`` signer keys):
``PRIVATE+KEY+<name>+<key hash hex>+<base64(0x01 || 32-byte seed)>``.

The signer's name is always the log's origin (verifiers require name == origin). One key
may sign several logs: it is then used under each log's origin, and the name in the file
only records the log it was first created for.
"""

from __future__ import annotations

import base64
import logging
import os
import secrets
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from ledger.checkpoint import (
    ED25519_ALG,
    Checkpoint,
    NoteSigner,
    NoteVerifier,
    key_hash,
    split_vkey,
)
from ledger.errors import LedgerError, LogIdentityError

if TYPE_CHECKING:
    from ledger.store.identity import IdentifiedLog

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
    name, hash_hex, seed = split_vkey(text[len(PREFIX):], ED25519_ALG, "signer key",
                                      "only Ed25519 signer keys are supported")
    if len(seed) != 32:
        raise ValueError("only Ed25519 signer keys are supported")
    signer = NoteSigner(name, Ed25519PrivateKey.from_private_bytes(seed))
    if signer.key_hash.hex() != hash_hex:
        raise ValueError("signer key hash does not match its key")
    return signer


def create_key_file_once(path: Path, make_text: Callable[[], str], what: str) -> None:
    """Create a secret key file (mode 0600) unless it exists; warn when it is readable
    by others. Two processes starting at once keep the first one's key."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        text = make_text()
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass  # another process created it first: use theirs
        else:
            with os.fdopen(fd, "w") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            log.info("created %s %s", what, path)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        log.warning("%s %s is readable by others (mode %o)", what, path, mode)


def load_or_create_signer(path: Path, name: str) -> NoteSigner:
    """Load the key at ``path``; create it (mode 0600) on first start."""
    path = Path(path)
    create_key_file_once(
        path, lambda: encode_signer_key(name, Ed25519PrivateKey.generate()) + "\n",
        "log signing key")
    signer = decode_signer_key(path.read_text())
    if signer.name != name:
        raise ValueError(f"key {path} is for log {signer.name!r}, expected {name!r}")
    return signer


def bind_to_origin(signer: NoteSigner, origin: str) -> NoteSigner:
    """The same key under the log's origin as its name."""
    if signer.name == origin:
        return signer
    # NoteSigner keeps its key private and offers no rename: build one from the same key.
    return NoteSigner(origin, signer._key)


@dataclass(frozen=True)
class LogIdentity:
    origin: str
    signer: NoteSigner  # named ``origin``
    created: bool  # this replica created the log's identity just now


KEY_PATH_SETTING = "AUDIT_LEDGER_LOG_KEY_PATH"
KEY_SETTING = "AUDIT_LEDGER_LOG_SIGNING_KEY"
ORIGIN_SETTING = "AUDIT_LEDGER_ORIGIN"


def new_origin(log_name: str) -> str:
    """``<name>/<8 random hex>``: two logs never share an origin by accident."""
    return f"{log_name.rstrip('/')}/{secrets.token_hex(4)}"


def open_log_identity(ledger: IdentifiedLog, *, key_path: Path, key_text: str = "",
                      origin: str = "", log_name: str = "audit-ledger.local/log"
                      ) -> LogIdentity:
    """The log's origin and signer, created with the log or checked against it.

    - ``key_text`` (the key itself, e.g. from a secret in the environment) wins over
      ``key_path``; a missing key file is created only for a log without checkpoints.
    - ``origin`` empty: the log's stored origin, or a new ``<log_name>/<hex>`` for a new
      log. Set: it must be the stored one (or becomes it, for a new log).

    Raises ``LogIdentityError`` (exit 2) when this key or origin is not the log's: the
    replica would otherwise seal checkpoints no verifier accepts.
    """
    stored = ledger.log_meta()
    latest = ledger.latest_checkpoint()
    log_origin = stored.origin if stored else None
    if log_origin is None and latest is not None:
        # A log created before origins were stored: its checkpoints say what it is.
        log_origin = Checkpoint.peek(latest.note).origin
    if origin and log_origin is not None and origin != log_origin:
        raise LogIdentityError(ORIGIN_SETTING, f"is {origin!r} but this log's origin is "
                               f"{log_origin!r}; unset it or give the log's origin")
    chosen = log_origin or origin or new_origin(log_name)
    if not _valid_name(chosen):
        setting = ORIGIN_SETTING if origin else "AUDIT_LEDGER_LOG_NAME"
        raise LogIdentityError(setting, f"{chosen!r} is not a valid origin (no spaces or "
                               "'+', not empty)")
    signer, where = _load_key(key_path, key_text, chosen,
                              may_create=stored is None and latest is None)
    signer = bind_to_origin(signer, chosen)
    created = False
    if stored is None:
        if latest is not None:
            _check_signs(signer, latest.note, latest.size, chosen, where)
        stored = ledger.create_log_meta(chosen, signer.verifier().encode())
        created = stored.verifier_key == signer.verifier().encode() and stored.origin == chosen
        if stored.origin != chosen:  # a replica starting beside us created the log first
            if origin and origin != stored.origin:
                raise LogIdentityError(ORIGIN_SETTING, f"is {origin!r} but this log's "
                                       f"origin is {stored.origin!r}")
            chosen = stored.origin
            signer = bind_to_origin(signer, chosen)
    expected = NoteVerifier.decode(stored.verifier_key)
    if expected.public_key != signer.public_key:
        raise LogIdentityError(
            where, f"the key (hash {signer.key_hash.hex()}) does not sign log {chosen!r}, "
            f"whose key is {expected.encode()}; give this replica the log's key")
    if latest is not None:
        _check_signs(signer, latest.note, latest.size, chosen, where)
    return LogIdentity(chosen, signer, created)


def _valid_name(origin: str) -> bool:
    return bool(origin) and not any(c.isspace() or c == "+" for c in origin)


def _load_key(path: Path, key_text: str, origin: str, *, may_create: bool
              ) -> tuple[NoteSigner, str]:
    """(signer, the setting it came from)."""
    if key_text:
        try:
            return decode_signer_key(key_text.strip()), KEY_SETTING
        except ValueError as exc:
            raise LogIdentityError(KEY_SETTING, f"is not a signer key: {exc}") from exc
    path = Path(path)
    if not path.exists():
        if not may_create:
            raise LogIdentityError(KEY_PATH_SETTING, f"no signing key at {path}, and this "
                                   "log already exists: give this replica the log's key "
                                   "(a file or a secret mount)")
        return load_or_create_signer(path, origin), KEY_PATH_SETTING
    try:
        return decode_signer_key(path.read_text()), KEY_PATH_SETTING
    except (OSError, ValueError) as exc:
        raise LogIdentityError(KEY_PATH_SETTING, f"cannot read a signer key from {path}: "
                               f"{exc}") from exc


def _check_signs(signer: NoteSigner, note: bytes, size: int, origin: str, where: str) -> None:
    try:
        signer.verifier().open_checkpoint(note, origin)
    except LedgerError as exc:
        raise LogIdentityError(
            where, f"the key (hash {signer.key_hash.hex()}) did not sign this log's latest "
            f"checkpoint (size {size}, origin {origin!r}): {exc}") from exc


def main(argv: list[str] | None = None) -> int:
    """``python -m ledger.store.keys PATH``: create a new log signing key file (0600).

    For replicas that get the key from a read-only secret mount: create it once, then
    distribute it. Its name is a placeholder; the key signs under the log's origin.
    """
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m ledger.store.keys PATH", file=sys.stderr)
        return 2
    path = Path(args[0])
    if path.exists():
        print(f"{path} exists; refusing to overwrite a signing key", file=sys.stderr)
        return 2
    signer = load_or_create_signer(path, "audit-ledger.local/log")
    print(f"created {path} (key hash {signer.key_hash.hex()}); keep it secret")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
