"""Dynamic batching: up to ``max_batch`` requests or ``max_wait_ms``, one ``generate`` each.

The model runs on one dedicated thread. As soon as a batch's tokens are out, the next
batch starts; the audit work of the finished batch (fingerprints, records, durable
append) runs beside it, so auditing overlaps with generation instead of sitting between
batches. A request's answer is released only after its record is committed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from inference_wrapper.generator import (
    AuditedGenerator,
    AuditedOutput,
    BatchResult,
    PreparedRequest,
)
from ledger.errors import LedgerError

log = logging.getLogger(__name__)


class Journal(Protocol):
    """Where records go: the ledger's durable append."""

    async def append_async(self, record: Any) -> Any: ...


# Called with each batch's durable (request, output, receipt) triples, on the audit thread,
# before the answers are released: the content vault keeps what the tenant's policy says.
RetainHook = Callable[[list[tuple[PreparedRequest, AuditedOutput, Any]]], None]


class QueueFullError(LedgerError):
    """The batcher's queue is at its limit; the caller should retry later."""


class ShuttingDownError(LedgerError):
    """The batcher no longer accepts requests."""


@dataclass
class Answer:
    output: AuditedOutput
    receipt: Any  # ledger Receipt
    spans_ns: dict[str, tuple[int, int]] = field(default_factory=dict)  # wall clock


@dataclass
class _Job:
    request: PreparedRequest
    future: asyncio.Future[Answer]
    enqueued: float
    enqueued_ns: int = 0


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
    ) -> None:
        self.generator = generator
        self.retain = retain
        self.journal = journal
        self.max_batch = max_batch
        self.max_wait_s = max_wait_ms / 1000.0
        self.queue_limit = queue_limit
        self._observe = observe or (lambda name, value: None)
        self._waiting: list[_Job] = []
        self._wakeup = asyncio.Event()
        self._audits: set[asyncio.Task[None]] = set()
        self._model_thread = ThreadPoolExecutor(1, thread_name_prefix="model")
        self._audit_thread = ThreadPoolExecutor(1, thread_name_prefix="audit")
        self._runner: asyncio.Task[None] | None = None
        self._accepting = True
        self.in_flight = 0

    @property
    def depth(self) -> int:
        return len(self._waiting)

    def start(self) -> None:
        self._runner = asyncio.get_running_loop().create_task(self._run(), name="batcher")

    async def submit(self, request: PreparedRequest) -> Answer:
        if not self._accepting:
            raise ShuttingDownError("the service is shutting down")
        if len(self._waiting) >= self.queue_limit:
            raise QueueFullError(f"queue is full ({self.queue_limit} requests waiting)")
        job = _Job(request, asyncio.get_running_loop().create_future(), time.perf_counter(),
                   time.time_ns())
        self._waiting.append(job)
        self._wakeup.set()
        return await asyncio.shield(job.future)  # a timed-out caller does not cancel the work

    async def drain(self) -> None:
        """Stop accepting, finish every queued request and commit every record."""
        self._accepting = False
        while self._waiting or self.in_flight:
            await asyncio.sleep(0.01)
        if self._runner is not None:
            self._runner.cancel()
            try:
                await self._runner
            except asyncio.CancelledError:
                pass
        if self._audits:
            await asyncio.gather(*self._audits, return_exceptions=True)
        self._model_thread.shutdown(wait=True)
        self._audit_thread.shutdown(wait=True)

    def _take_batch(self) -> list[_Job]:
        first = self._waiting[0]
        batch = [j for j in self._waiting if j.request.params == first.request.params]
        batch = batch[: self.max_batch]
        chosen = {id(j) for j in batch}
        self._waiting = [j for j in self._waiting if id(j) not in chosen]
        return batch

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._waiting:
                self._wakeup.clear()
                await self._wakeup.wait()
            # Give the batch up to max_wait to fill, unless it is already full.
            deadline = loop.time() + self.max_wait_s
            while len(self._waiting) < self.max_batch and loop.time() < deadline:
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), deadline - loop.time())
                except TimeoutError:
                    break
            batch = self._take_batch()
            self.in_flight += len(batch)
            now = time.perf_counter()
            for job in batch:
                self._observe("queue_wait", now - job.enqueued)
            self._observe("batch_size", len(batch))
            try:
                result = await loop.run_in_executor(
                    self._model_thread, self.generator.run_batch, [j.request for j in batch]
                )
            except Exception as exc:  # a failed generate fails its batch, not the service
                log.exception("generate failed for a batch of %d", len(batch))
                self._finish(batch, exc)
                continue
            task = loop.create_task(self._audit(batch, result))
            self._audits.add(task)
            task.add_done_callback(self._audits.discard)

    async def _audit(self, batch: list[_Job], result: BatchResult) -> None:
        loop = asyncio.get_running_loop()
        try:
            outputs = await loop.run_in_executor(self._audit_thread, self.generator.seal, result)
            start, start_ns = time.perf_counter(), time.time_ns()
            receipts = await asyncio.gather(
                *(self.journal.append_async(o.record) for o in outputs), return_exceptions=True
            )
            self._observe("append", time.perf_counter() - start)
            append_span = (start_ns, time.time_ns())
            if self.retain is not None:
                durable = [(j.request, o, r) for j, o, r in zip(batch, outputs, receipts,
                                                                 strict=True)
                           if not isinstance(r, BaseException)]
                await loop.run_in_executor(self._audit_thread, self.retain, durable)
        except Exception as exc:
            self._finish(batch, exc)
            return
        for job, output, receipt in zip(batch, outputs, receipts, strict=True):
            if isinstance(receipt, BaseException):
                self._finish([job], receipt)
            else:
                spans = {"parse": job.request.parse_span_ns,
                         "queue_wait": (job.enqueued_ns, result.spans_ns["tokenize"][0]),
                         **result.spans_ns, "append": append_span}
                self._finish([job], Answer(output, receipt, spans))
        for name, value in result.timings_ms.items():
            self._observe(name, value / 1000.0)

    def _finish(self, jobs: list[_Job], outcome: Answer | BaseException) -> None:
        for job in jobs:
            self.in_flight -= 1
            if job.future.done():
                continue
            if isinstance(outcome, BaseException):
                job.future.set_exception(outcome)
            else:
                job.future.set_result(outcome)
