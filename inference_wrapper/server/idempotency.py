"""``Idempotency-Key`` on the generate routes: one generate, one record, one answer.

Without the header a request is submitted and awaited as before. With it:

- the key is claimed for (tenant, key) in the receipts store before anything runs;
- the work runs as its own task, so it finishes, commits its record and stores the
  whole answer (salts included) even if the caller timed out (504) or went away;
- a repeat with the same key and body gets the stored answer without generating again;
  a repeat with another body gets 422 naming the header (the store compares keyed MACs
  of the bodies; a key whose record was erased answers 410 to any body, decision 0062);
- a repeat while the first is still running waits for it (up to the request timeout,
  then 504, and the caller may retry again); see docs/decisions/0016-supervised-workers.md;
- once the record is committed the key is never released: if the answer is an error
  (a ``CommittedProblem``, e.g. the content vault failed), that error is the stored
  answer, and only a failure before the commit lets a retry generate (decision 22);
- each claim has its own owner token: a request whose stale claim was taken over stores
  and releases nothing when it finishes late;
- a claim never stays pending after its request ended (decision 32): each store call is
  retried (bounded); a claim that could not be confirmed is answered 503 and released in
  the background; an answer that could not be stored is kept in memory (repeats get it)
  and stored in the background until it is; a failure before the commit releases the key;
- the owner token names the process (host, pid, start time): at start, and when a repeat
  finds a pending claim, a claim whose process on this host has died is released at once
  instead of after ``stale_after_s``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import secrets
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web

from inference_wrapper.server.problems import CommittedProblem, Problem, invalid
from ledger.store.receipts import ReceiptStore, StoredReceipt, is_erased_answer

log = logging.getLogger(__name__)

HEADER = "Idempotency-Key"
MAX_KEY_LENGTH = 255

Rendered = tuple[dict[str, Any], dict[str, str]]  # JSON body, headers
T = TypeVar("T")
# Waits between tries of one store call: a dropped connection is retried at once on a
# fresh one; a database that stays away fails the call within a second.
RETRY_DELAYS_S = (0.05, 0.2, 0.5)
# Background retries (an answer to store, a claim to release) back off up to this.
BACKGROUND_MAX_DELAY_S = 5.0


OWNER_CHARS = 32  # the receipts table's owner column


def _start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc), or None if unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rpartition(")")[2].split()[19])  # field 22 of stat(5)


def _base36(number: int) -> str:
    digits = ""
    while True:
        number, digit = divmod(number, 36)
        digits = "0123456789abcdefghijklmnopqrstuvwxyz"[digit] + digits
        if not number:
            return digits


def _host() -> str:
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:6]


def process_identity(pid: int | None = None) -> str:
    """``host/pid/start``, short (host hashed, numbers in base 36): a pid reused by a
    later process has another start time."""
    pid = os.getpid() if pid is None else pid
    ticks = _start_ticks(pid)
    return f"{_host()}/{_base36(pid)}/{'?' if ticks is None else _base36(ticks)}"


def owner_token(identity: str) -> str:
    """A claim's owner: the process identity and a random part, in the column's size."""
    return (f"{identity}/" + secrets.token_hex(16))[:OWNER_CHARS]


def owner_is_dead(owner: str) -> bool:
    """True only when the owner's process is known gone: on this host, and no process
    with its pid and start time exists (a claim from elsewhere is never judged)."""
    parts = owner.split("/")
    if len(parts) != 4 or parts[0] != _host() or "?" in parts[1:3]:
        return False
    if _start_ticks(os.getpid()) is None:
        return False  # no /proc here: nothing can be told
    try:
        pid, started = int(parts[1], 36), int(parts[2], 36)
    except ValueError:
        return False
    return _start_ticks(pid) != started


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
    fingerprint. Kept in memory only: the receipts store keeps a keyed MAC of it."""
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(path.encode() + b"\0" + text.encode()).digest()


