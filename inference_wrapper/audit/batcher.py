"""Dynamic batching: up to ``max_batch`` requests or ``max_wait_ms``, one ``generate`` each.

Batches go to engines (``EngineClient``), one batch per engine at a time: with several
engines, several batches run at once. As soon as a batch's tokens are out, the engine
takes the next batch; the audit work of the finished batch (records, durable append)
runs beside it, so auditing overlaps with generation instead of sitting between
batches. A request's answer is released only after its record is committed; a row
whose record cannot be built is answered alone (``RowNotRecorded``), its batch mates'
records unchanged. An engine
that goes down fails the batch it held (``EngineDownError``: 503); while no engine is
alive, requests are refused at once rather than held.

One bound, ``queue_limit``, covers all outstanding work: a request counts from ``submit``
until its record is committed (or it failed), so waiting, in the model, in audit and in
the ledger queue are all inside it. A queued request whose caller went away (timed out,
disconnected) is dropped before it reaches the model.

A streamed request brings a ``TokenFeed``: while its batch generates, each step's new
token of its row is appended there on the event loop (the engine never waits on a
reader). A batch with no
streamed request runs ``generate`` with no streamer at all.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from inference_wrapper.audit.generator import (
    AuditedGenerator,
    AuditedOutput,
    BatchResult,
    LogBinding,
    PreparedRequest,
    RowNotRecorded,
    engine_batch,
    environment_leaf,
)
from inference_wrapper.engine.inprocess import InProcessEngine
from inference_wrapper.engine.protocol import EngineClient, EngineDownError
from ledger.errors import BackendUnavailableError, LedgerError, WorkerDiedError
from ledger.leaves.record_v2 import EnvironmentRef
from ledger.vault_errors import ContentNotKeptError

log = logging.getLogger(__name__)


FILL_WINDOWS = 4  # a batch waits at most this many max_wait windows to fill

# The model thread runs generate's Python steps between short native calls that release
# the GIL. Whenever another thread (audit, ledger writer, log writer, integrator) takes
# the GIL meanwhile, the model thread waits up to the interpreter's switch interval
# (5 ms by default) to get it back: measured on the tiny model, that stretched a 64 ms
# generate by about 3 ms per batch. A 0.5 ms interval bounds each such wait.
GIL_SWITCH_INTERVAL_S = 0.0005


# A streamed request's completed record is appended again this many times, after
# RETRY_BACKOFF_S, twice that, ..., on a transient database fault (text is already out).
RECORD_RETRIES = 3
RETRY_BACKOFF_S = 0.1


def fill_deadline(started: float, latest_arrival: float, max_wait_s: float) -> float:
    """When a filling batch stops waiting: ``max_wait_s`` after its latest arrival, and
    never later than ``FILL_WINDOWS`` windows after it began to fill."""
    return min(started + max_wait_s * FILL_WINDOWS, latest_arrival + max_wait_s)


class Journal(Protocol):
    """Where records go: the ledger's durable append."""

    async def append_many_async(self, records: Sequence[Any]) -> list[Any]: ...


# Called with each batch's durable (request, output, receipt) triples, on the audit thread,
# before the answers are released: the content vault keeps what the tenant's policy says.
RetainHook = Callable[[list[tuple[PreparedRequest, AuditedOutput, Any]]], None]
# Asked on the event loop, from memory: may any of these tenants keep content? When it
# answers False the batch skips the retain step and its hop to the audit thread.
RetainNeeded = Callable[[Iterable[str]], bool]


class QueueFullError(LedgerError):
    """The batcher's queue is at its limit; the caller should retry later."""


class ShuttingDownError(LedgerError):
    """The batcher no longer accepts requests."""


class CallerGoneError(LedgerError):
    """The request was dropped before generate: its caller disconnected."""


@dataclass(eq=False)
class Slot:
    """A place in the one bound, taken before a request writes anything (a stream's
    start record): a request refused for load is refused before it leaves a trace."""

    batcher: Batcher
    used: bool = False  # handed to submit, which counts it from there

    def release(self) -> None:
        """Give the place back unused (the request failed before submit)."""
        if not self.used:
            self.used = True
            self.batcher._release_slot()


