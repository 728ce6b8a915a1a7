"""The native generate route (``POST /v1/generate``): its fields and its answer."""

from __future__ import annotations

import functools
import time

from aiohttp import web

from inference_wrapper.audit.batcher import Answer
from inference_wrapper.engine.params import MAX_SEED, GenerationParams, Limits
from inference_wrapper.server.access import caller
from inference_wrapper.server.appkeys import GENERATOR
from inference_wrapper.server.generate_service import (
    GENERATE,
    ask_from,
    read_body,
    receipt_headers,
    receipt_json,
    seed_used,
    usage_json,
)
from inference_wrapper.server.idempotency import Rendered
from inference_wrapper.server.validation import (
    NOT_ONLY_WHITESPACE,
    TEMPERATURE_GAP,
    TEMPERATURE_GAP_REASON,
    Field,
)

TRUNCATE_FIELD = Field("string", nullable=True, only=("left",),
                  description="absent or null: a prompt longer than the tokenization "
                  "contract's max_length is refused; \"left\": keep its last max_length "
                  "tokens (recorded as truncated)")


SEED_FIELD = Field("integer", nullable=True, minimum=0, maximum=MAX_SEED,
              description="sampling seed (recorded; the seed used is echoed back)")


@functools.lru_cache(maxsize=8)
def generate_fields(limits: Limits) -> dict[str, Field]:
    return {
        "prompt": Field("string", required=True, min_length=1,
                        pattern=NOT_ONLY_WHITESPACE, pattern_reason="must not be empty",
                        max_length=limits.max_prompt_bytes,
                        description=f"the prompt text, at most {limits.max_prompt_bytes} "
                        "UTF-8 bytes"),
        "max_new_tokens": Field("integer", minimum=1, maximum=limits.max_new_tokens,
                                description="tokens to generate (default 32)"),
        "temperature": Field("number", minimum=0, maximum=limits.max_temperature,
                             gap=TEMPERATURE_GAP, gap_reason=TEMPERATURE_GAP_REASON,
                             description="0 for greedy decoding (default), else at least "
                             "0.01"),
        "top_p": Field("number", exclusive_minimum=0, maximum=1,
                       description="nucleus sampling mass (default 1)"),
        "seed": SEED_FIELD,
        "truncate": TRUNCATE_FIELD,
        "subject": Field("string", nullable=True, min_length=1, max_length=256,
                         description="data-subject id, kept only as a keyed hash in the "
                         "content vault"),
    }


GENERATE_FIELDS = generate_fields(Limits())


async def generate(request: web.Request) -> web.Response:
    started = time.perf_counter() * 1000
    key, service = caller(request), request.app[GENERATE]
    limits = request.app[GENERATOR].limits
    body = await read_body(request, generate_fields(limits))
    params = service.params(body, "max_new_tokens", GenerationParams())

    def render(answer: Answer) -> Rendered:
        return ({"output": answer.output.text,
                 "finish_reason": answer.output.record_content["data"]["finish_reason"],
                 "usage": usage_json(answer), "seed": seed_used(answer),
                 **receipt_json(answer)}, receipt_headers(answer))

    return await service.answer(request, key, body["prompt"], params, started, render, body,
                                ask_from(body, "prompt", "subject"))
