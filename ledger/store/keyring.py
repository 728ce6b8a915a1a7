"""The key store: a JSON keyring file readable by its owner only.

Format: ``{"version": 2, "sealed_by": "" | "aws-kms", "tenants": {tenant: {"current":
kek id, "since": POSIX time, "keks": {kek id: base64}, "subject_key": base64,
"previous_subject_keys": [base64], "doomed": [kek id]}}}``. Version 1 files (no
``since``, ``previous_subject_keys`` or ``doomed``) are read as they are.

Every key in the file is raw (the embedded default: the file's 0600 mode is its only
guard) or sealed by a ``KeySealer`` (``ledger.store.kms``: one AWS KMS key per tenant),
so the file alone opens nothing.

Written whole to a fresh temporary file (mode 0600) in the same directory, fsynced,
renamed over the old one and the directory fsynced, under an exclusive ``flock`` on
``<file>.lock``, so the service and the CLI can both change it; no temporary copy is
left behind, even when a write fails. A process reloads the file when it changed on disk.
"""

from __future__ import annotations

import base64
import fcntl
import importlib
import json
import logging
import os
import tempfile
import threading
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

from ledger.errors import InvalidInputError
from ledger.store.file_modes import FILE_MODE, private_directory, private_file
from ledger.vault_crypto import KeyEncryptionKeys, KeyringData

log = logging.getLogger(__name__)

EPOCH_S = 86400.0  # a new KEK per tenant per day: an erasure re-wraps at most one day's keys


class KeySealer(Protocol):
    """Seals each key before it is written to the keyring file (e.g. a KMS)."""

    name: str

    def seal(self, tenant: str, key_id: str, key: bytes) -> bytes: ...

    def open(self, tenant: str, key_id: str, blob: bytes) -> bytes: ...


class _RawKeys:
    """The embedded default: keys stored as they are (the file mode guards them)."""

    name = ""

    def seal(self, tenant: str, key_id: str, key: bytes) -> bytes:
        return key

    def open(self, tenant: str, key_id: str, blob: bytes) -> bytes:
        return blob


