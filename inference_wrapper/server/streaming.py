"""``stream: true`` on the OpenAI routes, over server-sent events.

The rule: no token leaves the server until a start record naming the request (input
commitment, fingerprints, parameters; ``audit-stream-start/v1``) is durable, and the
request's completed record (output commitment, naming the start record) is committed
before the final chunk, which carries the receipt. Generation runs to completion in the
batcher before the first chunk is sent (no token-by-token streaming from the model yet);
see docs/decisions/0017-streaming-records.md.

So every failure comes before the response headers and is an ordinary error answer
(OpenAI's error object), never an event inside the stream. Once the start record is
committed, an error says what else the log holds: a record whose content the vault could
not keep is named (``record_id``, ``stream_start_record_id``), as without streaming.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from dataclasses import replace
from typing import Any

from aiohttp import web

from inference_wrapper.batcher import Answer, QueueFullError, ShuttingDownError
from inference_wrapper.generator import PreparedRequest
from inference_wrapper.server.appkeys import BATCHER, GENERATOR, LEDGER, SETTINGS
from inference_wrapper.server.problems import CommittedProblem, Problem
from ledger.error_map import http_status_for
from ledger.errors import BackendError
from ledger.vault_errors import ContentNotKeptError

log = logging.getLogger(__name__)
_PIECE = re.compile(r"\s*\S+\s*|\s+")  # words with their spacing: chunk boundaries


def pieces(text: str) -> list[str]:
    """The text cut at word boundaries; joined again they are exactly ``text``."""
    return _PIECE.findall(text) or [""]


async def stream_answer(request: web.Request, prepared: PreparedRequest, model: str,
                        kind: str) -> web.StreamResponse:
    """Commit the start record, generate, commit the record, then stream the chunks."""
    app = request.app
    generator, ledger, batcher = app[GENERATOR], app[LEDGER], app[BATCHER]
    start = generator.stream_start(prepared, request.path)
    try:
        started = await ledger.append_async(start)
    except BackendError as exc:  # nothing is in the log; its text may hold SQL: not sent
        raise Problem(503, "Service Unavailable", "the audit record could not be committed, "
                      "so no output is returned", headers={"Retry-After": "1"}) from exc
    # Errors from here on leave the start record in the log: each says what else is there.
    try:
        answer = await asyncio.wait_for(batcher.submit(replace(prepared,
                                                               stream_start_id=start.record_id)),
                                        app[SETTINGS].request_timeout_s)
    except QueueFullError as exc:
        raise Problem(503, "Service Unavailable", str(exc), headers={"Retry-After": "1"}) from exc
    except ShuttingDownError as exc:
        raise Problem(503, "Service Unavailable", str(exc), headers={"Retry-After": "5"}) from exc
    except TimeoutError as exc:
        raise Problem(504, "Gateway Timeout", "generation did not finish in time") from exc
    except ContentNotKeptError as exc:  # before BackendError: its record did commit
        raise not_kept(exc, start.record_id) from exc
    except BackendError as exc:
        raise Problem(503, "Service Unavailable", "the audit record could not be committed, "
                      "so no output is returned (only the request's stream start record "
                      f"{start.record_id} is in the log)", headers={"Retry-After": "1"}) from exc

    # Both records are durable from here on: the chunks may leave.
    chat = kind == "chat.completion"
    chunk_id = f"{'chatcmpl' if chat else 'cmpl'}-{start.record_id}"
    created = int(time.time())
    object_name = "chat.completion.chunk" if chat else "text_completion"
    response = web.StreamResponse(headers={
        "Content-Type": "text/event-stream", "Cache-Control": "no-cache",
        "X-Audit-Record-Id": answer.receipt.record_id,
        "X-Audit-Stream-Start-Record-Id": start.record_id})
    await response.prepare(request)

    def chunk(choice: dict[str, Any], **extra: Any) -> bytes:
        payload = {"id": chunk_id, "object": object_name, "created": created,
                   "model": model, "choices": [choice], **extra}
        return f"data: {json.dumps(payload)}\n\n".encode()

    try:
        if chat:
            await response.write(chunk({"index": 0, "delta": {"role": "assistant", "content": ""},
                                        "logprobs": None, "finish_reason": None}))
        for piece in pieces(answer.output.text):
            if chat:
                choice = {"index": 0, "delta": {"content": piece}, "logprobs": None,
                          "finish_reason": None}
            else:
                choice = {"index": 0, "text": piece, "logprobs": None, "finish_reason": None}
            await response.write(chunk(choice))
        data = answer.output.record.body["data"]
        final: dict[str, Any] = {"index": 0, "logprobs": None,
                                 "finish_reason": data["finish_reason"]}
        if chat:
            final["delta"] = {}
        else:
            final["text"] = ""
        prompt_tokens, completion_tokens = data["input_token_count"], data["output_token_count"]
        await response.write(chunk(final, usage={
            "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens},
            audit=stream_receipt(answer, start.record_id, started.leaf_index)))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
    except ConnectionResetError:
        # The caller left mid-stream: both records are committed, but the salts in the
        # final chunk never reached it (decision 17).
        log.info("a streamed answer's caller left before the end")
    return response


def not_kept(error: ContentNotKeptError, start_id: str) -> Problem:
    """Both records are committed, the content was not kept: no chunk leaves (no output,
    no salts, as without streaming), and the error names both records. Streams take no
    Idempotency-Key, so a retry is a new request: ``Retry-After`` stays."""
    status = http_status_for(error)
    if error.record_id is None:
        return Problem(status, "Service Unavailable", str(error), headers={"Retry-After": "1"})
    return CommittedProblem(status, "Service Unavailable",
                            f"{error} (record {error.record_id}, stream start record "
                            f"{start_id})", error.record_id, headers={"Retry-After": "1"},
                            stream_start_record_id=start_id)


def stream_receipt(answer: Answer, start_id: str, start_index: int) -> dict[str, Any]:
    """Both records' ids and leaf indexes, and the salts that open their commitments
    (the start record's input commitment uses the same input salt)."""
    receipt: dict[str, Any] = {
        "stream_start_record_id": start_id,
        "stream_start_leaf_index": start_index,
        "record_id": answer.receipt.record_id,
        "leaf_index": answer.receipt.leaf_index,
        "leaf_hash": answer.receipt.leaf_hash.hex(),
        "input_salt": answer.output.input_salt.hex(),
        "output_salt": answer.output.output_salt.hex(),
    }
    if answer.output.user_salt is not None:  # opens the record's user_commitment
        receipt["user_salt"] = answer.output.user_salt.hex()
    return receipt
