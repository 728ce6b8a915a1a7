"""Errors of retained content: each carries its facts; ``ledger.error_map`` decides what
they mean for an HTTP status and a CLI exit code."""

from __future__ import annotations

from ledger.errors import BackendError, LedgerError, VerificationError


class ContentIntegrityError(VerificationError):
    """A ciphertext does not authenticate under its record id, leaf hash and field."""

    def __init__(self, record_id: str, field: str, reason: str) -> None:
        super().__init__(f"content of record {record_id} ({field}) failed to decrypt: {reason}")
        self.record_id = record_id
        self.field = field


class KeyUnavailableError(BackendError):
    """A tenant's key-encryption key is not in the keyring (or the KMS cannot be reached)."""

    def __init__(self, tenant: str, kek_id: str, reason: str) -> None:
        super().__init__(f"key-encryption key {kek_id} of tenant {tenant!r}: {reason}")
        self.tenant = tenant
        self.kek_id = kek_id


class ContentNotRetainedError(LedgerError):
    """No content was kept for this record (the tenant keeps commitments only)."""

    def __init__(self, record_id: str) -> None:
        super().__init__(f"no content is retained for record {record_id}")
        self.record_id = record_id


class ContentErasedError(LedgerError):
    """The record's content was erased (its data key destroyed)."""

    def __init__(self, record_id: str, erased_at: str, erasure_record_id: str | None) -> None:
        super().__init__(f"the content of record {record_id} was erased at {erased_at} "
                         f"under erasure record {erasure_record_id}")
        self.record_id = record_id
        self.erased_at = erased_at
        self.erasure_record_id = erasure_record_id


class LegalHoldError(LedgerError):
    """Erasure refused: a legal hold covers the tenant or one of the records."""

    def __init__(self, hold_id: str, scope: str, reason: str) -> None:
        super().__init__(f"erasure refused: legal hold {hold_id} on {scope} ({reason})")
        self.hold_id = hold_id
        self.scope = scope
        self.reason = reason


class ContentNotKeptError(BackendError):
    """The record is durable, but the content its tenant's policy keeps could not be
    stored: the answer is withheld (the message is safe to show a client)."""

    def __init__(self, record_id: str | None = None) -> None:
        super().__init__("the record was committed, but the content vault could not keep "
                         "its content as the tenant's policy requires, so no output is "
                         "returned")
        self.record_id = record_id  # the committed record, once known
