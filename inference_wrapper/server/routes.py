"""The route table: one entry per route, feeding both aiohttp and /openapi.json."""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from inference_wrapper.audit.batcher import (
    Answer,
    CallerGoneError,
    QueueFullError,
    ShuttingDownError,
)
from inference_wrapper.audit.generator import PreparedRequest
from inference_wrapper.engine.contract import ContextLengthError
from inference_wrapper.engine.params import MAX_SEED, GenerationParams, Limits
from inference_wrapper.engine.protocol import EngineDownError
from inference_wrapper.server.appkeys import (
    ANCHOR_WORKER,
    BATCHER,
    GENERATOR,
    IDEMPOTENCY,
    INTEGRATOR,
    JOURNAL,
    KEYS,
    LEDGER,
    LIFECYCLE,
    METRICS,
    SETTINGS,
    SIGNER,
    SUPERVISOR,
    TRACER,
)
from inference_wrapper.server.chat import (
    MAX_MESSAGES,
    MESSAGE_SCHEMA,
    check_messages,
    special_token_texts,
    split_control_tokens,
)
from inference_wrapper.server.content import (
    ERASE_FIELDS,
    POLICY_FIELDS,
    erase,
    get_policy,
    put_policy,
    record_content,
    subject_from,
)
from inference_wrapper.server.idempotency import Rendered, key_from
from inference_wrapper.server.problems import CommittedProblem, Problem, invalid, not_admitted
from inference_wrapper.server.replica import replica_status
from inference_wrapper.server.streaming import stream_answer
from inference_wrapper.server.validation import (
    MAX_QUERY_INT,
    Field,
    openapi_schema,
    query_int,
    read_json_body,
)
from ledger.anchor.store import SqlAnchorStore
from ledger.error_map import http_status_for
from ledger.errors import BackendError, InvalidInputError
from ledger.store.apikeys import ApiKey
from ledger.store.sql import QUERY_FILTERS, RecordRow, decode_cursor
from ledger.vault_errors import ContentNotKeptError
from ledger.witness.cosignatures import cosigned_note

CLIENT_ROLES = ("client", "admin")
READER_ROLES = ("client", "auditor", "admin")
MAX_STOP_SEQUENCES = 4  # as OpenAI allows
MAX_STOP_CHARS = 1024  # per stop string: OpenAI sets no bound; this one is generous
MAX_USER_CHARS = 256
MAX_RECORDS_LIMIT = 10_000
INLINE_PREPARE_CHARS = 512  # longer prompts are validated and counted in a worker thread

_TRUNCATE = Field("string", nullable=True, only=("left",),
                  description="absent or null: a prompt longer than the tokenization "
                  "contract's max_length is refused; \"left\": keep its last max_length "
                  "tokens (recorded as truncated)")
_SEED = Field("integer", nullable=True, minimum=0, maximum=MAX_SEED,
              description="sampling seed (recorded; the seed used is echoed back)")
# Penalties: this server's sampler applies none, so only their no-op value is accepted
# (and nothing is recorded for it); any other value is refused naming the field.
_PENALTY = Field("number", nullable=True, minimum=-2, maximum=2, only=(0,),
                 description="accepted only as 0 (no penalty); other values are refused",
                 only_reason="this server applies no presence or frequency penalty")
_STREAM_OPTIONS = {"type": "object", "additionalProperties": False,
                   "properties": {"include_usage": {"type": "boolean"}}}
_RESPONSE_FORMAT = {"type": "object", "additionalProperties": False, "required": ["type"],
                    "properties": {"type": {"const": "text"}}}


@functools.lru_cache(maxsize=8)
def generate_fields(limits: Limits) -> dict[str, Field]:
    return {
        "prompt": Field("string", required=True, min_length=1,
                        max_length=limits.max_prompt_bytes,
                        description=f"the prompt text, at most {limits.max_prompt_bytes} "
                        "UTF-8 bytes"),
        "max_new_tokens": Field("integer", minimum=1, maximum=limits.max_new_tokens,
                                description="tokens to generate (default 32)"),
        "temperature": Field("number", minimum=0, maximum=limits.max_temperature,
                             description="0 for greedy decoding (default), else at least "
                             "0.01"),
        "top_p": Field("number", exclusive_minimum=0, maximum=1,
                       description="nucleus sampling mass (default 1)"),
        "seed": _SEED,
        "truncate": _TRUNCATE,
        "subject": Field("string", nullable=True, min_length=1, max_length=256,
                         description="data-subject id, kept only as a keyed hash in the "
                         "content vault"),
    }


