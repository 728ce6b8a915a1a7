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

Erasing a record destroys its wrapped data key: the ciphertexts cannot be opened again.
Rotating a tenant's KEK re-wraps the data keys and leaves the ciphertexts untouched.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ledger.vault_errors import ContentIntegrityError, KeyUnavailableError

DATA_KEY_BYTES = 32
NONCE_BYTES = 12
# The four retained fields, in a fixed order.
FIELDS = ("prompt", "output", "input_salt", "output_salt")
CONTENT_AAD_PREFIX = b"audit-ledger/vault-content/v1"
WRAP_AAD_PREFIX = b"audit-ledger/vault-data-key/v1"
SUBJECT_PREFIX = "hmac-sha256:"


class KeyEncryptionKeys(Protocol):
    """Per-tenant key-encryption keys. The default is a local keyring file; a KMS client
    (Encrypt/Decrypt with an encryption context) fits the same four methods."""

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
        """The tenant's key for hashing data-subject ids (created on first use)."""
        ...

    def rotate(self, tenant: str) -> str:
        """Make a new KEK current for the tenant; returns its id (old ones still unwrap)."""
        ...

    def retire(self, tenant: str, keep: Collection[str] = ()) -> list[str]:
        """Destroy the tenant's KEKs other than the current one and ``keep``; returns
        their ids."""
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
                 content: Content) -> SealedContent:
    """Encrypt one record's content under a fresh data key wrapped by the tenant's KEK."""
    data_key = secrets.token_bytes(DATA_KEY_BYTES)
    plain = {"prompt": content.prompt.encode("utf-8"), "output": content.output.encode("utf-8"),
             "input_salt": content.input_salt, "output_salt": content.output_salt}
    ciphertexts = {name: aead_encrypt(data_key, plain[name], content_aad(record_id, leaf_hash,
                                                                          name))
                   for name in FIELDS}
    kek_id, wrapped = keks.wrap(tenant, data_key, wrap_context(tenant, record_id))
    return SealedContent(kek_id, wrapped, ciphertexts)


def open_content(keks: KeyEncryptionKeys, tenant: str, record_id: str, leaf_hash: bytes,
                 sealed: SealedContent) -> Content:
    """Decrypt; any moved, swapped or altered byte raises ``ContentIntegrityError``."""
    try:
        data_key = keks.unwrap(tenant, sealed.kek_id, sealed.wrapped_key,
                               wrap_context(tenant, record_id))
    except InvalidTag as exc:
        raise ContentIntegrityError(record_id, "data_key", "the wrapped data key does not "
                                    "open for this tenant and record") from exc
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
           wrapped: bytes) -> tuple[str, bytes]:
    """Unwrap with the old KEK and wrap with the current one; content is not touched."""
    context = wrap_context(tenant, record_id)
    try:
        data_key = keks.unwrap(tenant, kek_id, wrapped, context)
    except InvalidTag as exc:
        raise ContentIntegrityError(record_id, "data_key", "the wrapped data key does not "
                                    "open for this tenant and record") from exc
    return keks.wrap(tenant, data_key, context)


def subject_hash(key: bytes, subject: str) -> str:
    """The keyed hash a data-subject id is stored as (never the id itself)."""
    return SUBJECT_PREFIX + hmac.new(key, subject.encode("utf-8"), hashlib.sha256).hexdigest()


class KeyringData:
    """In-memory KEKs and subject keys per tenant: the logic of the keyring file, without
    the file (tests use it directly; ``ledger.store.keyring`` persists it)."""

    def __init__(self, tenants: dict[str, dict[str, object]] | None = None) -> None:
        # tenant -> {"current": kek id, "keks": {kek id: key}, "subject_key": key}
        self.tenants: dict[str, dict[str, object]] = tenants if tenants is not None else {}

    def _tenant(self, tenant: str, create: bool) -> dict[str, object]:
        entry = self.tenants.get(tenant)
        if entry is None:
            if not create:
                raise KeyUnavailableError(tenant, "-", "the keyring has no keys for this tenant")
            kek_id = new_kek_id()
            entry = {"current": kek_id, "keks": {kek_id: secrets.token_bytes(32)},
                     "subject_key": secrets.token_bytes(32)}
            self.tenants[tenant] = entry
            self.changed()
        return entry

    def changed(self) -> None:
        """Hook for a persistent subclass: the keys were changed."""

    def _keks(self, tenant: str, create: bool = False) -> dict[str, bytes]:
        keks = self._tenant(tenant, create)["keks"]
        assert isinstance(keks, dict)
        return keks

    def current_kek_id(self, tenant: str) -> str:
        return str(self._tenant(tenant, create=True)["current"])

    def wrap(self, tenant: str, data_key: bytes, context: bytes) -> tuple[str, bytes]:
        kek_id = self.current_kek_id(tenant)
        return kek_id, aead_encrypt(self._keks(tenant)[kek_id], data_key, context)

    def unwrap(self, tenant: str, kek_id: str, wrapped: bytes, context: bytes) -> bytes:
        kek = self._keks(tenant).get(kek_id)
        if kek is None:
            raise KeyUnavailableError(tenant, kek_id, "this key-encryption key is not in "
                                      "the keyring (retired or never here)")
        return aead_decrypt(kek, wrapped, context)

    def subject_key(self, tenant: str) -> bytes:
        key = self._tenant(tenant, create=True)["subject_key"]
        assert isinstance(key, bytes)
        return key

    def rotate(self, tenant: str) -> str:
        """Make a new KEK current; old ones stay until ``retire`` (after re-wrapping)."""
        entry = self._tenant(tenant, create=True)
        kek_id = new_kek_id()
        self._keks(tenant)[kek_id] = secrets.token_bytes(32)
        entry["current"] = kek_id
        self.changed()
        return kek_id

    def retire(self, tenant: str, keep: Collection[str] = ()) -> list[str]:
        """Forget every KEK of the tenant but the current one and ``keep``."""
        entry = self._tenant(tenant, create=False)
        keks = self._keks(tenant)
        old = [k for k in keks if k != entry["current"] and k not in keep]
        for kek_id in old:
            del keks[kek_id]
        if old:
            self.changed()
        return old


def new_kek_id() -> str:
    return "kek-" + secrets.token_hex(8)
