"""The embedded key-encryption keys: a JSON keyring file readable by its owner only.

Format: ``{"version": 1, "tenants": {tenant: {"current": kek id, "keks": {kek id: base64},
"subject_key": base64}}}``. Written whole to a temporary file, fsynced and renamed over
the old one under an exclusive ``flock`` on ``<file>.lock``, so the service and the CLI
can both change it. A process reloads it when the file changed on disk.

An operator who keeps KEKs in a KMS implements ``ledger.vault_crypto.KeyEncryptionKeys``
instead; nothing else changes.
"""

from __future__ import annotations

import base64
import fcntl
import importlib
import json
import logging
import os
import stat
import threading
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from pathlib import Path

from ledger.errors import InvalidInputError
from ledger.vault_crypto import KeyEncryptionKeys, KeyringData

log = logging.getLogger(__name__)


def _encode(tenants: dict[str, dict[str, object]]) -> str:
    out: dict[str, object] = {}
    for tenant, entry in tenants.items():
        keks = entry["keks"]
        subject_key = entry["subject_key"]
        assert isinstance(keks, dict) and isinstance(subject_key, bytes)
        out[tenant] = {"current": entry["current"],
                       "keks": {k: base64.b64encode(v).decode() for k, v in keks.items()},
                       "subject_key": base64.b64encode(subject_key).decode()}
    return json.dumps({"version": 1, "tenants": out}, indent=1, sort_keys=True) + "\n"


def _decode(text: str) -> dict[str, dict[str, object]]:
    raw = json.loads(text)
    if raw.get("version") != 1:
        raise ValueError("unknown keyring version")
    return {tenant: {"current": entry["current"],
                     "keks": {k: base64.b64decode(v) for k, v in entry["keks"].items()},
                     "subject_key": base64.b64decode(entry["subject_key"])}
            for tenant, entry in raw["tenants"].items()}


class FileKeyring(KeyringData):
    """``KeyringData`` persisted in one 0600 file; safe across threads and processes."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = Path(path)
        self._mutex = threading.RLock()
        self._stamp: tuple[int, int] | None = None
        self._dirty = False
        self._reload()

    # --- file handling -------------------------------------------------------------

    def _file_stamp(self) -> tuple[int, int] | None:
        try:
            info = self.path.stat()
        except FileNotFoundError:
            return None
        return info.st_mtime_ns, info.st_size

    def _reload(self) -> None:
        stamp = self._file_stamp()
        if stamp is None or stamp == self._stamp:
            return
        mode = stat.S_IMODE(self.path.stat().st_mode)
        if mode & 0o077:
            log.warning("keyring %s is readable by others (mode %o)", self.path, mode)
        self.tenants = _decode(self.path.read_text())
        self._stamp = stamp

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """Exclusive across processes; reloads first and writes back what changed."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._stamp = None  # always reread under the lock
            self._reload()
            self._dirty = False
            yield
            if self._dirty:
                self._write()
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def _write(self) -> None:
        temporary = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(_encode(self.tenants))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self.path)
        directory = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        self._stamp = self._file_stamp()
        self._dirty = False

    def changed(self) -> None:
        self._dirty = True

    # --- KeyEncryptionKeys ---------------------------------------------------------

    def _ensure(self, tenant: str) -> None:
        with self._mutex:
            self._reload()
            if tenant not in self.tenants:
                with self._locked():
                    super().current_kek_id(tenant)  # creates the tenant's keys

    def current_kek_id(self, tenant: str) -> str:
        self._ensure(tenant)
        with self._mutex:
            return super().current_kek_id(tenant)

    def wrap(self, tenant: str, data_key: bytes, context: bytes) -> tuple[str, bytes]:
        self._ensure(tenant)
        with self._mutex:
            return super().wrap(tenant, data_key, context)

    def unwrap(self, tenant: str, kek_id: str, wrapped: bytes, context: bytes) -> bytes:
        with self._mutex:
            self._reload()  # another process may have rotated
            return super().unwrap(tenant, kek_id, wrapped, context)

    def subject_key(self, tenant: str) -> bytes:
        self._ensure(tenant)
        with self._mutex:
            return super().subject_key(tenant)

    def rotate(self, tenant: str) -> str:
        with self._mutex, self._locked():
            return super().rotate(tenant)

    def retire(self, tenant: str, keep: Collection[str] = ()) -> list[str]:
        with self._mutex, self._locked():
            return super().retire(tenant, keep)


def load_keks(keyring_path: Path, provider: str = "") -> KeyEncryptionKeys:
    """The keyring file, or the operator's own ``KeyEncryptionKeys`` (e.g. a KMS client)
    named ``package.module:factory`` and built by calling ``factory()``."""
    if not provider:
        return FileKeyring(keyring_path)
    module_name, _, name = provider.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise InvalidInputError("kek_provider", f"cannot load {provider!r} (expected "
                                "package.module:factory)") from exc
    keks: KeyEncryptionKeys = factory()
    return keks
