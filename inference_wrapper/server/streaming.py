"""``stream: true`` on the OpenAI routes, over server-sent events.

The rule: no token leaves the server until a start record naming the request (input
commitment, fingerprints, parameters; ``audit-stream-start/v1``) is durable, and the
request's completed record (output commitment, naming the start record) is committed
before the final chunk, which carries the receipt. Between the two, text is sent while
the batch generates; see docs/decisions/0017-streaming-records.md.

What is sent is only text that can no longer change (``streamable_text``): the deltas
joined are exactly the text the completed record commits to. The response headers go
with the first text, so a failure before any text (queue full, the start record or the
completed record not committed, the content vault) is still an ordinary error answer
(OpenAI's error object). After text was sent, a failure ends the stream with a
``data: {"error": {...}}`` line and no ``[DONE]``: OpenAI's clients raise on it, and its
message says plainly whether the completed record was committed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import replace
from typing import Any

from aiohttp import web

from inference_wrapper.audit.batcher import Answer, QueueFullError, ShuttingDownError, TokenFeed
from inference_wrapper.audit.generator import PreparedRequest, RecordNotBuiltError
from inference_wrapper.engine.generate import streamable_text
from inference_wrapper.engine.protocol import EngineDownError
from inference_wrapper.server.appkeys import BATCHER, GENERATOR, JOURNAL, SETTINGS
from inference_wrapper.server.problems import CommittedProblem, Problem, invalid, not_admitted
from ledger.error_map import http_status_for
from ledger.errors import BackendError
from ledger.vault_errors import ContentNotKeptError

log = logging.getLogger(__name__)


class _Sse:
    """One stream's chunks; the response (headers) is prepared with the first write."""

    def __init__(self, request: web.Request, kind: str, model: str, start_id: str,
                 include_usage: bool = False) -> None:
        self.request = request
        self.include_usage = include_usage
        self.chat = kind == "chat.completion"
        self.chunk_id = f"{'chatcmpl' if self.chat else 'cmpl'}-{start_id}"
        self.object_name = "chat.completion.chunk" if self.chat else "text_completion"
        self.model, self.start_id = model, start_id
        self.created = int(time.time())
        self.response: web.StreamResponse | None = None
        self.gone = False  # the caller disconnected: nothing more is written

    @property
    def started(self) -> bool:
        return self.response is not None

    def sent(self) -> web.StreamResponse:
        assert self.response is not None, "a stream ends after its first write"
        return self.response

    async def _write(self, data: bytes) -> None:
        if self.gone:
            return
        try:
            if self.response is None:
                response = web.StreamResponse(headers={
                    "Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                    "X-Audit-Stream-Start-Record-Id": self.start_id})
                self.response = response
                await response.prepare(self.request)
                if self.chat:
                    await response.write(self._chunk({
                        "index": 0, "delta": {"role": "assistant", "content": ""},
                        "logprobs": None, "finish_reason": None}))
            await self.response.write(data)
        except ConnectionResetError:
            # The caller left mid-stream; generation and the completed record go on (they
            # are the audit trail of what was generated), only its salts never arrive.
            self.gone = True
            log.info("a streamed answer's caller left before the end (stream start record "
                     "%s)", self.start_id)

    def _chunk(self, choice: dict[str, Any], **extra: Any) -> bytes:
        payload = {"id": self.chunk_id, "object": self.object_name, "created": self.created,
                   "model": self.model, "choices": [choice], **extra}
        return f"data: {json.dumps(payload)}\n\n".encode()

    async def text(self, delta: str) -> None:
        if self.chat:
            choice = {"index": 0, "delta": {"content": delta}, "logprobs": None,
                      "finish_reason": None}
        else:
            choice = {"index": 0, "text": delta, "logprobs": None, "finish_reason": None}
        await self._write(self._chunk(choice))

    async def final(self, answer: Answer, start_index: int) -> None:
        data = answer.output.record_content["data"]
        choice: dict[str, Any] = {"index": 0, "logprobs": None,
                                  "finish_reason": data["finish_reason"]}
        if self.chat:
            choice["delta"] = {}
        else:
            choice["text"] = ""
        prompt_tokens, completion_tokens = data["input_token_count"], data["output_token_count"]
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                 "total_tokens": prompt_tokens + completion_tokens}
        await self._write(self._chunk(choice, usage=usage,
                                      audit=stream_receipt(answer, self.start_id, start_index)))
        if self.include_usage:  # OpenAI's stream_options.include_usage: choices empty
            payload = {"id": self.chunk_id, "object": self.object_name,
                       "created": self.created, "model": self.model, "choices": [],
                       "usage": usage}
            await self._write(f"data: {json.dumps(payload)}\n\n".encode())
        await self._write(b"data: [DONE]\n\n")
        await self.close()

    async def error(self, problem: Problem) -> None:
        """OpenAI's error object on a data line (its clients raise ``APIError`` with
        it as ``body``); no ``[DONE]`` follows."""
        body = json.loads(problem.openai_response().text or "{}")
        await self._write(f"data: {json.dumps(body)}\n\n".encode())
        await self.close()

    async def close(self) -> None:
        if self.response is not None and not self.gone:
            try:
                await self.response.write_eof()
            except ConnectionResetError:
                self.gone = True


async def stream_answer(request: web.Request, prepared: PreparedRequest, model: str,
                        kind: str, *, include_usage: bool = False) -> web.StreamResponse:
    """Commit the start record, stream the text as it is generated, commit the record,
    then send the final chunk with the receipt."""
    app = request.app
    generator, journal, batcher = app[GENERATOR], app[JOURNAL], app[BATCHER]
    try:  # admitted before its start record: a refused stream leaves nothing in the log
        slot = batcher.reserve()
    except (QueueFullError, ShuttingDownError) as exc:
        raise not_admitted(exc) from exc
    try:
        if batcher.log is not None and batcher.log.ref_for(generator.environment()) is None:
            await batcher.log_environment(generator.environment())  # before the start names it
        start = generator.stream_start(prepared, request.path, batcher.log)
        started = await journal.append_async(start)
    except BackendError as exc:  # nothing is in the log; its text may hold SQL: not sent
        slot.release()
        raise Problem(503, "Service Unavailable", "the audit record could not be committed, "
                      "so no output is returned", headers={"Retry-After": "1"}) from exc
    except BaseException:
        slot.release()
        raise
    # The start record is durable: text may leave from here on. Errors from here on leave
    # it in the log, and each says what else is there.
    feed = TokenFeed()
    pending = asyncio.ensure_future(asyncio.wait_for(
        batcher.submit(replace(prepared, stream_start_id=start.record_id), feed=feed,
                       slot=slot),
        app[SETTINGS].request_timeout_s))
    pending.add_done_callback(_retrieved)
    sse = _Sse(request, kind, model, start.record_id, include_usage)
    tokenizer = generator.loaded.tokenizer
    sent, stopped = "", False
    try:
        while not pending.done():
            changed = asyncio.ensure_future(feed.changed.wait())
            try:
                await asyncio.wait([pending, changed], return_when=asyncio.FIRST_COMPLETED)
            finally:
                changed.cancel()
            feed.changed.clear()  # tokens that arrive while we write set it again
            if pending.done() or stopped or sse.gone:
                continue
            text, stopped = streamable_text(tokenizer, feed.ids, prepared.stop)
            if len(text) > len(sent) and text.startswith(sent):
                await sse.text(text[len(sent):])
                sent = text
        answer = pending.result()
    except Exception as exc:
        problem = failure(exc, start.record_id, streaming=sse.started)
        if not sse.started:
            raise problem from exc
        if not isinstance(problem, CommittedProblem) and not isinstance(
                exc, TimeoutError | RecordNotBuiltError):  # the latter: logged at sealing
            log.error("a stream failed after text was sent (stream start record %s)",
                      start.record_id, exc_info=exc)
        await sse.error(problem)
        return sse.sent()

    final_text = answer.output.text
    if not final_text.startswith(sent):
        # A bug: the deltas must join to the committed text. The receipt is withheld: it
        # would open a commitment to text other than what was streamed.
        log.error("streamed text is not a prefix of the recorded output (record %s, stream "
                  "start record %s): the final chunk is withheld",
                  answer.receipt.record_id, start.record_id)
        await sse.error(Problem(500, "Internal Server Error", "the text streamed so far "
                                "differs from the output the completed record "
                                f"{answer.receipt.record_id} commits to; its receipt is "
                                "withheld (stream start record "
                                f"{start.record_id})"))
        return sse.sent()
    if final_text[len(sent):]:  # what was held back, or all of it if nothing streamed
        await sse.text(final_text[len(sent):])
    await sse.final(answer, started.leaf_index)
    return sse.sent()


def _retrieved(task: asyncio.Future[Answer]) -> None:
    """Its outcome is read by the handler, unless the handler itself was cancelled."""
    if not task.cancelled():
        task.exception()


def failure(error: BaseException, start_id: str, *, streaming: bool) -> Problem:
    """What to answer (or, once text was sent, what the error line says) when the
    request fails after its start record committed."""
    if isinstance(error, QueueFullError | ShuttingDownError | EngineDownError | TimeoutError):
        return not_admitted(error, f" (stream start record {start_id}; the completed record "
                            "may still be committed)" if streaming else "")
    if isinstance(error, ContentNotKeptError):  # before BackendError: its record did commit
        return not_kept(error, start_id)
    if isinstance(error, BackendError):
        if streaming:
            return Problem(503, "Service Unavailable", "the audit record could not be "
                           "committed: the text streamed so far has no completed record "
                           f"(only the request's stream start record {start_id} is in the "
                           "log)")
        return Problem(503, "Service Unavailable", "the audit record could not be committed, "
                       "so no output is returned (only the request's stream start record "
                       f"{start_id} is in the log)", headers={"Retry-After": "1"})
    if isinstance(error, RecordNotBuiltError):  # this request alone; no output follows
        return invalid(error.field, f"{error.reason} (only its stream start record "
                       f"{start_id} is in the log"
                       + ("; the text streamed so far has no completed record)" if streaming
                          else ")"))
    if not streaming:
        raise error
    return Problem(500, "Internal Server Error", "generation failed: the audit record could "
                   "not be committed, the text streamed so far has no completed record "
                   f"(stream start record {start_id})")


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
