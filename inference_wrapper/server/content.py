"""Retained content on the endpoint: the vault's place in the app, the retain hook the
batcher calls, the auditors' content route and the admins' erasure and policy routes.

Who may do what (README "Retained content"):

- ``client``: never reads content, not even its own tenant's (it got the answer and the
  salts when it asked); it may tag a request with a data-subject id.
- ``auditor``: reads any tenant's retained content, always with a purpose, and every read
  first appends an ``access-record/v1`` leaf.
- ``admin``: manages its own tenant's policy and erasures; reads no content (separation of
  duties: whoever can erase cannot also read, and vice versa).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web

from inference_wrapper.audit.generator import AuditedOutput, PreparedRequest
from inference_wrapper.server.appkeys import LEDGER, METRICS, SETTINGS, VAULT
from inference_wrapper.server.problems import Problem, invalid
from inference_wrapper.server.validation import Field
from ledger.error_map import http_status_for
from ledger.errors import InvalidInputError, LedgerError
from ledger.store.keyring import load_keks
from ledger.store.vault import ContentVault, RetainItem, check_subject
from ledger.vault_errors import ContentErasedError, ContentNotKeptError, LegalHoldError

log = logging.getLogger("audit_ledger.vault")

AUDITOR_ROLES = ("auditor",)
ADMIN_ROLES = ("admin",)
ERASE_FIELDS = {
    "tenant": Field("string", description="the admin's own tenant (default)"),
    "subject": Field("string", description="erase every record tagged with this subject"),
    "record_ids": Field("array", description="or erase these records"),
    "legal_basis": Field("string", description="required for records inside the minimum "
                         "retention; recorded in the erasure leaf"),
}
POLICY_FIELDS = {
    "mode": Field("string", required=True, only=("commitments", "content")),
    "days": Field("integer", nullable=True, description="retention period for mode content"),
}


class ContentProblem(Problem):
    """A problem with extension members (RFC 9457 section 3.2), e.g. when content was erased."""

    def __init__(self, status: int, title: str, detail: str, members: dict[str, Any],
                 field: str | None = None) -> None:
        super().__init__(status, title, detail, field=field)
        self.members = members

    def response(self, instance: str | None = None) -> web.Response:
        response = super().response(instance)
        body = json.loads(response.text or "{}") | self.members
        response.text = json.dumps(body)
        return response


def problem_for(error: LedgerError) -> Problem:
    """The one mapping (``ledger.error_map``) applied to the vault's errors."""
    status = http_status_for(error)
    if isinstance(error, ContentErasedError):
        return ContentProblem(status, "Gone", str(error), {
            "erased_at": error.erased_at, "erasure_record_id": error.erasure_record_id})
    if isinstance(error, LegalHoldError):
        return ContentProblem(status, "Conflict", str(error), {
            "hold_id": error.hold_id, "scope": error.scope})
    if isinstance(error, InvalidInputError):
        return invalid(error.field, error.reason)
    if status == 404:
        return Problem(404, "Not Found", str(error))
    if status == 503:
        return Problem(503, "Service Unavailable", "the content vault's keys are unavailable",
                       headers={"Retry-After": "5"})
    # A named verification failure (e.g. ContentIntegrityError): facts, no internals.
    return Problem(status, "Internal Server Error", str(error))


# --- the app's resource ----------------------------------------------------------------


def open_vault(settings: Any) -> ContentVault:
    return ContentVault(settings.database_url,
                        load_keks(settings.keyring_path, settings.kek_provider),
                        default_mode=settings.retention_default_mode,
                        default_days=settings.retention_default_days,
                        minimum_days=settings.retention_minimum_days)


async def vault_context(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    vault = await asyncio.to_thread(open_vault, settings)
    app[VAULT] = vault
    # A tenant whose expiry failed is seen here, not only in the log (decision 0061).
    app[METRICS].expiry_failed_tenants.set_function(lambda: float(len(vault.expiry_failures)))
    expiry = asyncio.get_running_loop().create_task(
        _expire_periodically(vault, app, settings.retention_expiry_interval_s),
        name="retention-expiry")
    yield
    expiry.cancel()
    try:
        await expiry
    except asyncio.CancelledError:
        pass
    await asyncio.to_thread(vault.close)


async def _expire_periodically(vault: ContentVault, app: web.Application,
                               interval_s: float) -> None:
    """Erase expired content now and then every ``interval_s`` (same as the CLI's
    ``audit-ledger retention expire``)."""
    while True:
        try:
            erasures, held = await asyncio.to_thread(vault.expire, app[LEDGER])
            for erasure in erasures:
                # a large expiry is logged in several erasure leaves: name them all
                log.info("retention expiry erased %d records of tenant %s (erasure records "
                         "%s)", len(erasure.records), erasure.tenant,
                         ", ".join(erasure.erasure_record_ids or
                                   (erasure.erasure_record_id or "none",)))
            for hold in held:
                log.info("retention expiry kept records under legal hold %s", hold.hold_id)
        except Exception:  # a failed run is retried at the next interval
            log.exception("retention expiry failed")
        await asyncio.sleep(interval_s)


def retain_hook(vault: ContentVault) -> Callable[[list[tuple[PreparedRequest, AuditedOutput,
                                                            Any]]], None]:
    """What the batcher calls with a batch's durable records (one transaction)."""

    def retain(durable: list[tuple[PreparedRequest, AuditedOutput, Any]]) -> None:
        items = [RetainItem(receipt.record_id, receipt.leaf_hash, request.tenant,
                            output.record.created_at, request.prompt, output.text,
                            output.input_salt, output.output_salt, request.subject)
                 for request, output, receipt in durable]
        try:
            vault.retain(items)
        except Exception as exc:
            log.exception("content vault failed to retain %d records", len(items))
            raise ContentNotKeptError() from exc

    return retain


def subject_from(body: dict[str, Any], name: str) -> str | None:
    """The optional data-subject id (``subject`` natively, ``user`` for OpenAI shapes)."""
    value = body.get(name)
    if value is None:
        return None
    try:
        return check_subject(value)
    except InvalidInputError as exc:
        raise invalid(name, exc.reason) from exc
