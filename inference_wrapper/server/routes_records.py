"""The auditor's routes: records, their proofs, checkpoints, consistency, the log key."""

from __future__ import annotations

import asyncio
import base64
import json
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from inference_wrapper.server.access import caller, readable_tenant
from inference_wrapper.server.appkeys import INTEGRATOR, LEDGER, SETTINGS, SIGNER
from inference_wrapper.server.problems import Problem, invalid
from inference_wrapper.server.validation import MAX_QUERY_INT, query_int
from ledger.errors import InvalidInputError
from ledger.store.log_api import RecordRow
from ledger.store.mirror import (
    EXACT_FILTERS,
    PAGE_ORDERS,
    PARTIAL_FILTERS,
    MirrorPage,
    decode_position,
)
from ledger.witness.cosignatures import cosigned_note

MAX_RECORDS_LIMIT = 10_000
MAX_FILTER_CHARS = 256  # the longest name the mirror holds (model_name)


def _row_json(row: RecordRow, include_bytes: bool = False) -> dict[str, Any]:
    """A mirror row. A v2 leaf (decision 0026) shows its body as ``record`` and its
    envelope apart; with the bytes, ``canonical_base64`` is what the tree hashes (the
    envelope) and ``body_base64`` the body."""
    result: dict[str, Any] = {
        "record_id": row.record_id, "leaf_index": row.leaf_index,
        "created_at": row.created_at.isoformat() + "Z", "tenant": row.tenant,
        **{k: v for k, v in row.columns.items()},
        "checkpoint_size": row.checkpoint_size, "anchor_ref": row.anchor_ref,
        "record": json.loads(row.canonical if row.body is None else row.body),
    }
    if row.body is not None:
        result["envelope"] = json.loads(row.canonical)
        result["environment_index"] = row.environment_index
    if include_bytes:
        result["canonical_base64"] = base64.b64encode(row.canonical).decode()
        if row.body is not None:
            result["body_base64"] = base64.b64encode(row.body).decode()
    return result


def _environment_json(row: RecordRow) -> dict[str, Any]:
    """The environment leaf a v2 record names, as its record answer carries it (a
    tenant's reader may not list log-wide leaves, but needs this one to verify)."""
    assert row.body is not None
    return {"leaf_index": row.leaf_index, "record_id": row.record_id,
            "envelope_base64": base64.b64encode(row.canonical).decode(),
            "body_base64": base64.b64encode(row.body).decode(),
            "record": json.loads(row.body)}


def _parse_time(request: web.Request, name: str) -> datetime | None:
    raw = request.query.get(name)
    if raw is None:
        return None
    try:
        moment = datetime.fromisoformat(raw)
        if moment.tzinfo is not None:  # the mirror stores naive UTC
            moment = moment.astimezone(UTC).replace(tzinfo=None)
    except (ValueError, OverflowError) as exc:  # year 1 at +01:00 overflows in UTC
        raise invalid(name, "must be an RFC 3339 timestamp", status=400) from exc
    return moment


# The search the console offers, through the API (decision 0047): exact filters (the
# model's name too), parts of names with ``match=part``, three orders, cursors both ways
# and, when asked, the total.
QUERY_PARAMS = ("since", "until", "limit", "cursor", *EXACT_FILTERS, "match", "order",
                "total")
MATCH_VALUES = ("whole", "part")
BOOLEAN_VALUES = {"true": True, "false": False}


def _choice(request: web.Request, name: str, allowed: tuple[str, ...], default: str) -> str:
    value = request.query.get(name, default)
    if value not in allowed:
        raise invalid(name, f"must be one of {', '.join(allowed)}", status=400)
    return value


