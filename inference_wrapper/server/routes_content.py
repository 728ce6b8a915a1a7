"""The content routes: an auditor reads retained content (the read is logged first); an
admin erases its tenant's content and sets its retention policy."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from inference_wrapper.server.access import caller
from inference_wrapper.server.appkeys import LEDGER, SETTINGS, VAULT
from inference_wrapper.server.content import (
    ERASE_FIELDS,
    POLICY_FIELDS,
    subject_from,
)
from inference_wrapper.server.content import problem_for as vault_problem
from inference_wrapper.server.problems import Problem, invalid
from inference_wrapper.server.validation import read_json_body
from ledger.content_records import check_purpose
from ledger.errors import InvalidInputError, LedgerError
from ledger.store.vault import Accessor


async def record_content(request: web.Request) -> web.Response:
    """An auditor reads a record's retained content; the read is logged first."""
    key = caller(request)
    for name in request.query:
        if name != "purpose":
            raise invalid(name, f"unknown query parameter {name!r}", status=400)
    try:
        purpose = check_purpose(request.query.get("purpose"))
    except InvalidInputError as exc:
        raise invalid(exc.field, exc.reason, status=400) from exc
    record_id = request.match_info["record_id"]
    accessor = Accessor(key.key_id, key.role, key.tenant)
    try:
        result = await asyncio.to_thread(request.app[VAULT].read_audited, request.app[LEDGER],
                                         record_id, accessor, purpose, "http")
    except LedgerError as exc:
        raise vault_problem(exc) from exc  # the vault's extension members
    row, content = result.row, result.content
    return web.json_response({
        "record_id": row.record_id, "tenant": row.tenant, "leaf_hash": row.leaf_hash.hex(),
        "prompt": content.prompt, "output": content.output,
        "input_salt": content.input_salt.hex(), "output_salt": content.output_salt.hex(),
        "retained_until": row.expires_at.isoformat(timespec="milliseconds") + "Z",
        "access_record_id": result.access_record_id,
        "access_leaf_index": result.access_leaf_index,
    }, headers={"Cache-Control": "no-store"})


def _own_tenant(key: Any, tenant: Any) -> str:
    if tenant is not None and tenant != key.tenant:
        raise Problem(403, "Forbidden", "an admin acts on its own tenant only", field="tenant")
    return str(key.tenant)


async def erase(request: web.Request) -> web.Response:
    """An admin erases its tenant's content by subject or by records (crypto-shredding)."""
    key = caller(request)
    body = await read_json_body(request, ERASE_FIELDS,
                                request.app[SETTINGS].body_read_timeout_s)
    tenant = _own_tenant(key, body.get("tenant"))
    subject, record_ids = body.get("subject"), body.get("record_ids")
    if (subject is None) == (record_ids is None):
        raise invalid("subject", "give either subject or record_ids")
    if record_ids is not None and (not record_ids or not all(
            isinstance(r, str) and 0 < len(r) <= 64 for r in record_ids)):
        raise invalid("record_ids", "must be a non-empty list of record ids")
    if subject is not None:
        subject = subject_from(body, "subject")
    legal_basis = body.get("legal_basis")
    try:
        erasure = await asyncio.to_thread(
            lambda: request.app[VAULT].erase(request.app[LEDGER], tenant,
                                             record_ids=record_ids or (), subject=subject,
                                             requested_by=f"key:{key.key_id}",
                                             legal_basis=legal_basis))
    except LedgerError as exc:
        raise vault_problem(exc) from exc  # the vault's extension members
    return web.json_response(erasure.to_dict())


async def get_policy(request: web.Request) -> web.Response:
    key = caller(request)
    policy = await asyncio.to_thread(request.app[VAULT].policy, key.tenant)
    return web.json_response(policy.to_dict())


async def put_policy(request: web.Request) -> web.Response:
    key = caller(request)
    body = await read_json_body(request, POLICY_FIELDS,
                                request.app[SETTINGS].body_read_timeout_s)
    try:
        policy = await asyncio.to_thread(request.app[VAULT].set_policy, key.tenant,
                                         body["mode"], body.get("days"))
    except LedgerError as exc:
        raise vault_problem(exc) from exc  # the vault's extension members
    return web.json_response(policy.to_dict())
