"""Envelope encryption of retained content (pure: keys and bytes in, bytes out).

Key hierarchy (docs/decisions/0018-key-hierarchy.md):

- a fresh 256-bit data key per record encrypts that record's prompt, output and both
  salts with AES-256-GCM;
- the data key is stored only wrapped (AES-256-GCM again) by the tenant's current
  key-encryption key (KEK), which lives outside the database (a keyring file by default,
  a KMS if an operator plugs one in through ``KeyEncryptionKeys``);
- each ciphertext's associated data names the record id, its leaf hash and the field, so
  a ciphertext moved to another record, or swapped with another field, fails to decrypt
  with ``ContentIntegrityError`` naming the record and the field.

The database holds ciphertext only. Erasing records re-wraps the surviving data keys of
their KEKs under a new KEK and destroys the old KEKs in the key store, so every copy of
an erased record's wrapped key (a WAL frame, a heap page, a backup) can no longer be
opened (docs/decisions/0038-erasure-destroys-key-store-keys.md). Rotating a tenant's KEK
re-wraps the data keys and leaves the ciphertexts untouched.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ledger.vault_errors import ContentIntegrityError, KeyUnavailableError

DATA_KEY_BYTES = 32
NONCE_BYTES = 12
# The four retained fields, in a fixed order.
FIELDS = ("prompt", "output", "input_salt", "output_salt")
CONTENT_AAD_PREFIX = b"audit-ledger/vault-content/v1"
WRAP_AAD_PREFIX = b"audit-ledger/vault-data-key/v1"
RECEIPT_WRAP_AAD_PREFIX = b"audit-ledger/receipt-key/v1"
RECEIPT_AAD_PREFIX = b"audit-ledger/receipt/v1"
RECEIPT_FINGERPRINT_LABEL = b"audit-ledger/receipt-fingerprint/v1"
RECEIPT_FINGERPRINT_LABEL_2 = b"audit-ledger/receipt-fingerprint/v2"
# A stored fingerprint under a receipt's own key starts with this byte (33 bytes in all);
# one under the tenant's subject key (decision 0062) is the bare 32-byte MAC.
RECEIPT_FINGERPRINT_2 = b"\x02"
RECEIPT_FINGERPRINT_BYTES_0062 = 32
SUBJECT_FIELD = "subject"
SUBJECT_PREFIX = "hmac-sha256:"


class KeyEncryptionKeys(Protocol):
    """Per-tenant key-encryption keys and subject keys, held in a key store outside the
    database. The default is a local keyring file; ``ledger.store.kms`` keeps the same
    file with every key sealed by a per-tenant AWS KMS key."""

    def wrap(self, tenant: str, data_key: bytes, context: bytes) -> tuple[str, bytes]:
        """Wrap ``data_key`` under the tenant's current KEK; returns (KEK id, wrapped)."""
        ...

    def unwrap(self, tenant: str, kek_id: str, wrapped: bytes, context: bytes) -> bytes:
        """The data key; raises ``KeyUnavailableError`` when the KEK is gone and
        ``cryptography.exceptions.InvalidTag`` when ``wrapped`` does not open."""
        ...

    def current_kek_id(self, tenant: str) -> str:
        """The id of the KEK new data keys are wrapped with (created on first use)."""
        ...

    def subject_key(self, tenant: str) -> bytes:
        """The tenant's current key for hashing data-subject ids (created on first use)."""
        ...

    def subject_keys(self, tenant: str) -> list[bytes]:
        """Every subject key a stored hash may still use: the current one first."""
        ...

    def rotate(self, tenant: str) -> str:
        """Make a new KEK current for the tenant; returns its id (old ones still unwrap)."""
        ...

    def replace(self, tenant: str, kek_ids: Collection[str]) -> str:
        """A new KEK to take over from ``kek_ids`` (current if the current one is among
        them); ``kek_ids`` are marked doomed until ``destroy``. Returns the new id."""
        ...

    def doomed(self, tenant: str) -> list[str]:
        """KEKs marked by ``replace`` and not destroyed yet (a crash came between)."""
        ...

    def destroy(self, tenant: str, kek_ids: Collection[str]) -> list[str]:
        """Destroy these KEKs (never the current one) and unmark them; returns the ids
        destroyed."""
        ...

    def retire(self, tenant: str, keep: Collection[str] = ()) -> list[str]:
        """Destroy the tenant's KEKs other than the current one and ``keep``; returns
        their ids."""
        ...

    def rotate_subject_key(self, tenant: str) -> bytes:
        """A new current subject key; the old ones stay in ``subject_keys`` until
        ``retire_subject_keys``."""
        ...

    def retire_subject_keys(self, tenant: str) -> int:
        """Destroy every subject key but the current one; returns how many."""
        ...


