"""``Idempotency-Key`` on the generate routes: one generate, one record, one answer.

Without the header a request is submitted and awaited as before. With it:

- the key is claimed for (tenant, key) in the receipts store before anything runs;
- the work runs as its own task, so it finishes, commits its record and stores the
  whole answer (salts included) even if the caller timed out (504) or went away;
- a repeat with the same key and body gets the stored answer without generating again;
  a repeat with another body gets 422 naming the header;
- a repeat while the first is still running waits for it (up to the request timeout,
  then 504, and the caller may retry again); see docs/decisions/0016-supervised-workers.md;
- once the record is committed the key is never released: if the answer is an error
  (a ``CommittedProblem``, e.g. the content vault failed), that error is the stored
  answer, and only a failure before the commit lets a retry generate (decision 22);
- each claim has its own owner token: a request whose stale claim was taken over stores
  and releases nothing when it finishes late.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from inference_wrapper.server.problems import CommittedProblem, Problem, invalid
from ledger.store.receipts import ReceiptStore, StoredReceipt

log = logging.getLogger(__name__)

HEADER = "Idempotency-Key"
MAX_KEY_LENGTH = 255

Rendered = tuple[dict[str, Any], dict[str, str]]  # JSON body, headers


def key_from(request: web.Request) -> str | None:
    """The request's idempotency key, checked (printable ASCII, 1 to 255 characters)."""
    raw = request.headers.get(HEADER)
    if raw is None:
        return None
    if not 1 <= len(raw) <= MAX_KEY_LENGTH or not all(" " < c <= "~" for c in raw):
        raise invalid(HEADER, f"must be 1 to {MAX_KEY_LENGTH} printable ASCII characters "
                      "without spaces", status=422)
    return raw


def fingerprint(path: str, body: Any) -> bytes:
    """The same route and JSON body (whatever its spacing or key order) give the same
    fingerprint."""
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(path.encode() + b"\0" + text.encode()).digest()


class Idempotency:
    """The receipts store plus the keys this process is answering right now."""

    def __init__(self, store: ReceiptStore, timeout_s: float) -> None:
        self.store = store
        self.timeout_s = timeout_s
        # A pending claim this old was left by a process that died before answering.
        self.stale_after_s = max(600.0, 10 * timeout_s)
        self._running: dict[tuple[str, str], asyncio.Task[Rendered]] = {}
        self._storing: set[asyncio.Task[Rendered]] = set()

    async def answer(self, request: web.Request, tenant: str, key: str, body: Any,
                     work: Callable[[], Awaitable[Rendered]]) -> web.Response:
        mark = fingerprint(request.path, body)
        owner = secrets.token_hex(16)  # this request's claim, not just its body's
        held = await asyncio.to_thread(self.store.claim, tenant, key, mark,
                                       self.stale_after_s, owner)
        if held is not None:
            return await self._repeat(request, tenant, key, mark, held)
        task = asyncio.get_running_loop().create_task(self._run(tenant, key, owner, work))
        self._running[(tenant, key)] = task
        self._storing.add(task)
        task.add_done_callback(self._forget)
        return _response(await self._wait(task))

    def _forget(self, task: asyncio.Task[Rendered]) -> None:
        self._storing.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # Its caller (if still there) got the error; nobody else needs it.
            log.debug("an idempotent request failed: %s", type(task.exception()).__name__)

    async def settle(self) -> None:
        """Wait for the answers still being produced or stored (at shutdown)."""
        running = list(self._running.values())
        if running:
            await asyncio.wait(running, timeout=self.timeout_s)
        if self._storing:
            await asyncio.wait(list(self._storing), timeout=self.timeout_s)

    async def _run(self, tenant: str, key: str, owner: str,
                   work: Callable[[], Awaitable[Rendered]]) -> Rendered:
        try:
            rendered = await work()
        except CommittedProblem as problem:
            # The record is committed: the key stays bound to it, and this error is its
            # answer (a retry must not generate a second record).
            await self._store(tenant, key, owner, {"problem": problem.to_dict()})
            raise
        except asyncio.CancelledError:
            # Cancelled from outside (the process is going away): whether the record
            # commits is not known here, so the key is not released; a retry finds it
            # pending until the claim goes stale, never a second record at once.
            log.warning("an idempotent request was cancelled; its key stays claimed until "
                        "its claim goes stale")
            raise
        except BaseException:
            # Nothing was committed: let a retry generate.
            try:
                if not await asyncio.to_thread(self.store.release, tenant, key, owner):
                    log.warning("an idempotent request failed after another request took "
                                "its stale key over; the key stays with that one")
            except Exception:  # the claim then goes stale and is taken over later
                log.warning("could not release an idempotency key after a failure")
            raise
        finally:
            if self._running.get((tenant, key)) is asyncio.current_task():
                self._running.pop((tenant, key))
        # Stored when the record has committed, whether or not anybody still listens.
        body, headers = rendered
        await self._store(tenant, key, owner, {"body": body, "headers": headers})
        return rendered

    async def _store(self, tenant: str, key: str, owner: str,
                     response: dict[str, Any]) -> None:
        try:
            stored = await asyncio.to_thread(self.store.complete, tenant, key, owner,
                                             response)
        except Exception:
            # The record is committed and a caller still waiting gets its answer; only
            # a retry cannot find it (it waits, then the claim goes stale).
            log.error("could not store the answer of an idempotent request")
            return
        if not stored:
            # Its stale claim was taken over: the taker's claim and answer are kept.
            log.warning("the answer of an idempotent request was not stored: another "
                        "request took its stale key over")

    async def _wait(self, task: asyncio.Task[Rendered]) -> Rendered:
        # shield: a caller that times out or leaves does not cancel the work.
        return await asyncio.wait_for(asyncio.shield(task), self.timeout_s)

    async def _repeat(self, request: web.Request, tenant: str, key: str, mark: bytes,
                      held: StoredReceipt) -> web.Response:
        if held.fingerprint != mark:
            raise invalid(HEADER, "was already used with a different request body")
        if held.state == "done" and held.response is not None:
            return _stored(held.response)
        running = self._running.get((tenant, key))
        if running is not None:  # the first request is running in this process
            try:
                return _response(await self._wait(running))
            except (TimeoutError, CommittedProblem):
                raise
            except Exception:
                # The first one failed and released the key; this repeat does not retry
                # on its own (the caller decides).
                raise Problem(409, "Conflict", "the request first sent with this "
                              "Idempotency-Key failed; send it again", field=HEADER) from None
        # Running in another process (or its process died): poll the store.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        wait = 0.01
        while loop.time() < deadline:
            await asyncio.sleep(wait)
            wait = min(wait * 2, 0.5)
            found = await asyncio.to_thread(self.store.get, tenant, key)
            if found is None:
                raise Problem(409, "Conflict", "the request first sent with this "
                              "Idempotency-Key failed; send it again", field=HEADER)
            if found.state == "done" and found.response is not None:
                return _stored(found.response)
        raise TimeoutError


def _response(rendered: Rendered) -> web.Response:
    body, headers = rendered
    return web.json_response(body, headers=headers)


def _stored(response: dict[str, Any]) -> web.Response:
    """A stored answer again: the original answer, or the error it was after its record
    committed."""
    if "problem" in response:
        raise CommittedProblem.from_dict(response["problem"])
    return _response((response["body"], response["headers"]))
