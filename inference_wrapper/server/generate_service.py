"""The generate service: what every generate route does once its body is checked.

Built in the app factory from the generator, the batcher, the idempotency layer and the
tracer; handlers call it and render the answer in their own shape. It prepares a request
(anchoring gate, prompt and parameter checks), runs it through the batcher (with its
Idempotency-Key when one was sent) and maps every failure to one answer.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from inference_wrapper.audit.batcher import (
    Answer,
    Batcher,
    CallerGoneError,
    QueueFullError,
    ShuttingDownError,
)
from inference_wrapper.audit.generator import AuditedGenerator, PreparedRequest
from inference_wrapper.engine.contract import ContextLengthError
from inference_wrapper.engine.params import GenerationParams
from inference_wrapper.engine.protocol import EngineDownError
from inference_wrapper.server.appkeys import SETTINGS
from inference_wrapper.server.content import subject_from
from inference_wrapper.server.idempotency import Idempotency, Rendered, key_from
from inference_wrapper.server.metrics import Metrics
from inference_wrapper.server.problems import CommittedProblem, Problem, invalid, not_admitted
from inference_wrapper.server.streaming import stream_answer
from inference_wrapper.server.tracing import PhaseTracer
from inference_wrapper.server.validation import Field, read_json_body
from ledger.anchor.worker import AnchorWorker
from ledger.error_map import http_status_for
from ledger.errors import BackendError, InvalidInputError
from ledger.store.apikeys import ApiKey
from ledger.vault_errors import ContentNotKeptError

MAX_STOP_SEQUENCES = 4  # as OpenAI allows


MAX_STOP_CHARS = 1024  # per stop string: OpenAI sets no bound; this one is generous


INLINE_PREPARE_CHARS = 512  # longer prompts are validated and counted in a worker thread


@dataclass(frozen=True)
class Ask:
    """What a generate route asks of the model, beyond prompt and parameters."""

    field: str = "prompt"  # the input a prompt error names
    truncate: bool = False
    stop: tuple[str, ...] = ()
    user: str | None = None
    subject: str | None = None  # data-subject id (content vault only)


def stops_from(body: dict[str, Any]) -> tuple[str, ...]:
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


def ask_from(body: dict[str, Any], field: str, subject_field: str) -> Ask:
    return Ask(field=field, truncate=body.get("truncate") == "left", stop=stops_from(body),
               user=body.get("user"), subject=subject_from(body, subject_field))


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


class GenerateService:
    def __init__(self, generator: AuditedGenerator, batcher: Batcher,
                 idempotency: Idempotency, tracer: PhaseTracer, metrics: Metrics,
                 anchor_worker: AnchorWorker, request_timeout_s: float) -> None:
        self.generator, self.batcher, self.idempotency = generator, batcher, idempotency
        self.tracer, self.metrics, self.anchor_worker = tracer, metrics, anchor_worker
        self.request_timeout_s = request_timeout_s

    def params(self, body: dict[str, Any], tokens_field: str,
               defaults: GenerationParams) -> GenerationParams:
        """The generation parameters a body asks for, over the route's defaults."""
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
            return params.validate(self.generator.limits)
        except InvalidInputError as exc:
            field = tokens_field if exc.field == "max_new_tokens" else exc.field
            raise invalid(field, exc.reason) from exc

    async def prepare(self, key: ApiKey, prompt: str, params: GenerationParams,
                      started: float, ask: Ask = Ask()) -> PreparedRequest:
        generator = self.generator
        if not self.anchor_worker.serving_allowed:
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
            raise invalid(ask.field if exc.field == "prompt" else exc.field,
                          exc.reason) from exc
        self.metrics.observe("parse", prepared.parse_ms / 1000.0)
        return prepared

    async def answer(self, request: web.Request, key: ApiKey, prompt: str,
                     params: GenerationParams, started: float,
                     render: Callable[[Answer], Rendered], body: Any,
                     ask: Ask = Ask()) -> web.Response:
        """Generate, commit the record, answer with ``render``'s body and headers."""
        prepared = await self.prepare(key, prompt, params, started, ask)
        batcher, tracer = self.batcher, self.tracer

        def caller_alive() -> bool:  # a disconnected caller's request is dropped early
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
                return await self.idempotency.answer(request, key.tenant, idempotency_key,
                                                     body, work)
            async with asyncio.timeout(self.request_timeout_s):  # no extra task
                rendered = await work()
            return web.json_response(rendered[0], headers=rendered[1])
        except (QueueFullError, ShuttingDownError, EngineDownError, TimeoutError) as exc:
            raise not_admitted(exc) from exc
        except CallerGoneError as exc:  # nobody reads this answer; it keeps the log clean
            raise Problem(503, "Service Unavailable", "the request was dropped before it "
                          "ran: its caller went away", headers={"Retry-After": "1"}) from exc
        except BackendError as exc:
            # No durable record, no output: the answer is withheld. The error's own text
            # may hold SQL and the parameters of a whole group (other tenants' records).
            raise Problem(http_status_for(exc), "Service Unavailable",
                          "the audit record could not be committed, so no output is "
                          "returned", headers={"Retry-After": "1"}) from exc

    async def stream(self, request: web.Request, key: ApiKey, prompt: str,
                     params: GenerationParams, started: float, ask: Ask, model: str,
                     kind: str, include_usage: bool) -> web.StreamResponse:
        """``stream: true``: server-sent events (see ``streaming``)."""
        _refuse_idempotency_key_on_streams(request)
        prepared = await self.prepare(key, prompt, params, started, ask)
        return await stream_answer(request, prepared, model, kind,
                                   include_usage=include_usage)


def _refuse_idempotency_key_on_streams(request: web.Request) -> None:
    # A replayed stream would need its chunks stored too; refuse rather than ignore the
    # key and create a second pair of records on a retry.
    if request.headers.get("Idempotency-Key") is not None:
        raise invalid("Idempotency-Key", "is not supported with stream: true (send the "
                      "request without streaming to make it idempotent)", status=400)


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


GENERATE = web.AppKey("generate_service", GenerateService)


async def read_body(request: web.Request, spec: dict[str, Field]) -> dict[str, Any]:
    return await read_json_body(request, spec, request.app[SETTINGS].body_read_timeout_s)