def _aad(prefix: bytes, *parts: str | bytes) -> bytes:
    # Length-prefixed parts: no two different tuples give the same associated data.
    out = bytearray(prefix)
    for part in parts:
        raw = part.encode("utf-8") if isinstance(part, str) else part
        out += len(raw).to_bytes(4, "big") + raw
    return bytes(out)


def content_aad(record_id: str, leaf_hash: bytes, field: str) -> bytes:
    return _aad(CONTENT_AAD_PREFIX, record_id, leaf_hash, field)


def wrap_context(tenant: str, record_id: str) -> bytes:
    """Associated data of a wrapped data key: it opens for this tenant's record only."""
    return _aad(WRAP_AAD_PREFIX, tenant, record_id)


def receipt_wrap_context(tenant: str, idempotency_key: str) -> bytes:
    """Associated data of a stored answer's wrapped key: it opens for this key only."""
    return _aad(RECEIPT_WRAP_AAD_PREFIX, tenant, idempotency_key)


def receipt_aad(tenant: str, idempotency_key: str) -> bytes:
    return _aad(RECEIPT_AAD_PREFIX, tenant, idempotency_key)


def aead_encrypt(key: bytes, plaintext: bytes, aad: bytes) -> bytes:
    """``nonce || ciphertext || tag`` under AES-256-GCM with a random 96-bit nonce."""
    nonce = os.urandom(NONCE_BYTES)
    return nonce + AESGCM(key).encrypt(nonce, plaintext, aad)


def aead_decrypt(key: bytes, blob: bytes, aad: bytes) -> bytes:
    """Inverse of ``aead_encrypt``; raises ``InvalidTag`` on any change."""
    if len(blob) < NONCE_BYTES + 16:
        raise InvalidTag()
    return AESGCM(key).decrypt(blob[:NONCE_BYTES], blob[NONCE_BYTES:], aad)


@dataclass(frozen=True)
class SealedContent:
    """What the vault stores for one record (never the plaintext nor the data key)."""

    kek_id: str
    wrapped_key: bytes
    ciphertexts: Mapping[str, bytes]  # field name -> nonce || ciphertext || tag


@dataclass(frozen=True)
class Content:
    """A record's retained content, decrypted."""

    prompt: str
    output: str
    input_salt: bytes
    output_salt: bytes


def seal_content(keks: KeyEncryptionKeys, tenant: str, record_id: str, leaf_hash: bytes,
                 content: Content, subject: str | None = None) -> SealedContent:
    """Encrypt one record's content (and its data-subject id, if any, so the subject key
    can be rotated later) under a fresh data key wrapped by the tenant's KEK."""
    data_key = secrets.token_bytes(DATA_KEY_BYTES)
    plain = {"prompt": content.prompt.encode("utf-8"), "output": content.output.encode("utf-8"),
             "input_salt": content.input_salt, "output_salt": content.output_salt}
    names = list(FIELDS)
    if subject is not None:
        plain[SUBJECT_FIELD] = subject.encode("utf-8")
        names.append(SUBJECT_FIELD)
    ciphertexts = {name: aead_encrypt(data_key, plain[name], content_aad(record_id, leaf_hash,
                                                                          name))
                   for name in names}
    kek_id, wrapped = keks.wrap(tenant, data_key, wrap_context(tenant, record_id))
    return SealedContent(kek_id, wrapped, ciphertexts)


def _data_key(keks: KeyEncryptionKeys, tenant: str, record_id: str, kek_id: str,
              wrapped: bytes) -> bytes:
    try:
        return keks.unwrap(tenant, kek_id, wrapped, wrap_context(tenant, record_id))
    except InvalidTag as exc:
        raise ContentIntegrityError(record_id, "data_key", "the wrapped data key does not "
                                    "open for this tenant and record") from exc


def open_subject(keks: KeyEncryptionKeys, tenant: str, record_id: str, leaf_hash: bytes,
                 kek_id: str, wrapped: bytes, blob: bytes) -> str:
    """The data-subject id stored encrypted beside a record's content."""
    data_key = _data_key(keks, tenant, record_id, kek_id, wrapped)
    try:
        raw = aead_decrypt(data_key, blob, content_aad(record_id, leaf_hash, SUBJECT_FIELD))
    except InvalidTag as exc:
        raise ContentIntegrityError(record_id, SUBJECT_FIELD, "the ciphertext does not "
                                    "authenticate under this record") from exc
    return raw.decode("utf-8")


