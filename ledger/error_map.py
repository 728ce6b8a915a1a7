"""The one error map: which error class means which CLI exit code and which HTTP status.

Both the command line (``audit_cli.main``) and the endpoint (``inference_wrapper.server``)
decide through these two functions, so an error means the same thing everywhere.

Exit codes (documented in the README):

- 0 verified / success
- 1 a verification check failed (the message names the check)
- 2 usage error: the caller's input is wrong (names the option or field)
- 3 the evidence source or backend could not be reached
- 4 internal error: a bug; a short message and where the details are, never a traceback
"""

from __future__ import annotations

from ledger.errors import (
    BackendConfigurationError,
    BackendError,
    BackendUnavailableError,
    DuplicateRecordError,
    InvalidInputError,
    LedgerError,
    VerificationError,
)
from ledger.vault_errors import ContentErasedError, ContentNotRetainedError, LegalHoldError

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_INTERNAL = 4


def exit_code_for(error: BaseException) -> int:
    """The CLI exit code for an error that reached the top of a command."""
    # Order matters: CanonicalFormError is both a verification and an input error, and
    # a verifier shown non-canonical bytes has found a failed check, not a usage error.
    if isinstance(error, VerificationError):
        return EXIT_CHECK_FAILED
    if isinstance(error, InvalidInputError | BackendConfigurationError):
        return EXIT_USAGE  # the caller's options name something the backend does not have
    if isinstance(error, BackendError):
        return EXIT_UNREACHABLE
    if isinstance(error, LedgerError):
        # Includes a legal hold refusing an erasure and content that is erased or was
        # never kept: the asked-for condition does not hold, the message names why.
        return EXIT_CHECK_FAILED
    return EXIT_INTERNAL


def http_status_for(error: BaseException) -> int:
    """The HTTP status for an error that reached the top of a request handler."""
    # Retained content: not kept -> 404, erased -> 410 Gone, erasure under a hold -> 409.
    if isinstance(error, ContentNotRetainedError):
        return 404
    if isinstance(error, ContentErasedError):
        return 410
    if isinstance(error, LegalHoldError):
        return 409
    if isinstance(error, InvalidInputError):
        return 422
    if isinstance(error, DuplicateRecordError):
        return 409
    if isinstance(error, BackendUnavailableError | BackendError):
        return 503
    if isinstance(error, VerificationError):
        # The server's own evidence did not hold up: its fault, not the caller's.
        return 500
    return 500