class FileKeyring(KeyringData):
    """``KeyringData`` persisted in one 0600 file; safe across threads and processes."""

    def __init__(self, path: Path, sealer: KeySealer | None = None,
                 epoch_s: float = EPOCH_S) -> None:
        super().__init__(epoch_s=epoch_s)
        self.path = Path(path)
        self.sealer: KeySealer = sealer or _RawKeys()
        self._opened: dict[tuple[str, str, bytes], bytes] = {}  # sealed blob -> key
        self._mutex = threading.RLock()
        self._stamp: tuple[int, int, int] | None = None
        self._dirty = False
        self._reload()

    # --- encoding ------------------------------------------------------------------

    def _seal(self, tenant: str, key_id: str, key: bytes) -> str:
        blob = self.sealer.seal(tenant, key_id, key)
        self._opened[(tenant, key_id, blob)] = key
        return base64.b64encode(blob).decode()

    def _open(self, tenant: str, key_id: str, text: str) -> bytes:
        blob = base64.b64decode(text)
        key = self._opened.get((tenant, key_id, blob))
        if key is None:
            key = self.sealer.open(tenant, key_id, blob)
            self._opened[(tenant, key_id, blob)] = key
        return key

    def _encode(self) -> str:
        out: dict[str, object] = {}
        for tenant, entry in self.tenants.items():
            keks, subject_key = entry["keks"], entry["subject_key"]
            previous = entry.get("previous_subject_keys") or []
            assert isinstance(keks, dict) and isinstance(subject_key, bytes)
            doomed = entry.get("doomed") or []
            assert isinstance(previous, list) and isinstance(doomed, list)
            out[tenant] = {
                "current": entry["current"], "since": entry.get("since"),
                "keks": {k: self._seal(tenant, k, v) for k, v in keks.items()},
                "subject_key": self._seal(tenant, "subject", subject_key),
                "previous_subject_keys": [self._seal(tenant, f"subject-{i}", v)
                                          for i, v in enumerate(previous)],
                "doomed": doomed}
        return json.dumps({"version": 2, "sealed_by": self.sealer.name, "tenants": out},
                          indent=1, sort_keys=True) + "\n"

    def _decode(self, text: str) -> dict[str, dict[str, object]]:
        raw = json.loads(text)
        if raw.get("version") not in (1, 2):
            raise ValueError("unknown keyring version")
        if raw.get("sealed_by", "") != self.sealer.name:
            raise ValueError(f"keyring {self.path} is sealed by {raw.get('sealed_by')!r}, "
                             f"not {self.sealer.name!r}")
        tenants: dict[str, dict[str, object]] = {}
        for tenant, entry in raw["tenants"].items():
            tenants[tenant] = {
                "current": entry["current"], "since": entry.get("since"),
                "keks": {k: self._open(tenant, k, v) for k, v in entry["keks"].items()},
                "subject_key": self._open(tenant, "subject", entry["subject_key"]),
                "previous_subject_keys": [
                    self._open(tenant, f"subject-{i}", v)
                    for i, v in enumerate(entry.get("previous_subject_keys") or [])],
                "doomed": list(entry.get("doomed") or [])}
        return tenants

    # --- file handling -------------------------------------------------------------

    def _file_stamp(self) -> tuple[int, int, int] | None:
        try:
            info = self.path.stat()
        except FileNotFoundError:
            return None
        return info.st_mtime_ns, info.st_size, info.st_ino

    def _reload(self) -> None:
        stamp = self._file_stamp()
        if stamp is None or stamp == self._stamp:
            return
        private_file(self.path)
        self.tenants = self._decode(self.path.read_text())
        self._stamp = stamp

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """Exclusive across processes; reloads first and writes back what changed."""
        private_directory(self.path.parent)
        fd = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT, FILE_MODE)
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
        text = self._encode()
        fd, temporary = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp",
                                         dir=self.path.parent)  # mkstemp: mode 0600
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, self.path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)  # no copy of the keys left behind
            raise
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

    def kek(self, tenant: str, kek_id: str) -> bytes:
        with self._mutex:
            self._reload()
            return super().kek(tenant, kek_id)

    def subject_key(self, tenant: str) -> bytes:
        self._ensure(tenant)
        with self._mutex:
            return super().subject_key(tenant)

    def subject_keys(self, tenant: str) -> list[bytes]:
        self._ensure(tenant)
        with self._mutex:
            return super().subject_keys(tenant)

    def doomed(self, tenant: str) -> list[str]:
        with self._mutex:
            self._reload()
            return super().doomed(tenant)

    def rotate(self, tenant: str) -> str:
        with self._mutex, self._locked():
            return super().rotate(tenant)

    def replace(self, tenant: str, kek_ids: Collection[str]) -> str:
        with self._mutex, self._locked():
            return super().replace(tenant, kek_ids)

    def destroy(self, tenant: str, kek_ids: Collection[str]) -> list[str]:
        with self._mutex, self._locked():
            return super().destroy(tenant, kek_ids)

    def retire(self, tenant: str, keep: Collection[str] = ()) -> list[str]:
        with self._mutex, self._locked():
            return super().retire(tenant, keep)

    def rotate_subject_key(self, tenant: str) -> bytes:
        self._ensure(tenant)
        with self._mutex, self._locked():
            return super().rotate_subject_key(tenant)

    def retire_subject_keys(self, tenant: str) -> int:
        with self._mutex, self._locked():
            return super().retire_subject_keys(tenant)


def load_keks(keyring_path: Path, provider: str = "") -> KeyEncryptionKeys:
    """The keyring file; with ``aws-kms`` the same file with every key sealed by the
    tenant's AWS KMS key (``ledger.store.kms``); or the operator's own
    ``KeyEncryptionKeys`` named ``package.module:factory`` and built by calling
    ``factory()``."""
    if not provider:
        return FileKeyring(keyring_path)
    if provider == "aws-kms":
        from ledger.store.kms import AwsKmsSealer

        return FileKeyring(keyring_path, sealer=AwsKmsSealer.from_env())
    module_name, _, name = provider.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise InvalidInputError("kek_provider", f"cannot load {provider!r} (aws-kms, or "
                                "package.module:factory)") from exc
    keks: KeyEncryptionKeys = factory()
    return keks