def open_content(keks: KeyEncryptionKeys, tenant: str, record_id: str, leaf_hash: bytes,
                 sealed: SealedContent) -> Content:
    """Decrypt; any moved, swapped or altered byte raises ``ContentIntegrityError``."""
    data_key = _data_key(keks, tenant, record_id, sealed.kek_id, sealed.wrapped_key)
    plain: dict[str, bytes] = {}
    for name in FIELDS:
        blob = sealed.ciphertexts.get(name)
        if blob is None:
            raise ContentIntegrityError(record_id, name, "the ciphertext is missing")
        try:
            plain[name] = aead_decrypt(data_key, blob, content_aad(record_id, leaf_hash, name))
        except InvalidTag as exc:
            raise ContentIntegrityError(
                record_id, name, "the ciphertext does not authenticate under this record's "
                "id and leaf hash (altered, or moved from another record or field)") from exc
    try:
        return Content(plain["prompt"].decode("utf-8"), plain["output"].decode("utf-8"),
                       plain["input_salt"], plain["output_salt"])
    except UnicodeDecodeError as exc:  # authenticated but not text: written by a bug
        raise ContentIntegrityError(record_id, "prompt", "decrypted text is not UTF-8") from exc


def rewrap(keks: KeyEncryptionKeys, tenant: str, record_id: str, kek_id: str,
           wrapped: bytes, to_kek: str | None = None) -> tuple[str, bytes]:
    """Unwrap with the old KEK and wrap with ``to_kek`` (default: the current one);
    content is not touched."""
    return rewrap_under(keks, tenant, wrap_context(tenant, record_id), record_id, kek_id,
                        wrapped, to_kek)


def rewrap_under(keks: KeyEncryptionKeys, tenant: str, context: bytes, what: str,
                 kek_id: str, wrapped: bytes, to_kek: str | None) -> tuple[str, bytes]:
    """Re-wrap one wrapped key (``what`` names it in errors)."""
    try:
        data_key = keks.unwrap(tenant, kek_id, wrapped, context)
    except InvalidTag as exc:
        raise ContentIntegrityError(what, "data_key", "the wrapped key does not open for "
                                    "this tenant and owner") from exc
    if to_kek is None:
        return keks.wrap(tenant, data_key, context)
    return to_kek, aead_encrypt(keks_key(keks, tenant, to_kek), data_key, context)


def keks_key(keks: KeyEncryptionKeys, tenant: str, kek_id: str) -> bytes:
    """The raw KEK ``kek_id`` (only ``KeyringData`` and subclasses expose it)."""
    if not isinstance(keks, KeyringData):
        raise KeyUnavailableError(tenant, kek_id, "this key store cannot wrap under a "
                                  "chosen key-encryption key")
    return keks.kek(tenant, kek_id)


def seal_receipt(keks: KeyEncryptionKeys, tenant: str, idempotency_key: str,
                 plaintext: bytes) -> tuple[str, bytes, bytes]:
    """A stored answer encrypted under a fresh key wrapped by the tenant's current KEK:
    (KEK id, wrapped key, ciphertext). It dies with the KEK an erasure destroys."""
    key = secrets.token_bytes(DATA_KEY_BYTES)
    ciphertext = aead_encrypt(key, plaintext, receipt_aad(tenant, idempotency_key))
    kek_id, wrapped = keks.wrap(tenant, key, receipt_wrap_context(tenant, idempotency_key))
    return kek_id, wrapped, ciphertext


def open_receipt(keks: KeyEncryptionKeys, tenant: str, idempotency_key: str, kek_id: str,
                 wrapped: bytes, ciphertext: bytes) -> bytes:
    """Inverse of ``seal_receipt``; ``InvalidTag`` or ``KeyUnavailableError`` if it cannot
    be opened."""
    key = keks.unwrap(tenant, kek_id, wrapped, receipt_wrap_context(tenant, idempotency_key))
    return aead_decrypt(key, ciphertext, receipt_aad(tenant, idempotency_key))


def receipt_fingerprint(subject_key: bytes, tenant: str, idempotency_key: str,
                        request_digest: bytes) -> bytes:
    """What a receipt stores to tell a retry's body from another one: an HMAC-SHA256 of
    the request's digest under a key derived from the tenant's subject key (held in the
    key store, never in the database), bound to the tenant and the key. Without the
    subject key, guessing the body from it is not possible (decision 0062)."""
    mac_key = hmac.new(subject_key, RECEIPT_FINGERPRINT_LABEL, hashlib.sha256).digest()
    message = _aad(RECEIPT_FINGERPRINT_LABEL, tenant, idempotency_key, request_digest)
    return hmac.new(mac_key, message, hashlib.sha256).digest()


