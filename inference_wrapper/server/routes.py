"""The route table: one entry per route, feeding both aiohttp and /openapi.json."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from inference_wrapper.batcher import Answer, CallerGoneError, QueueFullError, ShuttingDownError
from inference_wrapper.generator import PreparedRequest
from inference_wrapper.params import GenerationParams
from inference_wrapper.server.app import (
    ANCHOR_WORKER,
    BATCHER,
    GENERATOR,
    IDEMPOTENCY,
    INTEGRATOR,
    KEYS,
    LEDGER,
    METRICS,
    SETTINGS,
    SIGNER,
    SUPERVISOR,
    TRACER,
)
from inference_wrapper.server.idempotency import Rendered, key_from
from inference_wrapper.server.problems import Problem, invalid
from inference_wrapper.server.streaming import stream_answer
from inference_wrapper.server.validation import (
    Field,
    check_fields,
    openapi_schema,
    parse_json_body,
)
from ledger.anchor.local import LocalAnchor
from ledger.errors import BackendError, InvalidInputError
from ledger.store.apikeys import ApiKey
from ledger.store.sql import QUERY_FILTERS, RecordRow

CLIENT_ROLES = ("client", "admin")
READER_ROLES = ("client", "auditor", "admin")

GENERATE_FIELDS = {
    "prompt": Field("string", required=True, description="the prompt text"),
    "max_new_tokens": Field("integer", description="tokens to generate (default 32)"),
    "temperature": Field("number", description="0 for greedy decoding (default 0)"),
    "top_p": Field("number", description="nucleus sampling mass (default 1)"),
    "seed": Field("integer", nullable=True, description="sampling seed (recorded)"),
}
_OPENAI_COMMON = {
    "model": Field("string", required=True),
    "max_tokens": Field("integer", nullable=True),
    "temperature": Field("number", nullable=True),
    "top_p": Field("number", nullable=True),
    "seed": Field("integer", nullable=True),
    "n": Field("integer", nullable=True, only=(1,)),
    "stream": Field("boolean", nullable=True),
    "user": Field("string", nullable=True),
}
COMPLETION_FIELDS = {"prompt": Field("string", required=True), **_OPENAI_COMMON}
CHAT_FIELDS = {"messages": Field("array", required=True),
               "max_completion_tokens": Field("integer", nullable=True), **_OPENAI_COMMON}


# --- helpers ---------------------------------------------------------------------------


def authorize(request: web.Request, roles: tuple[str, ...]) -> ApiKey:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise Problem(401, "Unauthorized", "a bearer API key is required",
                      headers={"WWW-Authenticate": 'Bearer realm="audit-ledger"'})
    key = request.app[KEYS].authenticate(token.strip())
    if key is None:
        raise Problem(401, "Unauthorized", "the API key is unknown or revoked",
                      headers={"WWW-Authenticate": 'Bearer error="invalid_token"'})
    if key.role not in roles:
        raise Problem(403, "Forbidden", f"role {key.role!r} may not use this route")
    return key


async def read_body(request: web.Request, spec: dict[str, Field]) -> dict[str, Any]:
    if request.content_type != "application/json":
        raise invalid("Content-Type", "must be application/json", status=415)
    return check_fields(parse_json_body(await request.read()), spec)


def receipt_json(answer: Answer) -> dict[str, Any]:
    return {
        "record_id": answer.receipt.record_id,
        "leaf_index": answer.receipt.leaf_index,
        "leaf_hash": answer.receipt.leaf_hash.hex(),
        "input_salt": answer.output.input_salt.hex(),
        "output_salt": answer.output.output_salt.hex(),
    }


def receipt_headers(answer: Answer) -> dict[str, str]:
    return {"X-Audit-Record-Id": answer.receipt.record_id,
            "X-Audit-Leaf-Index": str(answer.receipt.leaf_index)}


def prepare_audited(request: web.Request, key: ApiKey, prompt: str,
                    params: GenerationParams, started: float) -> PreparedRequest:
    generator = request.app[GENERATOR]
    if not request.app[ANCHOR_WORKER].serving_allowed:
        raise Problem(503, "Service Unavailable", "anchoring lags beyond its SLO and the "
                      "policy is fail-closed", headers={"Retry-After": "5"})
    try:
        return generator.prepare(prompt, params, tenant=key.tenant, started=started)
    except InvalidInputError as exc:
        raise invalid(exc.field, exc.reason) from exc


async def generate_audited(request: web.Request, key: ApiKey, prompt: str,
                           params: GenerationParams, started: float,
                           render: Callable[[Answer], Rendered], body: Any) -> web.Response:
    prepared = prepare_audited(request, key, prompt, params, started)
    batcher, tracer = request.app[BATCHER], request.app[TRACER]

    def caller_alive() -> bool:  # a disconnected caller's request is dropped before generate
        transport = request.transport
        return transport is not None and not transport.is_closing()

    async def work() -> Rendered:
        answer = await batcher.submit(prepared, caller_alive)
        tracer.record(f"{request.method} {request.path}", answer.spans_ns, {
            "audit.record_id": answer.receipt.record_id,
            "audit.leaf_index": answer.receipt.leaf_index,
            "http.request_id": request.headers.get("X-Request-Id", "")})
        return render(answer)

    try:
        idempotency_key = key_from(request)
        if idempotency_key is not None:
            return await request.app[IDEMPOTENCY].answer(request, key.tenant, idempotency_key,
                                                         body, work)
        rendered = await asyncio.wait_for(work(), request.app[SETTINGS].request_timeout_s)
        return web.json_response(rendered[0], headers=rendered[1])
    except QueueFullError as exc:
        raise Problem(503, "Service Unavailable", str(exc), headers={"Retry-After": "1"}) from exc
    except ShuttingDownError as exc:
        raise Problem(503, "Service Unavailable", str(exc), headers={"Retry-After": "5"}) from exc
    except TimeoutError as exc:
        raise Problem(504, "Gateway Timeout", "generation did not finish in time") from exc
    except CallerGoneError as exc:  # nobody reads this answer; it keeps the log clean
        raise Problem(503, "Service Unavailable", "the request was dropped before it ran: "
                      "its caller went away", headers={"Retry-After": "1"}) from exc
    except BackendError as exc:
        # No durable record, no output: the answer is withheld.
        raise Problem(503, "Service Unavailable",
                      f"the audit record could not be committed, so no output is returned: {exc}",
                      headers={"Retry-After": "1"}) from exc


def _params(request: web.Request, body: dict[str, Any], tokens_field: str,
            defaults: GenerationParams) -> GenerationParams:
    def pick(name: str, fallback: Any) -> Any:
        value = body.get(name)
        return fallback if value is None else value

    params = GenerationParams(
        max_new_tokens=pick(tokens_field, defaults.max_new_tokens),
        temperature=pick("temperature", defaults.temperature),
        top_p=pick("top_p", defaults.top_p),
        seed=body.get("seed"),
    )
    try:
        return params.validate(request.app[GENERATOR].limits)
    except InvalidInputError as exc:
        field = tokens_field if exc.field == "max_new_tokens" else exc.field
        raise invalid(field, exc.reason) from exc


def _check_model(request: web.Request, body: dict[str, Any]) -> str:
    name = request.app[GENERATOR].loaded.name
    if body["model"] != name:
        raise Problem(404, "Not Found", f"model {body['model']!r} is not served here; "
                      f"this server serves {name!r}", field="model")
    return name


# --- inference routes ------------------------------------------------------------------


async def generate(request: web.Request) -> web.Response:
    started = time.perf_counter() * 1000
    key = authorize(request, CLIENT_ROLES)
    body = await read_body(request, GENERATE_FIELDS)
    params = _params(request, body, "max_new_tokens", GenerationParams())

    def render(answer: Answer) -> Rendered:
        return ({"output": answer.output.text,
                 "finish_reason": answer.output.record.body["data"]["finish_reason"],
                 **receipt_json(answer)}, receipt_headers(answer))

    return await generate_audited(request, key, body["prompt"], params, started, render, body)


async def completions(request: web.Request) -> web.StreamResponse:
    started = time.perf_counter() * 1000
    key = authorize(request, CLIENT_ROLES)
    body = await read_body(request, COMPLETION_FIELDS)
    model = _check_model(request, body)
    params = _params(request, body, "max_tokens", GenerationParams(16, 1.0, 1.0))
    if body.get("stream"):
        prepared = prepare_audited(request, key, body["prompt"], params, started)
        return await stream_answer(request, prepared, model, "text_completion")

    def render(answer: Answer) -> Rendered:
        return _openai_response(answer, model, "text_completion", {
            "text": answer.output.text, "index": 0, "logprobs": None,
        }), receipt_headers(answer)

    return await generate_audited(request, key, body["prompt"], params, started, render, body)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    started = time.perf_counter() * 1000
    key = authorize(request, CLIENT_ROLES)
    body = await read_body(request, CHAT_FIELDS)
    model = _check_model(request, body)
    messages = _check_messages(body["messages"])
    tokens_field = "max_completion_tokens" if body.get("max_completion_tokens") else "max_tokens"
    params = _params(request, body, tokens_field, GenerationParams(64, 1.0, 1.0))
    tokenizer = request.app[GENERATOR].loaded.tokenizer
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if body.get("stream"):
        prepared = prepare_audited(request, key, prompt, params, started)
        return await stream_answer(request, prepared, model, "chat.completion")

    def render(answer: Answer) -> Rendered:
        return _openai_response(answer, model, "chat.completion", {
            "index": 0, "logprobs": None,
            "message": {"role": "assistant", "content": answer.output.text},
        }), receipt_headers(answer)

    return await generate_audited(request, key, prompt, params, started, render, body)


def _check_messages(messages: list[Any]) -> list[dict[str, str]]:
    if not messages:
        raise invalid("messages", "must not be empty")
    checked = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or set(message) - {"role", "content", "name"}:
            raise invalid(where, "must be an object with role and content")
        if message.get("role") not in ("system", "user", "assistant"):
            raise invalid(f"{where}.role", "must be system, user or assistant")
        if not isinstance(message.get("content"), str):
            raise invalid(f"{where}.content", "must be a string")
        checked.append({"role": message["role"], "content": message["content"]})
    return checked


def _openai_response(
    answer: Answer, model: str, kind: str, choice: dict[str, Any]
) -> dict[str, Any]:
    data = answer.output.record.body["data"]
    prompt_tokens, completion_tokens = data["input_token_count"], data["output_token_count"]
    choice["finish_reason"] = data["finish_reason"]
    prefix = "chatcmpl" if kind == "chat.completion" else "cmpl"
    return {
        "id": f"{prefix}-{answer.receipt.record_id}",
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
        "audit": receipt_json(answer),
    }


async def models(request: web.Request) -> web.Response:
    authorize(request, READER_ROLES)
    loaded = request.app[GENERATOR].loaded
    return web.json_response({"object": "list", "data": [{
        "id": loaded.name, "object": "model", "created": 0, "owned_by": "audit-ledger",
        "digest": loaded.digest, "pinned": loaded.pinned,
    }]})


# --- auditor routes --------------------------------------------------------------------


def _row_json(row: RecordRow, include_bytes: bool = False) -> dict[str, Any]:
    result: dict[str, Any] = {
        "record_id": row.record_id, "leaf_index": row.leaf_index,
        "created_at": row.created_at.isoformat() + "Z", "tenant": row.tenant,
        **{k: v for k, v in row.columns.items()},
        "checkpoint_size": row.checkpoint_size, "anchor_ref": row.anchor_ref,
        "record": json.loads(row.canonical),
    }
    if include_bytes:
        result["canonical_base64"] = base64.b64encode(row.canonical).decode()
    return result


def _parse_time(request: web.Request, name: str) -> datetime | None:
    raw = request.query.get(name)
    if raw is None:
        return None
    try:
        return datetime.fromisoformat(raw)
    except ValueError as exc:
        raise invalid(name, "must be an RFC 3339 timestamp", status=400) from exc


def _int_query(request: web.Request, name: str, default: int | None = None) -> int:
    raw = request.query.get(name)
    if raw is None:
        if default is None:
            raise invalid(name, "is required", status=400)
        return default
    if not raw.isdigit():
        raise invalid(name, "must be a non-negative integer", status=400)
    return int(raw)


QUERY_PARAMS = ("since", "until", "limit", "cursor", *QUERY_FILTERS)


async def list_records(request: web.Request) -> web.Response:
    key = authorize(request, READER_ROLES)
    for name in request.query:
        if name not in QUERY_PARAMS:
            raise invalid(name, f"unknown query parameter {name!r}", status=400)
    filters = {name: request.query.get(name) for name in QUERY_FILTERS}
    if key.role == "client":
        if filters["tenant"] not in (None, key.tenant):
            raise Problem(403, "Forbidden", "a client reads only its own tenant's records",
                          field="tenant")
        filters["tenant"] = key.tenant
    limit = _int_query(request, "limit", 100)
    ledger = request.app[LEDGER]
    try:
        rows, cursor = await asyncio.to_thread(
            lambda: ledger.query(since=_parse_time(request, "since"),
                                 until=_parse_time(request, "until"), limit=limit,
                                 cursor=request.query.get("cursor"), **filters))
    except InvalidInputError as exc:
        raise invalid(exc.field, exc.reason, status=400) from exc
    return web.json_response({"records": [_row_json(r) for r in rows], "next_cursor": cursor})


async def _visible_record(request: web.Request) -> RecordRow:
    key = authorize(request, READER_ROLES)
    record_id = request.match_info["record_id"]
    row = await asyncio.to_thread(request.app[LEDGER].get_record, record_id)
    # A client asking for another tenant's record learns nothing, not even that it exists.
    if row is None or (key.role == "client" and row.tenant != key.tenant):
        raise Problem(404, "Not Found", f"no record {record_id!r}")
    return row


async def get_record(request: web.Request) -> web.Response:
    row = await _visible_record(request)
    return web.json_response(_row_json(row, include_bytes=True))


async def record_proof(request: web.Request) -> web.Response:
    row = await _visible_record(request)
    ledger = request.app[LEDGER]
    if "tree_size" in request.query:  # a proof to one given, already sealed checkpoint
        size = _int_query(request, "tree_size")
        latest = await asyncio.to_thread(ledger.checkpoint, size)
        if latest is None or latest.size <= row.leaf_index:
            raise invalid("tree_size", f"no checkpoint of size {size} covers this record",
                          status=400)
    else:
        latest = await asyncio.to_thread(ledger.latest_checkpoint)
    if latest is None or latest.size <= row.leaf_index:
        await asyncio.to_thread(request.app[INTEGRATOR].seal_now)
        latest = await asyncio.to_thread(ledger.latest_checkpoint)
    if latest is None or latest.size <= row.leaf_index:
        raise Problem(503, "Service Unavailable", "the record is not yet covered by a "
                      "checkpoint", headers={"Retry-After": "1"})
    # Both reads in the worker thread: the event loop never waits on the database.
    proof, leaf_hash = await asyncio.to_thread(
        lambda: (ledger.inclusion_proof(row.leaf_index, latest.size),
                 ledger.leaf_hash(row.leaf_index)))
    return web.json_response({
        "record_id": row.record_id, "leaf_index": row.leaf_index,
        "leaf_hash": leaf_hash.hex(), "tree_size": latest.size,
        "inclusion_proof": [h.hex() for h in proof], "checkpoint": latest.note.decode(),
    })


async def latest_checkpoint(request: web.Request) -> web.Response:
    authorize(request, READER_ROLES)
    latest = await asyncio.to_thread(request.app[LEDGER].latest_checkpoint)
    if latest is None:
        raise Problem(404, "Not Found", "no checkpoint has been sealed yet")
    return web.json_response({"tree_size": latest.size, "root": latest.root.hex(),
                              "checkpoint": latest.note.decode()})


async def anchored_checkpoint(request: web.Request) -> web.Response:
    authorize(request, READER_ROLES)
    anchored = await asyncio.to_thread(LocalAnchor.latest_row, request.app[LEDGER])
    if anchored is None:
        raise Problem(404, "Not Found", "no checkpoint has been anchored yet")
    return web.json_response({"tree_size": anchored.size, "kind": anchored.kind,
                              "ref": anchored.ref, "checkpoint": anchored.note.decode()})


async def consistency(request: web.Request) -> web.Response:
    authorize(request, READER_ROLES)
    first, second = _int_query(request, "from"), _int_query(request, "to")
    ledger = request.app[LEDGER]
    try:
        proof = await asyncio.to_thread(ledger.consistency_proof, first, second)
    except InvalidInputError as exc:
        raise invalid("from" if exc.field == "from" else "to", exc.reason, status=400) from exc
    return web.json_response({"from": first, "to": second, "proof": [h.hex() for h in proof]})


async def public_key(request: web.Request) -> web.Response:
    authorize(request, READER_ROLES)
    verifier = request.app[SIGNER].verifier()
    return web.json_response({"origin": request.app[SETTINGS].origin,
                              "verifier_key": verifier.encode(),
                              "key_hash": verifier.key_hash.hex()})


# --- operations ------------------------------------------------------------------------


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    checks = {"model_loaded": request.app[GENERATOR].loaded.model is not None}
    status = request.app[ANCHOR_WORKER].current()
    checks["anchoring_within_slo"] = (not status.slo_breached
                                      or request.app[ANCHOR_WORKER].policy == "keep-serving")
    try:
        await asyncio.to_thread(request.app[LEDGER].tree_head)
        checks["ledger_reachable"] = True
    except Exception:  # any failure to read the tree head means not ready
        checks["ledger_reachable"] = False
    checks.update(request.app[SUPERVISOR].status())
    ready = all(checks.values())
    return web.json_response({"ready": ready, "checks": checks}, status=200 if ready else 503)


async def metrics(request: web.Request) -> web.Response:
    payload = await asyncio.to_thread(generate_latest, request.app[METRICS].registry)
    return web.Response(body=payload, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(openapi_document())


# --- the table -------------------------------------------------------------------------


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    summary: str
    body: dict[str, Field] | None = None
    query: tuple[str, ...] = ()
    auth: bool = True


ROUTES = (
    Route("POST", "/v1/generate", generate, "audited generate", GENERATE_FIELDS),
    Route("POST", "/v1/completions", completions, "OpenAI-compatible completion",
          COMPLETION_FIELDS),
    Route("POST", "/v1/chat/completions", chat_completions, "OpenAI-compatible chat",
          CHAT_FIELDS),
    Route("GET", "/v1/models", models, "the served model and its digest"),
    Route("GET", "/v1/records", list_records, "query the mirror", query=QUERY_PARAMS),
    Route("GET", "/v1/records/{record_id}", get_record, "one record with its bytes"),
    Route("GET", "/v1/records/{record_id}/proof", record_proof,
          "inclusion proof to the latest (or a given) checkpoint", query=("tree_size",)),
    Route("GET", "/v1/checkpoints/latest", latest_checkpoint, "the latest signed checkpoint"),
    Route("GET", "/v1/checkpoints/anchored", anchored_checkpoint,
          "the newest anchored checkpoint and where it was anchored"),
    Route("GET", "/v1/checkpoints/consistency", consistency, "consistency proof",
          query=("from", "to")),
    Route("GET", "/v1/log/public-key", public_key, "the log's verifier key"),
    Route("GET", "/healthz", healthz, "liveness", auth=False),
    Route("GET", "/readyz", readyz, "readiness", auth=False),
    Route("GET", "/metrics", metrics, "Prometheus metrics", auth=False),
    Route("GET", "/openapi.json", openapi, "this document", auth=False),
)

PROBLEM_SCHEMA = {"type": "object", "properties": {
    "type": {"type": "string"}, "title": {"type": "string"}, "status": {"type": "integer"},
    "detail": {"type": "string"}, "field": {"type": "string"}, "instance": {"type": "string"}}}


def openapi_document() -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for route in ROUTES:
        problem = {"description": "problem details",
                   "content": {"application/problem+json": {"schema": PROBLEM_SCHEMA}}}
        operation: dict[str, Any] = {
            "summary": route.summary,
            "operationId": route.handler.__name__,
            "responses": {"200": {"description": "success"}, "4XX": problem, "5XX": problem},
        }
        params = [{"name": q, "in": "query", "required": q in ("from", "to") and
                   route.handler is consistency,
                   "schema": {"type": "integer"} if q in ("from", "to", "limit", "tree_size") else
                   {"type": "string"}} for q in route.query]
        if "{record_id}" in route.path:
            params.append({"name": "record_id", "in": "path", "required": True,
                           "schema": {"type": "string"}})
        if params:
            operation["parameters"] = params
        if route.body is not None:
            operation["requestBody"] = {"required": True, "content": {
                "application/json": {"schema": openapi_schema(route.body)}}}
        if route.auth:
            operation["security"] = [{"bearer": []}]
        paths.setdefault(route.path, {})[route.method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "audit-ledger", "version": "1"},
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "paths": paths,
    }