def _search_terms(request: web.Request, scope: str | None, role: str
                  ) -> tuple[dict[str, str | None], dict[str, str]]:
    """The exact filters and the parts of names a request names; a tenant-scoped key
    searches its own tenant only (naming another: 403, field tenant)."""
    match = _choice(request, "match", MATCH_VALUES, "whole")
    named = {name: request.query.get(name) for name in EXACT_FILTERS}
    for name, value in named.items():
        if value is not None and (not value or len(value) > MAX_FILTER_CHARS):
            raise invalid(name, f"must be 1 to {MAX_FILTER_CHARS} characters", status=400)
        if value is not None and "\x00" in value:  # no name holds it; PostgreSQL refuses it
            raise invalid(name, "must not hold the NUL character", status=400)
    contains = ({name: value for name, value in named.items()
                 if name in PARTIAL_FILTERS and value is not None} if match == "part" else {})
    filters = {name: value for name, value in named.items() if name not in contains}
    if scope is not None:
        if filters["tenant"] not in (None, scope):
            raise Problem(403, "Forbidden", f"a {role} key of tenant {scope!r} reads only "
                          "that tenant's records", field="tenant")
        filters["tenant"] = scope
    return filters, contains


async def list_records(request: web.Request) -> web.Response:
    key = caller(request)
    for name in request.query:
        if name not in QUERY_PARAMS:
            raise invalid(name, f"unknown query parameter {name!r}", status=400)
    filters, contains = _search_terms(request, readable_tenant(key), key.role)
    order = _choice(request, "order", PAGE_ORDERS, "leaf")
    with_total = BOOLEAN_VALUES.get(request.query.get("total", "false"))
    if with_total is None:
        raise invalid("total", "must be true or false", status=400)
    limit = query_int(request.query.get("limit"), "limit", default=100, low=1,
                      high=MAX_RECORDS_LIMIT)
    cursor = request.query.get("cursor")
    if cursor is not None:
        try:
            place = decode_position(cursor)
        except InvalidInputError as exc:
            raise invalid("cursor", exc.reason, status=400) from exc
        if place.leaf_index > MAX_QUERY_INT:  # a forged cursor must not overflow SQL
            raise invalid("cursor", "is not a cursor this service issued", status=400)
        if place.order != order:
            raise invalid("cursor", f"belongs to order {place.order!r}, not {order!r}; "
                          "search again", status=400)
    since, until = _parse_time(request, "since"), _parse_time(request, "until")
    mirror = request.app[LEDGER].mirror

    def search() -> tuple[MirrorPage, int | None]:
        found = mirror.page(since=since, until=until, limit=limit, cursor=cursor,
                            order=order, filters=filters, contains=contains)
        total = (mirror.count(since=since, until=until, filters=filters, contains=contains)
                 if with_total else None)
        return found, total

    try:
        found, total = await asyncio.to_thread(search)
    except InvalidInputError as exc:
        raise invalid(exc.field, exc.reason, status=400) from exc
    answer: dict[str, Any] = {"records": [_row_json(r) for r in found.rows],
                              "next_cursor": found.next_cursor,
                              "previous_cursor": found.previous_cursor}
    if total is not None:
        answer["total"] = total
    return web.json_response(answer)


async def known_values(request: web.Request) -> web.Response:
    """The distinct model names and digests, accelerators, drivers and service revisions
    of the records this key may read: the pick-lists of a console (a tenant's key learns
    only its own tenant's)."""
    scope = readable_tenant(caller(request))
    known = await asyncio.to_thread(request.app[LEDGER].mirror.known_values, scope)
    return web.json_response(known)


async def _visible_record(request: web.Request) -> RecordRow:
    key = caller(request)
    record_id = request.match_info["record_id"]
    row = await asyncio.to_thread(request.app[LEDGER].get_record, record_id)
    # A client asking for another tenant's record learns nothing, not even that it exists.
    scope = readable_tenant(key)
    if row is None or (scope is not None and row.tenant != scope):
        raise Problem(404, "Not Found", f"no record {record_id!r}")
    return row


async def get_record(request: web.Request) -> web.Response:
    row = await _visible_record(request)
    answer = _row_json(row, include_bytes=True)
    if row.environment_index is not None:
        environment = await asyncio.to_thread(request.app[LEDGER].record_at,
                                              row.environment_index)
        if environment is not None and environment.body is not None:
            answer["environment"] = _environment_json(environment)
    return web.json_response(answer)


