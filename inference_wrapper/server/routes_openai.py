"""The OpenAI-compatible routes (completions, chat completions, models): their fields,
their answers and their errors in OpenAI's shape."""

from __future__ import annotations

import functools
import time
from typing import Any

from aiohttp import web

from inference_wrapper.audit.batcher import Answer
from inference_wrapper.engine.params import GenerationParams, Limits
from inference_wrapper.server.access import caller
from inference_wrapper.server.appkeys import GENERATOR
from inference_wrapper.server.chat import (
    MAX_MESSAGES,
    MESSAGE_SCHEMA,
    check_messages,
    special_token_texts,
    split_control_tokens,
)
from inference_wrapper.server.generate_service import (
    GENERATE,
    MAX_STOP_CHARS,
    MAX_STOP_SEQUENCES,
    ask_from,
    read_body,
    receipt_headers,
    receipt_json,
    seed_used,
    usage_json,
)
from inference_wrapper.server.idempotency import Rendered
from inference_wrapper.server.problems import Problem, invalid
from inference_wrapper.server.routes_generate import SEED_FIELD, TRUNCATE_FIELD
from inference_wrapper.server.validation import (
    NOT_ONLY_WHITESPACE,
    TEMPERATURE_GAP,
    TEMPERATURE_GAP_REASON,
    Field,
)

MAX_USER_CHARS = 256
# Penalties: this server's sampler applies none, so only their no-op value is accepted
# (and nothing is recorded for it); any other value is refused naming the field.
_PENALTY = Field("number", nullable=True, minimum=-2, maximum=2, only=(0,),
                 description="accepted only as 0 (no penalty); other values are refused",
                 only_reason="this server applies no presence or frequency penalty")


_STREAM_OPTIONS = {"type": "object", "additionalProperties": False,
                   "properties": {"include_usage": {"type": "boolean"}}}


_RESPONSE_FORMAT = {"type": "object", "additionalProperties": False, "required": ["type"],
                    "properties": {"type": {"const": "text"}}}


def _openai_common(limits: Limits) -> dict[str, Field]:
    return {
        "model": Field("string", required=True, description="the served model's id"),
        "max_tokens": Field("integer", nullable=True, minimum=1,
                            maximum=limits.max_new_tokens),
        "temperature": Field("number", nullable=True, minimum=0,
                             maximum=limits.max_temperature,
                             gap=TEMPERATURE_GAP, gap_reason=TEMPERATURE_GAP_REASON,
                             description="0 for greedy decoding, else at least 0.01"),
        "top_p": Field("number", nullable=True, exclusive_minimum=0, maximum=1),
        "seed": SEED_FIELD,
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
        "truncate": TRUNCATE_FIELD,
    }


@functools.lru_cache(maxsize=8)
def completion_fields(limits: Limits) -> dict[str, Field]:
    return {"prompt": Field("string", required=True, min_length=1,
                        pattern=NOT_ONLY_WHITESPACE, pattern_reason="must not be empty",
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


COMPLETION_FIELDS = completion_fields(Limits())
CHAT_FIELDS = chat_fields(Limits())


def _check_model(request: web.Request, body: dict[str, Any]) -> str:
    name = request.app[GENERATOR].loaded.name
    if body["model"] != name:
        raise Problem(404, "Not Found", f"model {body['model']!r} is not served here; "
                      f"this server serves {name!r}", field="model", code="model_not_found")
    return name


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


def system_fingerprint(request: web.Request) -> str:
    """OpenAI's backend-configuration id, here derived from the served model's digest."""
    digest = request.app[GENERATOR].loaded.digest
    return "fp_" + digest.partition(":")[2][:16]


async def completions(request: web.Request) -> web.StreamResponse:
    started = time.perf_counter() * 1000
    key, service = caller(request), request.app[GENERATE]
    body = await read_body(request, completion_fields(request.app[GENERATOR].limits))
    model = _check_model(request, body)
    params = service.params(body, "max_tokens", GenerationParams(16, 1.0, 1.0))
    ask = ask_from(body, "prompt", "user")
    include_usage = _openai_options(body)
    if body.get("stream"):
        return await service.stream(request, key, body["prompt"], params, started, ask, model,
                                    "text_completion", include_usage)

    def render(answer: Answer) -> Rendered:
        return _openai_response(request, answer, model, "text_completion", {
            "text": answer.output.text, "index": 0, "logprobs": None,
        }), receipt_headers(answer)

    return await service.answer(request, key, body["prompt"], params, started, render, body,
                                ask)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    started = time.perf_counter() * 1000
    key, service = caller(request), request.app[GENERATE]
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
    params = service.params(body, tokens_field, GenerationParams(64, 1.0, 1.0))
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ask = ask_from(body, "messages", "user")
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
        return await service.stream(request, key, prompt, params, started, ask, model,
                                    "chat.completion", include_usage)

    def render(answer: Answer) -> Rendered:
        return _openai_response(request, answer, model, "chat.completion", {
            "index": 0, "logprobs": None,
            "message": {"role": "assistant", "content": answer.output.text},
        }), receipt_headers(answer)

    return await service.answer(request, key, prompt, params, started, render, body, ask)


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
    loaded = request.app[GENERATOR].loaded
    return web.json_response({"object": "list", "data": [{
        "id": loaded.name, "object": "model", "created": 0, "owned_by": "audit-ledger",
        "digest": loaded.digest, "pinned": loaded.pinned,
    }]})