class Idempotency:
    """The receipts store plus the keys this process is answering right now."""

    def __init__(self, store: ReceiptStore, timeout_s: float, *,
                 settle_timeout_s: float | None = None,
                 retry_delays_s: tuple[float, ...] = RETRY_DELAYS_S) -> None:
        self.store = store
        self.timeout_s = timeout_s
        self.settle_timeout_s = timeout_s if settle_timeout_s is None else settle_timeout_s
        self.retry_delays_s = retry_delays_s
        self.identity = process_identity()
        # A pending claim this old was left by a process that died before answering
        # (one on another host: those on this one are found by their process identity).
        self.stale_after_s = max(600.0, 10 * timeout_s)
        self._running: dict[tuple[str, str], asyncio.Task[Rendered]] = {}
        self._storing: set[asyncio.Task[Rendered]] = set()
        # Answers whose store failed: (owner, response), served to repeats from here
        # while a background task keeps storing them.
        self._unstored: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {}
        self._background: set[asyncio.Task[None]] = set()

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """One store call in a worker thread, tried again on a failure (bounded)."""
        for delay in (*self.retry_delays_s, None):
            try:
                return await asyncio.to_thread(fn, *args)
            except Exception:
                if delay is None:
                    raise
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    def _in_background(self, what: str, fn: Callable[[], bool | None],
                       done: Callable[[], None] = lambda: None) -> None:
        """Retry ``fn`` with backoff until it runs without an error (the claim it acts
        on then no longer stays pending), at most until a claim would go stale."""

        async def retry() -> None:
            loop = asyncio.get_running_loop()
            deadline, delay = loop.time() + self.stale_after_s, 0.1
            while True:
                try:
                    await asyncio.to_thread(fn)
                    done()
                    return
                except Exception:
                    if loop.time() >= deadline:
                        log.error("gave up trying to %s", what)
                        return
                await asyncio.sleep(delay)
                delay = min(delay * 2, BACKGROUND_MAX_DELAY_S)

        task = asyncio.get_running_loop().create_task(retry(), name=f"idempotency: {what}")
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def recover(self) -> int:
        """At start: release the pending claims of this host's dead processes (their
        requests ended without an answer stored); returns how many."""
        host = self.identity.partition("/")[0] + "/"
        released = 0
        for tenant, key, owner in await self._call(self.store.pending_owned, host):
            if owner_is_dead(owner) and await self._call(self.store.release, tenant, key,
                                                         owner):
                released += 1
        if released:
            log.warning("released %d idempotency keys claimed by processes that died",
                        released)
        return released

    async def answer(self, request: web.Request, tenant: str, key: str, body: Any,
                     work: Callable[[], Awaitable[Rendered]]) -> web.Response:
        mark = fingerprint(request.path, body)
        # This request's claim, not just its body's; its process is named in it.
        owner = owner_token(self.identity)
        try:
            held = await self._call(self.store.claim, tenant, key, mark, self.stale_after_s,
                                    owner)
        except Exception as exc:
            log.warning("could not claim an idempotency key: %s", type(exc).__name__,
                        exc_info=exc)
            # Whether the claim committed is unknown: nothing ran, so it is released.
            self._in_background("release an unconfirmed idempotency claim",
                                lambda: self.store.release(tenant, key, owner))
            raise Problem(503, "Service Unavailable", "the Idempotency-Key could not be "
                          "claimed (the database is unavailable); nothing was generated",
                          field=HEADER, headers={"Retry-After": "1"}) from exc
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
        """Wait for the answers still being produced or stored (at shutdown), within
        the settle timeout in all."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settle_timeout_s
        for group in (list(self._running.values()), list(self._storing),
                      list(self._background)):
            if group and loop.time() < deadline:
                await asyncio.wait(group, timeout=deadline - loop.time())
        for task in list(self._background):
            task.cancel()
        if self._unstored:
            log.error("%d idempotent answers could not be stored before exit; their keys "
                      "are released at the next start", len(self._unstored))

    async def _run(self, tenant: str, key: str, owner: str,
                   work: Callable[[], Awaitable[Rendered]]) -> Rendered:
        # Listed as running until its answer is stored or its key released: a repeat
        # that finds this process's claim pending and not running frees the key.
        try:
            return await self._produce(tenant, key, owner, work)
        finally:
            if self._running.get((tenant, key)) is asyncio.current_task():
                self._running.pop((tenant, key))

    async def _produce(self, tenant: str, key: str, owner: str,
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
            # commits is not known here, so the key is not released now; the next start
            # (or a repeat on this host) finds its process gone and frees it.
            log.warning("an idempotent request was cancelled; its key stays claimed until "
                        "its process is found gone")
            raise
        except BaseException:
            # Nothing was committed: let a retry generate.
            try:
                if not await self._call(self.store.release, tenant, key, owner):
                    log.warning("an idempotent request failed after another request took "
                                "its stale key over; the key stays with that one")
            except Exception:
                log.warning("could not release an idempotency key after a failure; "
                            "trying again in the background")
                self._in_background("release an idempotency key",
                                    lambda: self.store.release(tenant, key, owner))
            raise
        # Stored when the record has committed, whether or not anybody still listens.
        body, headers = rendered
        await self._store(tenant, key, owner, {"body": body, "headers": headers})
        return rendered

    async def _store(self, tenant: str, key: str, owner: str,
                     response: dict[str, Any]) -> None:
        try:
            stored = await self._call(self.store.complete, tenant, key, owner, response)
        except Exception:
            # The record is committed: repeats are answered from memory while the answer
            # is stored in the background (a second record must never be made).
            log.error("could not store the answer of an idempotent request; storing it "
                      "in the background")
            self._unstored[(tenant, key)] = (owner, response)

            def stored_now() -> None:
                if self._unstored.get((tenant, key), (None,))[0] == owner:
                    del self._unstored[(tenant, key)]

            self._in_background("store an idempotent answer",
                                lambda: self.store.complete(tenant, key, owner, response),
                                stored_now)
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
        if not await self._call(self.store.same_request, tenant, key, held, mark):
            fresh = await self._call(self.store.get, tenant, key)
            if fresh is not None and fresh.response is not None \
                    and is_erased_answer(fresh.response):
                # Its record was erased since the row was read: 410 to any body.
                return _stored(fresh.response)
            if held.fingerprint is None:  # its key was rotated: no body can be compared
                raise invalid(HEADER, "was already used, and its request can no longer "
                              "be compared with this one; use a new key")
            raise invalid(HEADER, "was already used with a different request body")
        if held.state == "done" and held.response is not None:
            return _stored(held.response)
        unstored = self._unstored.get((tenant, key))
        if unstored is not None and unstored[0] == held.owner:  # stored in the background
            return _stored(unstored[1])
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
        failed = Problem(409, "Conflict", "the request first sent with this Idempotency-Key "
                         "failed; send it again", field=HEADER)
        while loop.time() < deadline:
            if held.state == "pending" and held.owner is not None and (
                    held.owner.startswith(self.identity + "/") or owner_is_dead(held.owner)):
                # Its owner is gone (this process runs it no more, or its process died):
                # it never answers, so the key is freed now rather than when stale.
                await self._call(self.store.release, tenant, key, held.owner)
                raise failed
            await asyncio.sleep(wait)
            wait = min(wait * 2, 0.5)
            found = await self._call(self.store.get, tenant, key)
            if found is None:
                raise failed
            if found.state == "done" and found.response is not None:
                return _stored(found.response)
            held = found
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