async def record_proof(request: web.Request) -> web.Response:
    row = await _visible_record(request)
    ledger = request.app[LEDGER]
    if "tree_size" in request.query:  # a proof to one given, already sealed checkpoint
        size = query_int(request.query.get("tree_size"), "tree_size")
        latest = await asyncio.to_thread(ledger.checkpoint, size)
        if latest is None or latest.size <= row.leaf_index:
            raise invalid("tree_size", f"no checkpoint of size {size} covers this record",
                          status=404)
    else:
        latest = await asyncio.to_thread(ledger.latest_checkpoint)
    if latest is None or latest.size <= row.leaf_index:
        await asyncio.to_thread(request.app[INTEGRATOR].seal_now)
        latest = await asyncio.to_thread(ledger.latest_checkpoint)
    if latest is None or latest.size <= row.leaf_index:
        raise Problem(503, "Service Unavailable", "the record is not yet covered by a "
                      "checkpoint", headers={"Retry-After": "1"})
    # Both reads in the worker thread: the event loop never waits on the database.
    environment_index = row.environment_index
    proof, leaf_hash, note, environment_proof = await asyncio.to_thread(
        lambda: (ledger.inclusion_proof(row.leaf_index, latest.size),
                 ledger.leaf_hash(row.leaf_index),
                 cosigned_note(ledger, latest.size, latest.note),
                 None if environment_index is None
                 else ledger.inclusion_proof(environment_index, latest.size)))
    answer: dict[str, Any] = {
        "record_id": row.record_id, "leaf_index": row.leaf_index,
        "leaf_hash": leaf_hash.hex(), "tree_size": latest.size,
        "inclusion_proof": [h.hex() for h in proof], "checkpoint": note.decode(),
    }
    if environment_proof is not None:  # a v2 record's environment leaf, same checkpoint
        answer["environment"] = {"leaf_index": environment_index,
                                 "inclusion_proof": [h.hex() for h in environment_proof]}
    return web.json_response(answer)


async def latest_checkpoint(request: web.Request) -> web.Response:
    latest = await asyncio.to_thread(request.app[LEDGER].latest_checkpoint)
    if latest is None:
        raise Problem(404, "Not Found", "no checkpoint has been sealed yet")
    note = await asyncio.to_thread(cosigned_note, request.app[LEDGER], latest.size, latest.note)
    return web.json_response({"tree_size": latest.size, "root": latest.root.hex(),
                              "checkpoint": note.decode()})


async def anchored_checkpoint(request: web.Request) -> web.Response:
    anchored = await asyncio.to_thread(request.app[LEDGER].anchors.latest)
    if anchored is None:
        raise Problem(404, "Not Found", "no checkpoint has been anchored yet")
    return web.json_response({"tree_size": anchored.size, "kind": anchored.kind,
                              "ref": anchored.ref, "checkpoint": anchored.note.decode()})


async def consistency(request: web.Request) -> web.Response:
    first = query_int(request.query.get("from"), "from")
    second = query_int(request.query.get("to"), "to")
    ledger = request.app[LEDGER]
    size, _ = await asyncio.to_thread(ledger.tree_head)
    # Well-formed asks for a proof that does not exist are 404, naming the parameter: a
    # tree the log has not reached (yet), or a proof from a larger tree to a smaller one.
    if second > size:
        raise invalid("to", f"{second} is beyond the log's size {size}", status=404)
    if first > second:
        raise invalid("from", f"no consistency proof leads from size {first} to the "
                      f"smaller size {second}", status=404)
    try:
        proof = await asyncio.to_thread(ledger.consistency_proof, first, second)
    except InvalidInputError as exc:
        raise invalid("from" if exc.field == "from" else "to", exc.reason, status=400) from exc
    return web.json_response({"from": first, "to": second, "proof": [h.hex() for h in proof]})


async def public_key(request: web.Request) -> web.Response:
    verifier = request.app[SIGNER].verifier()
    return web.json_response({"origin": request.app[SETTINGS].origin,
                              "verifier_key": verifier.encode(),
                              "key_hash": verifier.key_hash.hex()})
