"""Logging that never blocks the event loop.

Handlers that write to stdout block when nobody reads the pipe (a stalled log collector).
Every log call therefore only puts the record on a bounded in-memory queue; one listener
thread does the writing. When the queue is full the record is dropped and counted, so a
stalled stdout costs log lines, never requests.
"""

from __future__ import annotations

import logging
import logging.handlers
import queue
import sys
import threading
from typing import TextIO

ACTIVE: QueuedLogging | None = None  # set by setup_queued_logging, read by metrics


class DroppingQueueHandler(logging.handlers.QueueHandler):
    """A queue handler that drops (and counts) records when its queue is full."""

    def __init__(self, log_queue: queue.Queue[logging.LogRecord]) -> None:
        super().__init__(log_queue)
        self.dropped = 0
        self._lock_dropped = threading.Lock()

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        # The queue stays in this process: the listener thread formats the record, so
        # the caller (often the event loop) neither formats nor copies it.
        return record

    def enqueue(self, record: logging.LogRecord) -> None:
        try:
            self.queue.put_nowait(record)
        except queue.Full:
            with self._lock_dropped:
                self.dropped += 1


class QueuedLogging:
    """Root logging through a queue; ``stop()`` flushes what is queued."""

    def __init__(self, handler: DroppingQueueHandler,
                 listener: logging.handlers.QueueListener) -> None:
        self.handler, self.listener = handler, listener

    @property
    def dropped(self) -> int:
        return self.handler.dropped

    def stop(self, timeout_s: float = 5.0) -> None:
        """Flush what is queued, waiting at most ``timeout_s`` for a stalled stream."""
        logging.getLogger().removeHandler(self.handler)
        stopper = threading.Thread(target=self.listener.stop, daemon=True)
        stopper.start()
        stopper.join(timeout_s)


def setup_queued_logging(level: int = logging.INFO, stream: TextIO | None = None,
                         capacity: int = 10_000) -> QueuedLogging:
    """Route the root logger through a bounded queue to ``stream`` (stdout by default).

    Also turns off what the one-line format never shows and every log call would pay
    for (the logging HOWTO's "Optimization" settings): the caller's file and line (a
    walk up the stack), and thread and process names.
    """
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    log_queue: queue.Queue[logging.LogRecord] = queue.Queue(capacity)
    output = logging.StreamHandler(stream or sys.stdout)
    output.setFormatter(logging.Formatter("%(message)s"))
    handler = DroppingQueueHandler(log_queue)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    listener = logging.handlers.QueueListener(log_queue, output, respect_handler_level=False)
    listener.start()
    global ACTIVE
    ACTIVE = QueuedLogging(handler, listener)
    return ACTIVE
