"""Errors of the audit ledger, grouped by who is at fault.

- ``VerificationError``: the evidence does not hold up (someone tampered, or lies).
- ``BackendError``: a store, server or anchor could not be reached or refused to work.
- ``InvalidInputError``: the caller sent something malformed; it names the field.

Every error carries its facts as attributes; messages are for people.
"""

from __future__ import annotations


class LedgerError(Exception):
    """Root of every error this project raises on purpose."""

    def diagnostics(self) -> str:
        """A one-paragraph explanation for a person reading a report."""
        return f"{type(self).__name__}: {self}"


class InvalidInputError(LedgerError, ValueError):
    """Input rejected before anything was done; ``field`` names the offending part."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.reason = message


# --- verification failures -------------------------------------------------------------


class VerificationError(LedgerError):
    """The evidence does not prove what it claims."""


class RootMismatchError(VerificationError):
    """A proof led to a different root than the one it was checked against."""

    def __init__(self, expected: bytes, calculated: bytes) -> None:
        super().__init__(
            f"root mismatch: expected {expected.hex()}, calculated {calculated.hex()}"
        )
        self.expected = expected
        self.calculated = calculated


class MalformedProofError(VerificationError):
    """A proof has the wrong number of hashes or a hash of the wrong length."""


class OutOfRangeError(VerificationError):
    """An index or tree size is outside what the proof can speak about."""


class CanonicalFormError(VerificationError, InvalidInputError):
    """Bytes that are not the canonical (RFC 8785) form of a JSON value."""

    def __init__(self, message: str, field: str = "record") -> None:
        InvalidInputError.__init__(self, field, message)


class LeafBindingError(VerificationError):
    """A v2 envelope and a body (or a record and the environment leaf it names) that do
    not belong together: a digest, a time, a tenant tag or an index disagrees."""


class SignatureError(VerificationError):
    """A signed note has no valid signature by the expected key."""


class CheckpointFormatError(VerificationError):
    """A checkpoint note does not follow the C2SP tlog-checkpoint format."""


class RollbackError(VerificationError):
    """A checkpoint is smaller than one already trusted."""

    def __init__(self, trusted_size: int, offered_size: int) -> None:
        super().__init__(
            f"rollback: trusted tree size {trusted_size}, offered {offered_size}"
        )
        self.trusted_size = trusted_size
        self.offered_size = offered_size


class ForkError(VerificationError):
    """Two checkpoints of the same size with different roots: a split view."""

    def __init__(self, size: int, trusted_root: bytes, offered_root: bytes) -> None:
        super().__init__(
            f"fork at tree size {size}: trusted root {trusted_root.hex()}, "
            f"offered {offered_root.hex()}"
        )
        self.size = size
        self.trusted_root = trusted_root
        self.offered_root = offered_root


class ModelIntegrityError(VerificationError):
    """Model files do not match the pinned manifest; ``path`` names the first culprit."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path


# --- backend failures ------------------------------------------------------------------


class BackendError(LedgerError):
    """A store, server or anchor failed to do its part."""


class BackendUnavailableError(BackendError):
    """A backend could not be reached at all."""


class SequencerBusyError(BackendUnavailableError):
    """The ``tree_state`` row (the sequencer) stayed locked by another session for longer
    than this caller chose to wait; a seal retries at the next tick."""


class DuplicateRecordError(BackendError):
    """A different record already holds this record id."""


class BackendConfigurationError(BackendError):
    """A backend refuses this service's configuration (e.g. a Fabric channel or chaincode
    the gateway does not know): retrying will not help until an operator fixes it.

    The message is ours and safe to show (``/readyz``); ``detail`` is the backend's own
    text, for logs and the CLI's diagnostics."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail

    def diagnostics(self) -> str:
        tail = f" (the backend said: {self.detail})" if self.detail else ""
        return f"{type(self).__name__}: {self}{tail}"


class LeafTooLargeError(InvalidInputError):
    """A leaf whose ``part`` (``entry``: the bytes the tree hashes; ``body``: a v2 body)
    has ``size`` bytes, more than the ``limit`` a tile bundle entry can hold. Refused
    before it is written: the log would hold a leaf its tiles can never publish."""

    def __init__(self, part: str, size: int, limit: int) -> None:
        super().__init__("leaf", f"its {part} has {size} bytes, more than the {limit} a "
                                 "tile bundle entry holds")
        self.part = part
        self.size = size
        self.limit = limit


class LogIdentityError(InvalidInputError):
    """A replica's signing key or origin is not the log's: it must not start.

    ``field`` names the setting to fix (``AUDIT_LEDGER_LOG_KEY_PATH``,
    ``AUDIT_LEDGER_LOG_SIGNING_KEY`` or ``AUDIT_LEDGER_ORIGIN``); a usage error (exit 2).
    """


class WorkerDiedError(BackendUnavailableError):
    """A background worker of the service (writer, batcher, integrator, anchor worker)
    stopped for good; ``worker`` names it. The service answers 503 and exits."""

    def __init__(self, worker: str) -> None:
        super().__init__(f"the {worker} worker has stopped; the service is restarting")
        self.worker = worker
