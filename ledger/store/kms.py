"""AWS KMS as the guard of the key store: every key in the keyring file is sealed by the
tenant's KMS key (Encrypt/Decrypt with an encryption context naming tenant and key id).

The keys that encrypt content (KEKs wrapping per-record data keys) still live in the
keyring file, only sealed. An erasure destroys the KEK there at once; it never waits
for a KMS key's deletion (7 to 30 days on AWS). Settings:

- ``AUDIT_LEDGER_KEK_PROVIDER=aws-kms``
- ``AUDIT_LEDGER_KMS_KEY_ID``: a key id, ARN or alias; ``{tenant}`` in it is replaced by
  the tenant (``alias/audit-ledger-{tenant}``: one KMS key per tenant)
- ``AUDIT_LEDGER_KMS_REGION`` and ``AUDIT_LEDGER_KMS_ENDPOINT`` (optional; credentials
  come from boto3's usual chain: environment, profile, instance role)
"""

from __future__ import annotations

import os
from typing import Any

from ledger.errors import InvalidInputError
from ledger.vault_errors import KeyUnavailableError

CONTEXT_TENANT = "audit-ledger:tenant"
CONTEXT_KEY = "audit-ledger:key-id"


class AwsKmsSealer:
    """``KeySealer`` over AWS KMS (boto3)."""

    name = "aws-kms"

    def __init__(self, key_id: str, client: Any) -> None:
        if not key_id:
            raise InvalidInputError("AUDIT_LEDGER_KMS_KEY_ID", "is required with "
                                    "AUDIT_LEDGER_KEK_PROVIDER=aws-kms")
        self.key_id = key_id
        self.client = client

    @classmethod
    def from_env(cls) -> AwsKmsSealer:
        import boto3

        client = boto3.client("kms",
                              region_name=os.environ.get("AUDIT_LEDGER_KMS_REGION") or None,
                              endpoint_url=os.environ.get("AUDIT_LEDGER_KMS_ENDPOINT") or None)
        return cls(os.environ.get("AUDIT_LEDGER_KMS_KEY_ID", ""), client)

    def key_for(self, tenant: str) -> str:
        return self.key_id.replace("{tenant}", tenant)

    def seal(self, tenant: str, key_id: str, key: bytes) -> bytes:
        try:
            answer = self.client.encrypt(KeyId=self.key_for(tenant), Plaintext=key,
                                         EncryptionContext=_context(tenant, key_id))
        except Exception as exc:
            raise _unavailable(tenant, key_id, exc) from exc
        return bytes(answer["CiphertextBlob"])

    def open(self, tenant: str, key_id: str, blob: bytes) -> bytes:
        try:
            answer = self.client.decrypt(KeyId=self.key_for(tenant), CiphertextBlob=blob,
                                         EncryptionContext=_context(tenant, key_id))
        except Exception as exc:
            raise _unavailable(tenant, key_id, exc) from exc
        return bytes(answer["Plaintext"])


def _context(tenant: str, key_id: str) -> dict[str, str]:
    return {CONTEXT_TENANT: tenant, CONTEXT_KEY: key_id}


def _unavailable(tenant: str, key_id: str, exc: Exception) -> KeyUnavailableError:
    # The code only (e.g. AccessDeniedException): no request or key material in messages.
    code = getattr(exc, "response", {}).get("Error", {}).get("Code") or type(exc).__name__
    return KeyUnavailableError(tenant, key_id, f"AWS KMS refused or is unreachable ({code})")