def _openai_common(limits: Limits) -> dict[str, Field]:
    return {
        "model": Field("string", required=True, description="the served model's id"),
        "max_tokens": Field("integer", nullable=True, minimum=1,
                            maximum=limits.max_new_tokens),
        "temperature": Field("number", nullable=True, minimum=0,
                             maximum=limits.max_temperature,
                             description="0 for greedy decoding, else at least 0.01"),
        "top_p": Field("number", nullable=True, exclusive_minimum=0, maximum=1),
        "seed": _SEED,
        "n": Field("integer", nullable=True, only=(1,),
                   description="choices per request: this server returns exactly one",
                   only_reason="one choice per request (send several requests for more)"),
        "stream": Field("boolean", nullable=True,
                        description="server-sent events; the first chunk leaves only after "
                        "a start record is durable, the final one carries the receipt"),
        "stream_options": Field("object", nullable=True, items=_STREAM_OPTIONS,
                                description="with stream: include_usage adds a last chunk "
                                "with empty choices and the usage"),
        "stop": Field("string-or-array", nullable=True, max_length=MAX_STOP_SEQUENCES,
                      items={"type": "string", "minLength": 1, "maxLength": MAX_STOP_CHARS},
                      description="the output ends before the first of these sequences "
                      f"(finish_reason stop); at most {MAX_STOP_SEQUENCES}, each 1 to "
                      f"{MAX_STOP_CHARS} characters"),
        "user": Field("string", nullable=True, min_length=1, max_length=MAX_USER_CHARS,
                      description="the end user; recorded only as a salted commitment, "
                      "its salt returned in audit.user_salt"),
        "presence_penalty": _PENALTY,
        "frequency_penalty": _PENALTY,
        "response_format": Field("object", nullable=True, items=_RESPONSE_FORMAT,
                                 description="only {\"type\": \"text\"}: this server "
                                 "does not constrain output to JSON"),
        "truncate": _TRUNCATE,
    }


@functools.lru_cache(maxsize=8)
def completion_fields(limits: Limits) -> dict[str, Field]:
    return {"prompt": Field("string", required=True, min_length=1,
                            max_length=limits.max_prompt_bytes),
            **_openai_common(limits)}


@functools.lru_cache(maxsize=8)
def chat_fields(limits: Limits) -> dict[str, Field]:
    return {"messages": Field("array", required=True, min_length=1, max_length=MAX_MESSAGES,
                              items=MESSAGE_SCHEMA),
            "max_completion_tokens": Field(
                "integer", nullable=True, minimum=1, maximum=limits.max_new_tokens,
                description="supersedes max_tokens when both are given"),
            **_openai_common(limits)}


# Field specs under the default limits (kept for callers that import them).
GENERATE_FIELDS = generate_fields(Limits())
COMPLETION_FIELDS = completion_fields(Limits())
CHAT_FIELDS = chat_fields(Limits())


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


def readable_tenant(key: ApiKey) -> str | None:
    """The one tenant a key may read, or None for every tenant.

    Auditors read every tenant; an admin only its own, unless it was created for all
    tenants (``keys create --role admin --all-tenants``).
    """
    if key.role == "auditor" or (key.role == "admin" and key.all_tenants):
        return None
    return key.tenant


async def read_body(request: web.Request, spec: dict[str, Field]) -> dict[str, Any]:
    return await read_json_body(request, spec, request.app[SETTINGS].body_read_timeout_s)


def receipt_json(answer: Answer) -> dict[str, Any]:
    receipt = {
        "record_id": answer.receipt.record_id,
        "leaf_index": answer.receipt.leaf_index,
        "leaf_hash": answer.receipt.leaf_hash.hex(),
        "input_salt": answer.output.input_salt.hex(),
        "output_salt": answer.output.output_salt.hex(),
    }
    if answer.output.user_salt is not None:
        receipt["user_salt"] = answer.output.user_salt.hex()
    return receipt