def new_receipt_key(keks: KeyEncryptionKeys, tenant: str, idempotency_key: str
                    ) -> tuple[str, bytes, bytes]:
    """A receipt's own data key, made when its Idempotency-Key is claimed: (KEK id,
    wrapped key, the key). Its fingerprint is a MAC under it and its answer is sealed
    with it, so both die with the KEK an erasure of its record destroys (decision 0068)."""
    key = secrets.token_bytes(DATA_KEY_BYTES)
    kek_id, wrapped = keks.wrap(tenant, key, receipt_wrap_context(tenant, idempotency_key))
    return kek_id, wrapped, key


def open_receipt_key(keks: KeyEncryptionKeys, tenant: str, idempotency_key: str,
                     kek_id: str, wrapped: bytes) -> bytes:
    """A receipt's data key (``new_receipt_key``); ``KeyUnavailableError`` or
    ``InvalidTag`` once its KEK is gone or the wrapped key was changed."""
    return keks.unwrap(tenant, kek_id, wrapped, receipt_wrap_context(tenant, idempotency_key))


def receipt_fingerprint_under(receipt_key: bytes, tenant: str, idempotency_key: str,
                              request_digest: bytes) -> bytes:
    """A receipt's stored fingerprint under its own data key: ``RECEIPT_FINGERPRINT_2``
    and an HMAC-SHA256 of the request's digest, bound to the tenant and the key, under a
    MAC key derived from the receipt's key (never the key that seals its answer)."""
    mac_key = hmac.new(receipt_key, RECEIPT_FINGERPRINT_LABEL_2, hashlib.sha256).digest()
    message = _aad(RECEIPT_FINGERPRINT_LABEL_2, tenant, idempotency_key, request_digest)
    return RECEIPT_FINGERPRINT_2 + hmac.new(mac_key, message, hashlib.sha256).digest()


def seal_receipt_under(receipt_key: bytes, tenant: str, idempotency_key: str,
                       plaintext: bytes) -> bytes:
    """A stored answer sealed with its receipt's own data key (``new_receipt_key``)."""
    return aead_encrypt(receipt_key, plaintext, receipt_aad(tenant, idempotency_key))


def subject_hash(key: bytes, subject: str) -> str:
    """The keyed hash a data-subject id is stored as (never the id itself)."""
    return SUBJECT_PREFIX + hmac.new(key, subject.encode("utf-8"), hashlib.sha256).hexdigest()


