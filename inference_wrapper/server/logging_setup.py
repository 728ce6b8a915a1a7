"""Logging that never blocks the event loop.

Handlers that write to stdout block when nobody reads the pipe (a stalled log collector).
Every log call therefore only appends the record (its message and any traceback already
rendered to text) to a bounded in-memory buffer; one writer thread drains it to the
stream a few times a second. When the buffer is full the record
is dropped and counted, so a stalled stdout costs log lines, never requests.

The writer wakes on a timer, not per record: waking a thread for every access-log line
cost the event loop a context switch per request under load.
"""

from __future__ import annotations

import collections
import logging
import os
import sys
import threading
from typing import TextIO

ACTIVE: QueuedLogging | None = None  # set by setup_queued_logging, read by metrics
DRAIN_INTERVAL_S = 0.05  # how stale a log line may be before it is written
_TRACEBACKS = logging.Formatter()


class BufferingHandler(logging.Handler):
    """Keeps records in a bounded buffer (dropping and counting beyond it) for
    ``QueuedLogging``'s writer thread; ``emit`` never blocks and never formats."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self.buffer: collections.deque[logging.LogRecord] = collections.deque()
        self.dropped = 0

    def emit(self, record: logging.LogRecord) -> None:
        # Called with this handler's lock held (logging.Handler.handle): exact counts.
        if len(self.buffer) >= self.capacity:
            self.dropped += 1
            return
        # Freeze what the record says now: its arguments may change before the writer
        # formats it, and a live traceback would pin every frame's locals meanwhile.
        if record.args:
            record.msg, record.args = record.getMessage(), None
        if record.exc_info:
            record.exc_text = _TRACEBACKS.formatException(record.exc_info)
            record.exc_info = None
        self.buffer.append(record)


class QueuedLogging:
    """Root logging through a buffer; ``stop()`` flushes what is buffered."""

    def __init__(self, handler: BufferingHandler, output: logging.StreamHandler[TextIO],
                 interval_s: float = DRAIN_INTERVAL_S) -> None:
        self.handler, self.output, self.interval_s = handler, output, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._drain_loop, name="log-writer",
                                        daemon=True)
        self._thread.start()

    @property
    def dropped(self) -> int:
        return self.handler.dropped

    def _drain_loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._drain()
        self._drain()

    def _drain(self) -> None:
        # One write per drain, not one per line: each write releases and retakes the
        # GIL, and every retake can keep the event loop or the model thread waiting.
        buffer, lines = self.handler.buffer, []
        while buffer:
            record = buffer.popleft()
            try:
                lines.append(self.output.format(record) + "\n")
            except Exception:  # a record that cannot be formatted costs its own line only
                self.output.handleError(record)
        if not lines:
            return
        try:
            self.output.stream.write("".join(lines))  # may block on a stalled stream: here
            self.output.flush()
        except Exception:  # as StreamHandler.emit would: reported, never raised
            self.output.handleError(record)

    def stop(self, timeout_s: float = 5.0, report: TextIO | None = None) -> int:
        """Flush what is buffered, waiting at most ``timeout_s`` for a stalled stream;
        return the lines dropped in all (those still buffered then included) and, when
        any were, say so on ``report`` (stderr: the log stream may be what stalled)."""
        logging.getLogger().removeHandler(self.handler)
        self._stop.set()
        self._thread.join(timeout_s)
        with self.handler.lock:  # type: ignore[union-attr]  # created by Handler.__init__
            if self._thread.is_alive():  # still stuck writing: what is buffered is lost
                self.handler.dropped += len(self.handler.buffer)
                self.handler.buffer.clear()
            dropped = self.handler.dropped
        if dropped:
            _say(report or sys.stderr, f"{dropped} log lines were dropped because the log "
                 "output stalled\n")
        return dropped


def _say(stream: TextIO, line: str) -> None:
    """One line that must not hold the exit: a stream that cannot take it is skipped."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        stream.write(line)  # not a file (a test's buffer): it cannot block
        return
    blocking = os.get_blocking(fd)
    try:
        os.set_blocking(fd, False)
        os.write(fd, line.encode())
    except OSError:  # full or closed: the count is also in audit_log_records_dropped
        pass
    finally:
        os.set_blocking(fd, blocking)


def setup_queued_logging(level: int = logging.INFO, stream: TextIO | None = None,
                         capacity: int = 10_000) -> QueuedLogging:
    """Route the root logger through a bounded buffer to ``stream`` (stdout by default).

    Also turns off what the one-line format never shows and every log call would pay
    for (the logging HOWTO's "Optimization" settings): the caller's file and line (a
    walk up the stack), and thread and process names.
    """
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    output = logging.StreamHandler(stream or sys.stdout)
    output.setFormatter(logging.Formatter("%(message)s"))
    handler = BufferingHandler(capacity)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    global ACTIVE
    ACTIVE = QueuedLogging(handler, output)
    return ACTIVE