def _refuse_idempotency_key_on_streams(request: web.Request) -> None:
    # A replayed stream would need its chunks stored too; refuse rather than ignore the
    # key and create a second pair of records on a retry.
    if request.headers.get("Idempotency-Key") is not None:
        raise invalid("Idempotency-Key", "is not supported with stream: true (send the "
                      "request without streaming to make it idempotent)", status=400)


def receipt_headers(answer: Answer) -> dict[str, str]:
    return {"X-Audit-Record-Id": answer.receipt.record_id,
            "X-Audit-Leaf-Index": str(answer.receipt.leaf_index)}


def usage_json(answer: Answer) -> dict[str, int]:
    data = answer.output.record_content["data"]
    prompt_tokens, completion_tokens = data["input_token_count"], data["output_token_count"]
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def seed_used(answer: Answer) -> int | None:
    seed: int | None = answer.output.record_content["data"]["generation"]["seed"]
    return seed


@dataclass(frozen=True)
class Ask:
    """What a generate route asks of the model, beyond prompt and parameters."""

    field: str = "prompt"  # the input a prompt error names
    truncate: bool = False
    stop: tuple[str, ...] = ()
    user: str | None = None
    subject: str | None = None  # data-subject id (content vault only)


async def prepare_audited(request: web.Request, key: ApiKey, prompt: str,
                          params: GenerationParams, started: float,
                          ask: Ask = Ask()) -> PreparedRequest:
    generator = request.app[GENERATOR]
    if not request.app[ANCHOR_WORKER].serving_allowed:
        raise Problem(503, "Service Unavailable", "anchoring lags beyond its SLO and the "
                      "policy is fail-closed", headers={"Retry-After": "5"})
    prepare = functools.partial(generator.prepare, prompt, params, tenant=key.tenant,
                                started=started, truncate=ask.truncate, stop=ask.stop,
                                user=ask.user, subject=ask.subject)
    try:
        # Counting a long prompt's tokens takes milliseconds: not on the event loop.
        prepared = (prepare() if len(prompt) <= INLINE_PREPARE_CHARS
                    else await asyncio.to_thread(prepare))
    except ContextLengthError as exc:
        raise invalid(ask.field, exc.reason, code="context_length_exceeded") from exc
    except InvalidInputError as exc:
        raise invalid(ask.field if exc.field == "prompt" else exc.field, exc.reason) from exc
    request.app[METRICS].observe("parse", prepared.parse_ms / 1000.0)
    return prepared


async def generate_audited(request: web.Request, key: ApiKey, prompt: str,
                           params: GenerationParams, started: float,
                           render: Callable[[Answer], Rendered], body: Any,
                           ask: Ask = Ask()) -> web.Response:
    prepared = await prepare_audited(request, key, prompt, params, started, ask)
    batcher, tracer = request.app[BATCHER], request.app[TRACER]

    def caller_alive() -> bool:  # a disconnected caller's request is dropped before generate
        transport = request.transport
        return transport is not None and not transport.is_closing()

    idempotency_key = key_from(request)

    async def work() -> Rendered:
        try:
            answer = await batcher.submit(prepared, caller_alive)
        except ContentNotKeptError as exc:
            raise _not_kept(exc, idempotent=idempotency_key is not None) from exc
        tracer.record(f"{request.method} {request.path}", answer.spans_ns, {
            "audit.record_id": answer.receipt.record_id,
            "audit.leaf_index": answer.receipt.leaf_index,
            "http.request_id": request.headers.get("X-Request-Id", "")})
        return render(answer)

    try:
        if idempotency_key is not None:
            return await request.app[IDEMPOTENCY].answer(request, key.tenant, idempotency_key,
                                                         body, work)
        async with asyncio.timeout(request.app[SETTINGS].request_timeout_s):  # no extra task
            rendered = await work()
        return web.json_response(rendered[0], headers=rendered[1])
    except (QueueFullError, ShuttingDownError, EngineDownError, TimeoutError) as exc:
        raise not_admitted(exc) from exc
    except CallerGoneError as exc:  # nobody reads this answer; it keeps the log clean
        raise Problem(503, "Service Unavailable", "the request was dropped before it ran: "
                      "its caller went away", headers={"Retry-After": "1"}) from exc
    except BackendError as exc:
        # No durable record, no output: the answer is withheld. The error's own text may
        # hold SQL and the parameters of a whole group (other tenants' records): never sent.
        raise Problem(http_status_for(exc), "Service Unavailable",
                      "the audit record could not be committed, so no output is returned",
                      headers={"Retry-After": "1"}) from exc


