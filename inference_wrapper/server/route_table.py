"""The route table: one entry per route with the roles that may call it, feeding
aiohttp, the access middleware and /openapi.json alike. The handlers live in one module
per audience (native generate, OpenAI, records and checkpoints, content, operations)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from inference_wrapper.engine.params import Limits
from inference_wrapper.server.access import (
    ADMIN_ROLES,
    AUDITOR_ROLES,
    CLIENT_ROLES,
    READER_ROLES,
)
from inference_wrapper.server.appkeys import GENERATOR
from inference_wrapper.server.content import ERASE_FIELDS, POLICY_FIELDS
from inference_wrapper.server.routes_content import erase, get_policy, put_policy, record_content
from inference_wrapper.server.routes_generate import generate, generate_fields
from inference_wrapper.server.routes_openai import (
    chat_completions,
    chat_fields,
    completion_fields,
    completions,
    models,
)
from inference_wrapper.server.routes_ops import healthz, metrics, readyz
from inference_wrapper.server.routes_records import (
    MATCH_VALUES,
    MAX_FILTER_CHARS,
    MAX_RECORDS_LIMIT,
    QUERY_PARAMS,
    anchored_checkpoint,
    consistency,
    get_record,
    known_values,
    latest_checkpoint,
    list_records,
    public_key,
    record_proof,
)
from inference_wrapper.server.tiles import (
    BODIES_PATTERN,
    TILE_PATTERN,
    tlog_bodies,
    tlog_checkpoint,
    tlog_tile,
)
from inference_wrapper.server.validation import MAX_QUERY_INT, Field, openapi_schema
from ledger.store.mirror import EXACT_FILTERS, PAGE_CURSOR_PATTERN, PAGE_ORDERS


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    summary: str
    body: Callable[[Limits], dict[str, Field]] | None = None
    query: tuple[str, ...] = ()
    roles: tuple[str, ...] | None = None  # who may call it (None: no key needed)
    openai: bool = False  # errors in OpenAI's shape instead of problem details
    response: dict[str, Any] | None = None  # JSON Schema of the 200 body
    media: str = "text/plain"  # the 200 body's type when it is not JSON (``response``)
    pattern: str | None = None  # aiohttp's path with a regex, when ``path`` has none


def _obj(required: dict[str, Any], optional: dict[str, Any] | None = None,
         closed: bool = True) -> dict[str, Any]:
    return {"type": "object", "required": list(required),
            "properties": {**required, **(optional or {})},
            "additionalProperties": not closed}


_STR, _INT, _HEX = {"type": "string"}, {"type": "integer", "minimum": 0}, \
    {"type": "string", "pattern": "^[0-9a-f]*$"}


_USAGE = _obj({"prompt_tokens": _INT, "completion_tokens": _INT, "total_tokens": _INT})


_RECEIPT = _obj({"record_id": _STR, "leaf_index": _INT, "leaf_hash": _HEX,
                 "input_salt": _HEX, "output_salt": _HEX}, {"user_salt": _HEX})


_FINISH = {"enum": ["stop", "length"]}


_SEED_OUT = {"type": ["integer", "null"]}


_ROW = _obj({"record_id": _STR, "leaf_index": _INT, "created_at": _STR, "tenant": _STR,
             "checkpoint_size": {"type": ["integer", "null"]},
             "anchor_ref": {"type": ["string", "null"]}, "record": {"type": "object"}},
            {"canonical_base64": _STR}, closed=False)


_NOTE = {"tree_size": _INT, "checkpoint": _STR}


RESPONSES: dict[str, dict[str, Any]] = {
    "generate": _obj({"output": _STR, "finish_reason": _FINISH, "usage": _USAGE,
                      "seed": _SEED_OUT, "record_id": _STR, "leaf_index": _INT,
                      "leaf_hash": _HEX, "input_salt": _HEX, "output_salt": _HEX}),
    "completions": _obj({
        "id": _STR, "object": {"const": "text_completion"}, "created": _INT, "model": _STR,
        "system_fingerprint": _STR, "usage": _USAGE, "seed": _SEED_OUT, "audit": _RECEIPT,
        "choices": {"type": "array", "minItems": 1, "maxItems": 1, "items": _obj({
            "text": _STR, "index": _INT, "logprobs": {"type": "null"},
            "finish_reason": _FINISH})}}),
    "chat": _obj({
        "id": _STR, "object": {"const": "chat.completion"}, "created": _INT, "model": _STR,
        "system_fingerprint": _STR, "usage": _USAGE, "seed": _SEED_OUT, "audit": _RECEIPT,
        "choices": {"type": "array", "minItems": 1, "maxItems": 1, "items": _obj({
            "index": _INT, "logprobs": {"type": "null"}, "finish_reason": _FINISH,
            "message": _obj({"role": {"const": "assistant"}, "content": _STR})})}}),
    "models": _obj({"object": {"const": "list"}, "data": {"type": "array", "items": _obj({
        "id": _STR, "object": {"const": "model"}, "created": _INT, "owned_by": _STR,
        "digest": _STR, "pinned": {"type": "boolean"}})}}),
    "records": _obj({"records": {"type": "array", "items": _ROW},
                     "next_cursor": {"type": ["string", "null"]},
                     "previous_cursor": {"type": ["string", "null"]}},
                    {"total": _INT}),  # with total=true
    "known_values": _obj({name: {"type": "array", "items": _STR}
                          for name in ("model_name", "model_digest", "accelerator_model",
                                       "driver_version", "service_revision")}),
    "record": _ROW,
    "proof": _obj({"record_id": _STR, "leaf_index": _INT, "leaf_hash": _HEX,
                   "inclusion_proof": {"type": "array", "items": _HEX}, **_NOTE},
                  {"environment": _obj({"leaf_index": _INT, "inclusion_proof": {
                      "type": "array", "items": _HEX}})}),  # a v2 record's environment
    "latest": _obj({"root": _HEX, **_NOTE}),
    "anchored": _obj({"kind": _STR, "ref": _STR, **_NOTE}),
    "consistency": _obj({"from": _INT, "to": _INT,
                         "proof": {"type": "array", "items": _HEX}}),
    "public_key": _obj({"origin": _STR, "verifier_key": _STR, "key_hash": _HEX}),
    "healthz": _obj({"status": {"const": "ok"}}),
    "readyz": _obj({"ready": {"type": "boolean"},
                    "checks": {"type": "object",
                               "additionalProperties": {"type": "boolean"}}},
                   {"anchor_error": _STR, "shutting_down": {"const": True},
                    "replica": _obj({"id": _STR, "holds_lease": {"type": "boolean"},
                                     "last_seal_age_s": {"type": ["number", "null"]},
                                     "latest_sealed_by": {"type": ["string", "null"]},
                                     "origin": _STR,
                                     "fenced_writer_sessions": _INT},
                                    {"fencing": _obj({
                                        "other_roles": {"type": "boolean"}, "role": _STR,
                                        "missing": {"type": "array", "items": _STR}})})}),
    "openapi": {"type": "object", "required": ["openapi", "paths"]},
}


async def openapi(request: web.Request) -> web.Response:
    generator = request.app[GENERATOR]
    return web.json_response(openapi_document(generator.limits, generator.loaded.name))


ROUTES = (
    Route("POST", "/v1/generate", generate, "audited generate", generate_fields,
          response=RESPONSES["generate"],
          roles=CLIENT_ROLES),
    Route("POST", "/v1/completions", completions, "OpenAI-compatible completion",
          completion_fields, openai=True, response=RESPONSES["completions"],
          roles=CLIENT_ROLES),
    Route("POST", "/v1/chat/completions", chat_completions, "OpenAI-compatible chat",
          chat_fields, openai=True, response=RESPONSES["chat"],
          roles=CLIENT_ROLES),
    Route("GET", "/v1/models", models, "the served model and its digest", openai=True,
          response=RESPONSES["models"],
          roles=READER_ROLES),
    Route("GET", "/v1/records", list_records, "query the mirror", query=QUERY_PARAMS,
          response=RESPONSES["records"],
          roles=READER_ROLES),
    Route("GET", "/v1/known-values", known_values,
          "the distinct model names, digests, accelerators, drivers and revisions of the "
          "records the key may read (a console's pick-lists)",
          response=RESPONSES["known_values"], roles=READER_ROLES),
    Route("GET", "/v1/records/{record_id}", get_record, "one record with its bytes",
          response=RESPONSES["record"],
          roles=READER_ROLES),
    Route("GET", "/v1/records/{record_id}/proof", record_proof,
          "inclusion proof to the latest (or a given) checkpoint", query=("tree_size",),
          response=RESPONSES["proof"],
          roles=READER_ROLES),
    Route("GET", "/v1/records/{record_id}/content", record_content,
          "an auditor reads retained content; the read is logged first", query=("purpose",),
          roles=AUDITOR_ROLES),
    Route("POST", "/v1/admin/erasures", erase, "erase retained content (crypto-shredding)",
          lambda _limits: ERASE_FIELDS,
          roles=ADMIN_ROLES),
    Route("GET", "/v1/admin/retention", get_policy, "the admin's tenant retention policy",
          roles=ADMIN_ROLES),
    Route("PUT", "/v1/admin/retention", put_policy, "set the tenant's retention policy",
          lambda _limits: POLICY_FIELDS,
          roles=ADMIN_ROLES),
    Route("GET", "/v1/checkpoints/latest", latest_checkpoint, "the latest signed checkpoint",
          response=RESPONSES["latest"],
          roles=READER_ROLES),
    Route("GET", "/v1/checkpoints/anchored", anchored_checkpoint,
          "the newest anchored checkpoint and where it was anchored",
          response=RESPONSES["anchored"],
          roles=READER_ROLES),
    Route("GET", "/v1/checkpoints/consistency", consistency, "consistency proof",
          query=("from", "to"), response=RESPONSES["consistency"],
          roles=READER_ROLES),
    Route("GET", "/v1/log/public-key", public_key, "the log's verifier key",
          response=RESPONSES["public_key"],
          roles=READER_ROLES),
    Route("GET", "/tlog/checkpoint", tlog_checkpoint,
          "C2SP tlog-tiles: the latest signed checkpoint, witness cosignatures included",
          roles=READER_ROLES),
    Route("GET", "/tlog/tile/{tile_path}", tlog_tile,
          "C2SP tlog-tiles: a hash tile or an entry bundle (immutable once full)",
          roles=READER_ROLES, media="application/octet-stream", pattern=TILE_PATTERN),
    Route("GET", "/tlog/bodies/{body_path}", tlog_bodies,
          "v2 bodies beside an entry bundle, one file per tenant tag (a tenant's key "
          "reads its own and the log-wide ones)",
          roles=READER_ROLES, media="application/octet-stream", pattern=BODIES_PATTERN),
    Route("GET", "/healthz", healthz, "liveness", response=RESPONSES["healthz"]),
    Route("GET", "/readyz", readyz, "readiness", response=RESPONSES["readyz"]),
    Route("GET", "/metrics", metrics, "Prometheus metrics"),
    Route("GET", "/openapi.json", openapi, "this document",
          response=RESPONSES["openapi"]),
)
# Paths whose errors are in OpenAI's shape (any method, so a 405 there is one too).
OPENAI_PATHS = frozenset(r.path for r in ROUTES if r.openai)


# Answered even while shutting down: probes and scrapes must see the shutdown happen.
UNGATED_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


PROBLEM_SCHEMA = {"type": "object", "required": ["type", "title", "status", "detail"],
                  "properties": {
                      "type": _STR, "title": _STR, "status": {"type": "integer"},
                      "detail": _STR, "field": _STR, "code": _STR, "instance": _STR,
                      "request_id": _STR, "record_id": _STR}}


# record_id: the committed record of a request answered with an error (content not kept).
OPENAI_ERROR_SCHEMA = _obj({"error": _obj({
    "message": _STR, "type": _STR, "param": {"type": ["string", "null"]},
    "code": {"type": ["string", "null"]}}, {"record_id": _STR})})


_QUERY_SCHEMAS: dict[str, dict[str, Any]] = {
    "limit": {"type": "integer", "minimum": 1, "maximum": MAX_RECORDS_LIMIT},
    "tree_size": {"type": "integer", "minimum": 0, "maximum": MAX_QUERY_INT},
    "from": {"type": "integer", "minimum": 0, "maximum": MAX_QUERY_INT},
    "to": {"type": "integer", "minimum": 0, "maximum": MAX_QUERY_INT},
    "cursor": {"type": "string", "pattern": PAGE_CURSOR_PATTERN},
    "match": {"type": "string", "enum": list(MATCH_VALUES)},
    "order": {"type": "string", "enum": list(PAGE_ORDERS)},
    "total": {"type": "boolean"},
    **{name: {"type": "string", "minLength": 1, "maxLength": MAX_FILTER_CHARS}
       for name in EXACT_FILTERS},
    "since": {"type": "string", "format": "date-time"},
    "until": {"type": "string", "format": "date-time"},
}


def openapi_document(limits: Limits | None = None, model: str | None = None
                     ) -> dict[str, Any]:
    """The API description, from the route table and the field specs the server checks
    with; ``limits`` and ``model`` are the serving generator's, when known."""
    limits = limits or Limits()
    paths: dict[str, Any] = {}
    for route in ROUTES:
        if route.openai:
            error = {"description": "OpenAI error object",
                     "content": {"application/json": {"schema": OPENAI_ERROR_SCHEMA}}}
        else:
            error = {"description": "problem details",
                     "content": {"application/problem+json": {"schema": PROBLEM_SCHEMA}}}
        success: dict[str, Any]
        if route.response is not None:
            success = {"description": "success",
                       "content": {"application/json": {"schema": route.response}}}
            if route.openai and route.body is not None:  # stream: true
                success["content"]["text/event-stream"] = {"schema": {
                    "type": "object", "required": ["data"],
                    "properties": {"data": {"type": "string"}},
                    "description": "each server-sent event: a JSON chunk on its data "
                    "line (the last chunk carries the receipt), then [DONE]"}}
        else:
            success = {"description": route.summary,
                       "content": {route.media: {"schema": {"type": "string"}}}}
        responses: dict[str, Any] = {"200": success, "4XX": error, "5XX": error}
        if route.handler is readyz:  # not ready is a readiness body, not a problem
            responses["503"] = {"description": "not ready", "content": {
                "application/json": {"schema": RESPONSES["readyz"]}}}
        operation: dict[str, Any] = {"summary": route.summary,
                                     "operationId": route.handler.__name__,
                                     "responses": responses}
        params = [{"name": q, "in": "query",
                   "required": q in ("from", "to") and route.handler is consistency,
                   "schema": _QUERY_SCHEMAS.get(q, {"type": "string"})} for q in route.query]
        if "{record_id}" in route.path:
            params.append({"name": "record_id", "in": "path", "required": True,
                           "schema": {"type": "string", "minLength": 1}})
        for name in ("tile_path", "body_path"):
            if f"{{{name}}}" in route.path:
                params.append({"name": name, "in": "path", "required": True,
                               "schema": {"type": "string", "minLength": 1}})
        if params:
            operation["parameters"] = params
        if route.body is not None:
            schema = openapi_schema(route.body(limits))
            if model is not None and "model" in schema["properties"]:
                schema["properties"]["model"] = {**schema["properties"]["model"],
                                                 "enum": [model]}
            if "stream_options" in schema["properties"]:
                # OpenAI's rule, which the handlers enforce: options only for a stream.
                schema["if"] = {"required": ["stream_options"],
                                "properties": {"stream_options": {"type": "object"}}}
                schema["then"] = {"required": ["stream"],
                                  "properties": {"stream": {"const": True}}}
            operation["requestBody"] = {"required": True, "content": {
                "application/json": {"schema": schema}}}
        if route.roles is not None:
            operation["security"] = [{"bearer": []}]
        paths.setdefault(route.path, {})[route.method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "audit-ledger", "version": "1"},
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "paths": paths,
    }


# (method, path) -> the roles that may call it: what the access middleware enforces.
ROUTE_ROLES = {(r.method, r.path): r.roles for r in ROUTES}