@dataclass
class Answer:
    output: AuditedOutput
    receipt: Any  # ledger Receipt
    spans_ns: dict[str, tuple[int, int]] = field(default_factory=dict)  # wall clock


@dataclass(eq=False)
class TokenFeed:
    """A streamed request's generated token ids so far, EOS and what follows excluded.

    Written only on the event loop. A slow reader costs nothing: the ids accumulate (at
    most ``max_new_tokens`` of them) and the reader decodes them all at once when it
    next looks, since the text is cumulative.
    """

    ids: list[int] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)  # set on every append


@dataclass(eq=False)  # identity: a job is found and removed by itself
class _Job:
    request: PreparedRequest
    future: asyncio.Future[Answer]
    enqueued: float
    enqueued_ns: int = 0
    caller_alive: Callable[[], bool] | None = None  # False once the client disconnected
    feed: TokenFeed | None = None  # a streamed request's tokens, as they are generated
    done: bool = False  # counted out of ``outstanding`` already


class Batcher:
    def __init__(
        self,
        generator: AuditedGenerator,
        journal: Journal,
        *,
        max_batch: int = 32,
        max_wait_ms: float = 5.0,
        queue_limit: int = 256,
        observe: Callable[[str, float], None] | None = None,
        retain: RetainHook | None = None,
        retain_needed: RetainNeeded | None = None,
        gil_switch_interval_s: float | None = GIL_SWITCH_INTERVAL_S,
        record_retries: int = RECORD_RETRIES,
    ) -> None:
        self.generator = generator
        self.record_retries = record_retries
        self._switch_interval_s = gil_switch_interval_s  # None: leave the process's own
        self._restore_switch_interval: float | None = None
        self.retain = retain
        self.retain_needed = retain_needed
        self.journal = journal
        # The log the records go to (v2 records name its environment leaf); None: v1.
        self.log: LogBinding | None = None
        self._environment_lock = asyncio.Lock()
        self.max_batch = max_batch
        self.max_wait_s = max_wait_ms / 1000.0
        self.queue_limit = queue_limit
        self._observe = observe or (lambda name, value: None)
        self._waiting: list[_Job] = []
        self._wakeup = asyncio.Event()
        self._audits: set[asyncio.Task[None]] = set()
        self.engines: list[EngineClient] = list(generator.engines)
        self._busy: set[str] = set()  # engines holding a batch (one batch per engine)
        self._engine_freed = asyncio.Event()
        self._generates: set[asyncio.Task[None]] = set()
        self._audit_thread = ThreadPoolExecutor(1, thread_name_prefix="audit")
        self._runner: asyncio.Task[None] | None = None
        self._accepting = True
        self.outstanding = 0  # submitted and not yet answered: the one bound
        self.dropped = 0  # jobs dropped before generate (caller gone)
        self.in_model = 0  # requests inside model.generate right now
        self.failure: BaseException | None = None  # why the batching task died, if it did
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def depth(self) -> int:
        return len(self._waiting)

    @property
    def alive(self) -> bool:
        return self.failure is None

    def start(self) -> None:
        # Process-wide (decision 25), set by every batcher alike (the bench's bare handler
        # too), only ever lowered, and restored when the batcher has drained. Only for a
        # model on a thread of this process (decision 55): with engine processes, a short
        # interval only makes the API's own threads hand the GIL back and forth.
        wanted, current = self._switch_interval_s, sys.getswitchinterval()
        model_here = any(isinstance(engine, InProcessEngine) for engine in self.engines)
        if wanted is not None and wanted < current and model_here:
            self._restore_switch_interval = current
            sys.setswitchinterval(wanted)
        self._runner = asyncio.get_running_loop().create_task(self._run(), name="batcher")
        self._runner.add_done_callback(self._runner_done)

    def _runner_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        error = task.exception()
        if error is None:
            return
        self.failure = error
        log.critical("the batcher task died", exc_info=error)
        waiting, self._waiting = self._waiting, []
        self._finish(waiting, WorkerDiedError("batcher"))

    def fail_all(self, error: BaseException) -> None:
        """Answer every waiting request with ``error`` (the supervisor saw a worker die)."""
        waiting, self._waiting = self._waiting, []
        self._finish(waiting, error)

    def _admit(self) -> None:
        if self.failure is not None:
            raise WorkerDiedError("batcher")
        if not any(engine.alive() for engine in self.engines):
            raise EngineDownError("no engine is serving")
        if not self._accepting:
            raise ShuttingDownError("the service is shutting down")
        if self.outstanding >= self.queue_limit:
            raise QueueFullError(f"too much outstanding work ({self.queue_limit} requests "
                                 "waiting, generating or being recorded)")
        self.outstanding += 1
        self._idle.clear()

    def reserve(self) -> Slot:
        """Take a place in the bound now (raises as ``submit`` would); pass it to
        ``submit`` or ``release`` it."""
        self._admit()
        return Slot(self)

    def _release_slot(self) -> None:
        self.outstanding -= 1
        if self.outstanding == 0:
            self._idle.set()

    async def submit(self, request: PreparedRequest,
                     caller_alive: Callable[[], bool] | None = None,
                     feed: TokenFeed | None = None, slot: Slot | None = None) -> Answer:
        if slot is None:
            self._admit()
        elif slot.used:
            raise ValueError("a slot is used once")
        else:
            slot.used = True
            if self.failure is not None or not self._accepting:  # it changed meanwhile
                self._release_slot()
                self._admit()  # raises the reason
        job = _Job(request, asyncio.get_running_loop().create_future(), time.perf_counter(),
                   time.time_ns(), caller_alive, feed)
        self._waiting.append(job)
        self._wakeup.set()
        try:
            # A caller that stops waiting does not cancel work already in the model.
            return await asyncio.shield(job.future)
        except asyncio.CancelledError:
            if job in self._waiting:  # not generated yet: nobody needs it any more
                self._waiting.remove(job)
                self.dropped += 1
                self._finish([job], CallerGoneError("the caller stopped waiting"))
            raise

    async def drain(self, timeout_s: float = 120.0) -> None:
        """Stop accepting, finish every queued request and commit every record.

        Bounded by ``timeout_s``, and it ends at once if the batching task died: requests
        left then are answered with an error, never left waiting.
        """
        self._accepting = False
        self._wakeup.set()
        runner = self._runner
        waits: list[asyncio.Future[Any]] = [asyncio.ensure_future(self._idle.wait())]
        if runner is not None:
            waits.append(runner)
        await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        waits[0].cancel()
        if self.outstanding:
            log.error("drain ended with %d requests unanswered", self.outstanding)
        if runner is not None and not runner.done():
            runner.cancel()
            await asyncio.wait([runner])
        if self._generates:
            await asyncio.wait(list(self._generates), timeout=timeout_s)
        if self._audits:
            await asyncio.wait(list(self._audits), timeout=timeout_s)
        self.fail_all(ShuttingDownError("the service stopped before this request ran"))
        finished = self.outstanding == 0
        self._audit_thread.shutdown(wait=finished, cancel_futures=True)
        if self._restore_switch_interval is not None:
            sys.setswitchinterval(self._restore_switch_interval)
            self._restore_switch_interval = None

    def _take_batch(self) -> list[_Job]:
        gone = [j for j in self._waiting
                if j.caller_alive is not None and not j.caller_alive()]
        if gone:  # disconnected callers: drop them before they cost a generate
            self._waiting = [j for j in self._waiting if j not in gone]
            self.dropped += len(gone)
            self._finish(gone, CallerGoneError("the caller disconnected"))
        if not self._waiting:
            return []
        first = self._waiting[0]
        batch = [j for j in self._waiting if j.request.params == first.request.params]
        batch = batch[: self.max_batch]
        chosen = {id(j) for j in batch}
        self._waiting = [j for j in self._waiting if id(j) not in chosen]
        return batch

    async def _free_engine(self) -> EngineClient | None:
        """An idle live engine, waiting while all live ones are busy; None when none is
        alive (the waiting requests are then answered 503, not held)."""
        while True:
            live = [e for e in self.engines if e.alive()]
            if not live:
                return None
            for engine in live:
                if engine.engine_id not in self._busy:
                    return engine
            self._engine_freed.clear()
            await self._engine_freed.wait()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._waiting:
                self._wakeup.clear()
                await self._wakeup.wait()
            engine = await self._free_engine()
            if engine is None:
                self.fail_all(EngineDownError("no engine is serving"))
                continue
            # Let the batch fill while requests keep coming: up to max_wait after the
            # latest arrival, never more than FILL_WINDOWS windows in all, unless full.
            # Callers answered together come back together but not at once; a fixed
            # window cut them into a full batch and a straggler batch that cost nearly
            # as much model time again.
            start = loop.time()
            deadline = fill_deadline(start, start, self.max_wait_s)
            while len(self._waiting) < self.max_batch and loop.time() < deadline:
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), deadline - loop.time())
                except TimeoutError:
                    break
                deadline = fill_deadline(start, loop.time(), self.max_wait_s)
            batch = self._take_batch()
            if not batch:
                continue
            now = time.perf_counter()
            for job in batch:
                self._observe("queue_wait", now - job.enqueued)
            self._observe("batch_size", len(batch))
            self._busy.add(engine.engine_id)
            task = loop.create_task(self._generate(engine, batch))
            self._generates.add(task)
            task.add_done_callback(self._generates.discard)

    async def _generate(self, engine: EngineClient, batch: list[_Job]) -> None:
        loop = asyncio.get_running_loop()
        self.in_model += len(batch)
        requests = [j.request for j in batch]
        feeds = {row: j.feed for row, j in enumerate(batch) if j.feed is not None}
        try:
            environment = engine.environment()  # what the records will name
            result = await engine.generate(engine_batch(requests),
                                           _stepper(feeds) if feeds else None)
        except Exception as exc:  # a failed generate fails its batch, not the service
            if isinstance(exc, EngineDownError):
                log.error("engine %s went down holding a batch of %d", engine.engine_id,
                          len(batch))
            else:
                log.exception("generate failed for a batch of %d", len(batch))
            self._finish(batch, exc)
            return
        finally:
            self.in_model -= len(batch)
            self._busy.discard(engine.engine_id)
            self._engine_freed.set()
        task = loop.create_task(self._audit(batch, BatchResult(requests, result, environment)))
        self._audits.add(task)
        task.add_done_callback(self._audits.discard)

    async def log_environment(self, environment: Mapping[str, Any]) -> None:
        """Append an engine's environment leaf (it started, restarted or changed) before
        any record that names it; once per environment, however many batches wait."""
        assert self.log is not None
        async with self._environment_lock:
            if self.log.ref_for(environment) is not None:
                return
            leaf = environment_leaf(environment)
            (receipt,) = await self.journal.append_many_async([leaf])
            if isinstance(receipt, BaseException):
                raise receipt
            self.log.bind(environment, EnvironmentRef(receipt.leaf_index, leaf.leaf_hash))

    async def _audit(self, batch: list[_Job], result: BatchResult) -> None:
        loop = asyncio.get_running_loop()
        try:
            if self.log is not None and self.log.ref_for(result.environment) is None:
                await self.log_environment(result.environment)
            sealed = await loop.run_in_executor(self._audit_thread, self.generator.seal, result,
                                                self.log)
        except Exception as exc:
            self._finish(batch, exc)
            return
        # A row whose record could not be built is answered alone; its batch mates go on.
        kept: list[tuple[_Job, AuditedOutput]] = []
        for job, item in zip(batch, sealed, strict=True):
            if isinstance(item, RowNotRecorded):
                self._finish([job], item.error)
            else:
                kept.append((job, item))
        if not kept:
            return
        batch, outputs = [job for job, _ in kept], [output for _, output in kept]
        start, start_ns = time.perf_counter(), time.time_ns()
        receipts = await self._append(batch, outputs)
        self._observe("append", time.perf_counter() - start)
        append_span = (start_ns, time.time_ns())
        not_kept: Exception | None = None
        if self.retain is not None and self._should_retain(batch):
            durable = [(j.request, o, r) for j, o, r in zip(batch, outputs, receipts,
                                                             strict=True)
                       if not isinstance(r, BaseException)]
            try:
                await loop.run_in_executor(self._audit_thread, self.retain, durable)
            except Exception as exc:
                not_kept = exc
        for job, output, receipt in zip(batch, outputs, receipts, strict=True):
            if isinstance(receipt, BaseException):
                self._finish([job], receipt)
            elif not_kept is not None:
                # Its record is committed, its content not kept: the error names the
                # record (an Idempotency-Key then stays bound to it).
                error = ContentNotKeptError(receipt.record_id)
                error.__cause__ = not_kept
                self._finish([job], error)
            else:
                spans = {"parse": job.request.parse_span_ns,
                         "queue_wait": (job.enqueued_ns, result.spans_ns["tokenize"][0]),
                         **result.spans_ns, "append": append_span}
                self._finish([job], Answer(output, receipt, spans))
        for name, value in result.timings_ms.items():
            self._observe(name, value / 1000.0)

    async def _append(self, batch: list[_Job], outputs: list[AuditedOutput]
                      ) -> list[Any | BaseException]:
        """The records' durable append: each one's receipt or its error.

        A streamed request's text is already out: its completed record is appended again
        (at most ``record_retries`` times, backing off) while the database fault is
        transient, before its stream ends with the error. An append that did commit
        answers a repeat with its first receipt, so a retry never makes a second record.
        Other rows have sent nothing: they are answered 503 at once, their callers retry.
        """
        records = [o.record for o in outputs]
        receipts = await self._append_records(records)
        for attempt in range(self.record_retries):
            again = [i for i, (job, receipt) in enumerate(zip(batch, receipts, strict=True))
                     if job.feed is not None and _transient(receipt)]
            if not again:
                break
            log.warning("retrying the completed records of %d streamed requests after a "
                        "transient database fault (attempt %d of %d)", len(again),
                        attempt + 1, self.record_retries)
            await asyncio.sleep(RETRY_BACKOFF_S * 2 ** attempt)
            for i, receipt in zip(again, await self._append_records(
                    [records[i] for i in again]), strict=True):
                receipts[i] = receipt
        return receipts

    async def _append_records(self, records: list[Any]) -> list[Any | BaseException]:
        try:
            return list(await self.journal.append_many_async(records))
        except Exception as exc:  # the ledger refused the whole group (closed, died)
            return [exc] * len(records)

    def _should_retain(self, batch: list[_Job]) -> bool:
        if self.retain_needed is None:
            return True
        try:
            return self.retain_needed({j.request.tenant for j in batch})
        except Exception:  # unsure: keep what the policies say rather than skip
            log.exception("retain_needed failed; retaining as usual")
            return True

    def _finish(self, jobs: list[_Job], outcome: Answer | BaseException) -> None:
        for job in jobs:
            if not job.done:
                job.done = True
                self.outstanding -= 1
                if self.outstanding == 0:
                    self._idle.set()
            if job.future.done():
                continue
            if isinstance(outcome, BaseException):
                job.future.set_exception(outcome)
            else:
                job.future.set_result(outcome)


def _transient(outcome: Any) -> bool:
    """A database fault a repeat may get past (a dropped connection, a lock timeout),
    not a writer that died or a record the ledger refused."""
    return (isinstance(outcome, BackendUnavailableError)
            and not isinstance(outcome, WorkerDiedError))


def _stepper(feeds: dict[int, TokenFeed]) -> Callable[[list[int | None]], None]:
    """The per-step callback (on the event loop): each streamed row's new token."""

    def deliver(tokens: list[int | None]) -> None:
        for row, feed in feeds.items():
            token = tokens[row]
            if token is not None:
                feed.ids.append(token)
                feed.changed.set()

    return deliver