def _not_kept(error: ContentNotKeptError, idempotent: bool) -> Problem:
    """No output: the record is committed but its content could not be kept."""
    status = http_status_for(error)
    if error.record_id is None:
        return Problem(status, "Service Unavailable", str(error), headers={"Retry-After": "1"})
    if not idempotent:  # sending it again generates again, with a new record
        return CommittedProblem(status, "Service Unavailable", str(error), error.record_id,
                                headers={"Retry-After": "1"})
    # The key is bound to this record for good: the same key answers the same again, so
    # no Retry-After (decision 22).
    return CommittedProblem(
        status, "Service Unavailable",
        f"{error} (record {error.record_id}); this Idempotency-Key stays bound to that "
        "record and answers the same again: send the request with a new key to generate "
        "again", error.record_id)


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
                      f"this server serves {name!r}", field="model", code="model_not_found")
    return name


def _stops(body: dict[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    for i, item in enumerate(stops):
        where = "stop" if isinstance(stop, str) else f"stop[{i}]"
        if not isinstance(item, str):
            raise invalid(where, "must be a string")
        if not 1 <= len(item) <= MAX_STOP_CHARS:
            raise invalid(where, f"must have 1 to {MAX_STOP_CHARS} characters, has "
                          f"{len(item)}")
    return tuple(stops)


def _openai_options(body: dict[str, Any]) -> bool:
    """Check the OpenAI members that only shape the answer; True when a stream should
    end with a usage chunk (stream_options.include_usage)."""
    options = body.get("stream_options")
    if options is not None:
        if not body.get("stream"):
            raise invalid("stream_options", "is allowed only with stream: true")
        for name, value in options.items():
            if name != "include_usage":
                raise invalid(f"stream_options.{name}", f"unknown member {name!r}")
            if not isinstance(value, bool):
                raise invalid("stream_options.include_usage", "must be a boolean")
    response_format = body.get("response_format")
    if response_format is not None and response_format != {"type": "text"}:
        raise invalid("response_format", "this server supports only {\"type\": \"text\"}")
    return bool(options and options.get("include_usage"))


def _ask(body: dict[str, Any], field: str, subject_field: str) -> Ask:
    return Ask(field=field, truncate=body.get("truncate") == "left", stop=_stops(body),
               user=body.get("user"), subject=subject_from(body, subject_field))


def system_fingerprint(request: web.Request) -> str:
    """OpenAI's backend-configuration id, here derived from the served model's digest."""
    digest = request.app[GENERATOR].loaded.digest
    return "fp_" + digest.partition(":")[2][:16]


# --- inference routes ------------------------------------------------------------------


async def generate(request: web.Request) -> web.Response:
    started = time.perf_counter() * 1000
    key = authorize(request, CLIENT_ROLES)
    limits = request.app[GENERATOR].limits
    body = await read_body(request, generate_fields(limits))
    params = _params(request, body, "max_new_tokens", GenerationParams())

    def render(answer: Answer) -> Rendered:
        return ({"output": answer.output.text,
                 "finish_reason": answer.output.record_content["data"]["finish_reason"],
                 "usage": usage_json(answer), "seed": seed_used(answer),
                 **receipt_json(answer)}, receipt_headers(answer))

    return await generate_audited(request, key, body["prompt"], params, started, render, body,
                                  _ask(body, "prompt", "subject"))


async def completions(request: web.Request) -> web.StreamResponse:
    started = time.perf_counter() * 1000
    key = authorize(request, CLIENT_ROLES)
    body = await read_body(request, completion_fields(request.app[GENERATOR].limits))
    model = _check_model(request, body)
    params = _params(request, body, "max_tokens", GenerationParams(16, 1.0, 1.0))
    ask = _ask(body, "prompt", "user")
    include_usage = _openai_options(body)
    if body.get("stream"):
        _refuse_idempotency_key_on_streams(request)
        prepared = await prepare_audited(request, key, body["prompt"], params, started, ask)
        return await stream_answer(request, prepared, model, "text_completion",
                                   include_usage=include_usage)

    def render(answer: Answer) -> Rendered:
        return _openai_response(request, answer, model, "text_completion", {
            "text": answer.output.text, "index": 0, "logprobs": None,
        }), receipt_headers(answer)

    return await generate_audited(request, key, body["prompt"], params, started, render, body,
                                  ask)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    started = time.perf_counter() * 1000
    key = authorize(request, CLIENT_ROLES)
    body = await read_body(request, chat_fields(request.app[GENERATOR].limits))
    model = _check_model(request, body)
    include_usage = _openai_options(body)
    tokenizer = request.app[GENERATOR].loaded.tokenizer
    specials = special_token_texts(tokenizer)
    messages = [{"role": m["role"], "content": split_control_tokens(m["content"], specials)}
                for m in check_messages(body["messages"])]
    # OpenAI: max_completion_tokens supersedes the deprecated max_tokens, 0 included.
    tokens_field = ("max_completion_tokens" if body.get("max_completion_tokens") is not None
                    else "max_tokens")
    params = _params(request, body, tokens_field, GenerationParams(64, 1.0, 1.0))
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ask = _ask(body, "messages", "user")
    if ask.truncate and any(m["role"] == "system" for m in messages):
        # Left truncation cuts the start of the conversation, where the system prompt is:
        # an over-long chat with a system prompt is refused instead of losing it.
        contract = request.app[GENERATOR].contract
        tokens = contract.count(tokenizer, prompt)
        if tokens > contract.max_length:
            raise invalid("truncate", f"the messages are {tokens} tokens, the tokenization "
                          f"contract allows {contract.max_length}, and left truncation would "
                          "drop the system prompt; shorten the conversation",
                          code="context_length_exceeded")
    if body.get("stream"):
        _refuse_idempotency_key_on_streams(request)
        prepared = await prepare_audited(request, key, prompt, params, started, ask)
        return await stream_answer(request, prepared, model, "chat.completion",
                                   include_usage=include_usage)

    def render(answer: Answer) -> Rendered:
        return _openai_response(request, answer, model, "chat.completion", {
            "index": 0, "logprobs": None,
            "message": {"role": "assistant", "content": answer.output.text},
        }), receipt_headers(answer)

    return await generate_audited(request, key, prompt, params, started, render, body, ask)


def _openai_response(
    request: web.Request, answer: Answer, model: str, kind: str, choice: dict[str, Any]
) -> dict[str, Any]:
    data = answer.output.record_content["data"]
    choice["finish_reason"] = data["finish_reason"]
    prefix = "chatcmpl" if kind == "chat.completion" else "cmpl"
    return {
        "id": f"{prefix}-{answer.receipt.record_id}",
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": system_fingerprint(request),
        "choices": [choice],
        "usage": usage_json(answer),
        "seed": seed_used(answer),
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


QUERY_PARAMS = ("since", "until", "limit", "cursor", *QUERY_FILTERS)


async def list_records(request: web.Request) -> web.Response:
    key = authorize(request, READER_ROLES)
    for name in request.query:
        if name not in QUERY_PARAMS:
            raise invalid(name, f"unknown query parameter {name!r}", status=400)
    filters = {name: request.query.get(name) for name in QUERY_FILTERS}
    scope = readable_tenant(key)
    if scope is not None:
        if filters["tenant"] not in (None, scope):
            raise Problem(403, "Forbidden", f"a {key.role} key of tenant {scope!r} reads only "
                          "that tenant's records", field="tenant")
        filters["tenant"] = scope
    limit = query_int(request.query.get("limit"), "limit", default=100, low=1,
                      high=MAX_RECORDS_LIMIT)
    cursor = request.query.get("cursor")
    if cursor is not None:
        try:
            position = decode_cursor(cursor)
        except InvalidInputError as exc:
            raise invalid("cursor", exc.reason, status=400) from exc
        if position > MAX_QUERY_INT:  # a forged cursor must not overflow the SQL integer
            raise invalid("cursor", "is not a cursor this service issued", status=400)
    ledger = request.app[LEDGER]
    try:
        rows, cursor = await asyncio.to_thread(
            lambda: ledger.query(since=_parse_time(request, "since"),
                                 until=_parse_time(request, "until"), limit=limit,
                                 cursor=cursor, **filters))
    except InvalidInputError as exc:
        raise invalid(exc.field, exc.reason, status=400) from exc
    return web.json_response({"records": [_row_json(r) for r in rows], "next_cursor": cursor})


async def _visible_record(request: web.Request) -> RecordRow:
    key = authorize(request, READER_ROLES)
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
    authorize(request, READER_ROLES)
    latest = await asyncio.to_thread(request.app[LEDGER].latest_checkpoint)
    if latest is None:
        raise Problem(404, "Not Found", "no checkpoint has been sealed yet")
    note = await asyncio.to_thread(cosigned_note, request.app[LEDGER], latest.size, latest.note)
    return web.json_response({"tree_size": latest.size, "root": latest.root.hex(),
                              "checkpoint": note.decode()})


async def anchored_checkpoint(request: web.Request) -> web.Response:
    authorize(request, READER_ROLES)
    anchored = await asyncio.to_thread(SqlAnchorStore(request.app[LEDGER]).latest)
    if anchored is None:
        raise Problem(404, "Not Found", "no checkpoint has been anchored yet")
    return web.json_response({"tree_size": anchored.size, "kind": anchored.kind,
                              "ref": anchored.ref, "checkpoint": anchored.note.decode()})


async def consistency(request: web.Request) -> web.Response:
    authorize(request, READER_ROLES)
    first = query_int(request.query.get("from"), "from")
    second = query_int(request.query.get("to"), "to")
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


async def readiness_checks(app: web.Application) -> dict[str, bool]:
    """The named readiness checks (/readyz, and the SLO sampler's availability history)."""
    checks = {"engine_serving": any(e.alive() for e in app[GENERATOR].engines)}
    status = app[ANCHOR_WORKER].current()
    checks["anchoring_within_slo"] = (not status.slo_breached
                                      or app[ANCHOR_WORKER].policy == "keep-serving")
    try:
        await asyncio.to_thread(app[LEDGER].tree_head)
        checks["ledger_reachable"] = True
    except Exception:  # any failure to read the tree head means not ready
        checks["ledger_reachable"] = False
    # Reading is not enough: a full disk or a read-only file fails every append.
    checks["ledger_appending"] = JOURNAL not in app or app[JOURNAL].appending()
    # A misconfigured anchor (unknown channel or chaincode) is named here, not only logged.
    checks["anchor_configured"] = app[ANCHOR_WORKER].config_error is None
    checks.update(app[SUPERVISOR].status())
    return checks


async def readyz(request: web.Request) -> web.Response:
    checks = await readiness_checks(request.app)
    worker = request.app[ANCHOR_WORKER]
    # A misconfiguration, or an anchor holding another history than this log's: both
    # stop anchoring until an operator acts, so both are named here.
    anchor_error = worker.config_error or worker.conflict
    # Not one of the checks: a planned stop is not downtime in the SLO history.
    shutting_down = request.app[LIFECYCLE].shutting_down
    ready = all(checks.values()) and not shutting_down
    body: dict[str, Any] = {"ready": ready, "checks": checks}
    if shutting_down:
        body["shutting_down"] = True
    if anchor_error is not None:
        body["anchor_error"] = anchor_error
    if checks["ledger_reachable"]:
        body["replica"] = await asyncio.to_thread(replica_status, request.app)
    return web.json_response(body, status=200 if ready else 503)


async def metrics(request: web.Request) -> web.Response:
    payload = await asyncio.to_thread(generate_latest, request.app[METRICS].registry)
    return web.Response(body=payload, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def openapi(request: web.Request) -> web.Response:
    generator = request.app[GENERATOR]
    return web.json_response(openapi_document(generator.limits, generator.loaded.name))


# --- the table -------------------------------------------------------------------------


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    summary: str
    body: Callable[[Limits], dict[str, Field]] | None = None
    query: tuple[str, ...] = ()
    auth: bool = True
    openai: bool = False  # errors in OpenAI's shape instead of problem details
    response: dict[str, Any] | None = None  # JSON Schema of the 200 body


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
                     "next_cursor": {"type": ["string", "null"]}}),
    "record": _ROW,
    "proof": _obj({"record_id": _STR, "leaf_index": _INT, "leaf_hash": _HEX,
                   "inclusion_proof": {"type": "array", "items": _HEX}, **_NOTE}),
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

ROUTES = (
    Route("POST", "/v1/generate", generate, "audited generate", generate_fields,
          response=RESPONSES["generate"]),
    Route("POST", "/v1/completions", completions, "OpenAI-compatible completion",
          completion_fields, openai=True, response=RESPONSES["completions"]),
    Route("POST", "/v1/chat/completions", chat_completions, "OpenAI-compatible chat",
          chat_fields, openai=True, response=RESPONSES["chat"]),
    Route("GET", "/v1/models", models, "the served model and its digest", openai=True,
          response=RESPONSES["models"]),
    Route("GET", "/v1/records", list_records, "query the mirror", query=QUERY_PARAMS,
          response=RESPONSES["records"]),
    Route("GET", "/v1/records/{record_id}", get_record, "one record with its bytes",
          response=RESPONSES["record"]),
    Route("GET", "/v1/records/{record_id}/proof", record_proof,
          "inclusion proof to the latest (or a given) checkpoint", query=("tree_size",),
          response=RESPONSES["proof"]),
    Route("GET", "/v1/records/{record_id}/content", record_content,
          "an auditor reads retained content; the read is logged first", query=("purpose",)),
    Route("POST", "/v1/admin/erasures", erase, "erase retained content (crypto-shredding)",
          lambda _limits: ERASE_FIELDS),
    Route("GET", "/v1/admin/retention", get_policy, "the admin's tenant retention policy"),
    Route("PUT", "/v1/admin/retention", put_policy, "set the tenant's retention policy",
          lambda _limits: POLICY_FIELDS),
    Route("GET", "/v1/checkpoints/latest", latest_checkpoint, "the latest signed checkpoint",
          response=RESPONSES["latest"]),
    Route("GET", "/v1/checkpoints/anchored", anchored_checkpoint,
          "the newest anchored checkpoint and where it was anchored",
          response=RESPONSES["anchored"]),
    Route("GET", "/v1/checkpoints/consistency", consistency, "consistency proof",
          query=("from", "to"), response=RESPONSES["consistency"]),
    Route("GET", "/v1/log/public-key", public_key, "the log's verifier key",
          response=RESPONSES["public_key"]),
    Route("GET", "/healthz", healthz, "liveness", auth=False, response=RESPONSES["healthz"]),
    Route("GET", "/readyz", readyz, "readiness", auth=False, response=RESPONSES["readyz"]),
    Route("GET", "/metrics", metrics, "Prometheus metrics", auth=False),
    Route("GET", "/openapi.json", openapi, "this document", auth=False,
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
            success = {"description": "Prometheus text exposition",
                       "content": {"text/plain": {"schema": {"type": "string"}}}}
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
        if params:
            operation["parameters"] = params
        if route.body is not None:
            schema = openapi_schema(route.body(limits))
            if model is not None and "model" in schema["properties"]:
                schema["properties"]["model"] = {**schema["properties"]["model"],
                                                 "enum": [model]}
            operation["requestBody"] = {"required": True, "content": {
                "application/json": {"schema": schema}}}
        if route.auth:
            operation["security"] = [{"bearer": []}]
        paths.setdefault(route.path, {})[route.method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "audit-ledger", "version": "1"},
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "paths": paths,
    }