class KeyringData:
    """In-memory KEKs and subject keys per tenant: the logic of the keyring file, without
    the file (tests use it directly; ``ledger.store.keyring`` persists it).

    ``epoch_s`` > 0 starts a new current KEK once the current one is that old, so an
    erasure re-wraps only the records of the epochs it touches, not a tenant's whole
    history.
    """

    def __init__(self, tenants: dict[str, dict[str, object]] | None = None,
                 epoch_s: float = 0.0, clock: Callable[[], float] = time.time) -> None:
        # tenant -> {"current": kek id, "since": when it became current (POSIX),
        #            "keks": {kek id: key}, "subject_key": key,
        #            "previous_subject_keys": [key], "doomed": [kek id]}
        self.tenants: dict[str, dict[str, object]] = tenants if tenants is not None else {}
        self.epoch_s = epoch_s
        self.clock = clock

    def _tenant(self, tenant: str, create: bool) -> dict[str, object]:
        entry = self.tenants.get(tenant)
        if entry is None:
            if not create:
                raise KeyUnavailableError(tenant, "-", "the keyring has no keys for this tenant")
            kek_id = new_kek_id()
            entry = {"current": kek_id, "since": self.clock(),
                     "keks": {kek_id: secrets.token_bytes(32)},
                     "subject_key": secrets.token_bytes(32), "previous_subject_keys": [],
                     "doomed": []}
            self.tenants[tenant] = entry
            self.changed()
        return entry

    def changed(self) -> None:
        """Hook for a persistent subclass: the keys were changed."""

    def _keks(self, tenant: str, create: bool = False) -> dict[str, bytes]:
        keks = self._tenant(tenant, create)["keks"]
        assert isinstance(keks, dict)
        return keks

    def _list(self, tenant: str, name: str) -> list[Any]:
        entry = self._tenant(tenant, create=False)
        value = entry.setdefault(name, [])
        assert isinstance(value, list)
        return value

    def kek(self, tenant: str, kek_id: str) -> bytes:
        key = self._keks(tenant).get(kek_id)
        if key is None:
            raise KeyUnavailableError(tenant, kek_id, "this key-encryption key is not in "
                                      "the keyring (destroyed, retired or never here)")
        return key

    def kek_ids(self, tenant: str) -> list[str]:
        return list(self._keks(tenant)) if tenant in self.tenants else []

    def current_kek_id(self, tenant: str) -> str:
        return str(self._tenant(tenant, create=True)["current"])

    def epoch_over(self, tenant: str) -> bool:
        """The current KEK is older than the epoch: the next wrap starts a new one."""
        entry = self.tenants.get(tenant)
        if entry is None or self.epoch_s <= 0:
            return False
        since = entry.get("since")
        return not isinstance(since, int | float) or self.clock() - since >= self.epoch_s

    def wrap(self, tenant: str, data_key: bytes, context: bytes) -> tuple[str, bytes]:
        if self.epoch_over(tenant):
            self.rotate(tenant)  # a subclass persists it
        kek_id = self.current_kek_id(tenant)
        return kek_id, aead_encrypt(self.kek(tenant, kek_id), data_key, context)

    def unwrap(self, tenant: str, kek_id: str, wrapped: bytes, context: bytes) -> bytes:
        if tenant not in self.tenants:
            raise KeyUnavailableError(tenant, kek_id, "the keyring has no keys for this "
                                      "tenant")
        return aead_decrypt(self.kek(tenant, kek_id), wrapped, context)

    def subject_key(self, tenant: str) -> bytes:
        key = self._tenant(tenant, create=True)["subject_key"]
        assert isinstance(key, bytes)
        return key

    def subject_keys(self, tenant: str) -> list[bytes]:
        current = KeyringData.subject_key(self, tenant)
        return [current, *self._list(tenant, "previous_subject_keys")]

    # Public methods call these, never each other: a subclass wraps each public one in
    # its file lock, which must not be taken twice.

    def rotate(self, tenant: str) -> str:
        """Make a new KEK current; old ones stay until ``retire`` (after re-wrapping)."""
        return self._rotate(tenant)

    def _rotate(self, tenant: str) -> str:
        entry = self._tenant(tenant, create=True)
        kek_id = new_kek_id()
        self._keks(tenant)[kek_id] = secrets.token_bytes(32)
        entry["current"] = kek_id
        entry["since"] = self.clock()
        self.changed()
        return kek_id

    def replace(self, tenant: str, kek_ids: Collection[str]) -> str:
        entry = self._tenant(tenant, create=True)
        if entry["current"] in kek_ids:
            new_id = self._rotate(tenant)
        else:
            new_id = new_kek_id()
            self._keks(tenant)[new_id] = secrets.token_bytes(32)
        doomed = self._list(tenant, "doomed")
        doomed.extend(k for k in kek_ids if k not in doomed and k in self._keks(tenant))
        self.changed()
        return new_id

    def doomed(self, tenant: str) -> list[str]:
        return list(self._list(tenant, "doomed")) if tenant in self.tenants else []

    def destroy(self, tenant: str, kek_ids: Collection[str]) -> list[str]:
        return self._destroy(tenant, kek_ids)

    def _destroy(self, tenant: str, kek_ids: Collection[str]) -> list[str]:
        if tenant not in self.tenants:
            return []
        entry = self._tenant(tenant, create=False)
        keks = self._keks(tenant)
        gone = [k for k in kek_ids if k in keks and k != entry["current"]]
        for kek_id in gone:
            del keks[kek_id]
        doomed = self._list(tenant, "doomed")
        entry["doomed"] = [k for k in doomed if k not in kek_ids]
        if gone or doomed != entry["doomed"]:
            self.changed()
        return gone

    def retire(self, tenant: str, keep: Collection[str] = ()) -> list[str]:
        """Forget every KEK of the tenant but the current one and ``keep``."""
        entry = self._tenant(tenant, create=False)
        old = [k for k in self._keks(tenant) if k != entry["current"] and k not in keep]
        return self._destroy(tenant, old)

    def rotate_subject_key(self, tenant: str) -> bytes:
        entry = self._tenant(tenant, create=True)
        previous = self._list(tenant, "previous_subject_keys")
        previous.insert(0, KeyringData.subject_key(self, tenant))
        key = secrets.token_bytes(32)
        entry["subject_key"] = key
        self.changed()
        return key

    def retire_subject_keys(self, tenant: str) -> int:
        if tenant not in self.tenants:
            return 0
        previous = self._list(tenant, "previous_subject_keys")
        count = len(previous)
        if count:
            self._tenant(tenant, create=False)["previous_subject_keys"] = []
            self.changed()
        return count


def new_kek_id() -> str:
    return "kek-" + secrets.token_hex(8)
