"""The serving process's log buffer: never blocks, freezes what a record says, bounded."""

from __future__ import annotations

import gc
import io
import logging
import threading
import weakref

from inference_wrapper.server.logging_setup import BufferingHandler, QueuedLogging


class Payload:
    """A large local a traceback would keep alive."""


def _record(logger: logging.Logger, handler: BufferingHandler) -> None:
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.INFO)


def test_a_record_says_what_was_true_when_it_was_logged_and_pins_no_frame() -> None:
    handler = BufferingHandler(capacity=10)
    logger = logging.getLogger("test.logging_setup.freeze")
    _record(logger, handler)
    state = {"balance": 100}
    logger.info("before change: %s", state)
    state["balance"] = 0
    payload = Payload()
    alive = weakref.ref(payload)

    def fail(big: Payload) -> None:
        raise ValueError("boom")

    try:
        fail(payload)
    except ValueError:
        logger.exception("it failed")
    del payload
    gc.collect()
    assert alive() is None  # the buffered record holds text, not the traceback's frames
    stream = io.StringIO()
    output = logging.StreamHandler(stream)
    output.setFormatter(logging.Formatter("%(message)s"))
    QueuedLogging(handler, output, interval_s=0.01).stop()
    text = stream.getvalue()
    assert "before change: {'balance': 100}" in text
    assert "it failed" in text and "ValueError: boom" in text and "in fail" in text
    logger.removeHandler(handler)


def test_a_full_buffer_drops_and_counts() -> None:
    handler = BufferingHandler(capacity=3)
    logger = logging.getLogger("test.logging_setup.full")
    _record(logger, handler)
    for n in range(5):
        logger.info("line %d", n)
    assert handler.dropped == 2 and len(handler.buffer) == 3
    logger.removeHandler(handler)


class StalledStream(io.StringIO):
    """A log output whose first write blocks until released, as a full pipe would."""

    def __init__(self) -> None:
        super().__init__()
        self.writing, self.release = threading.Event(), threading.Event()

    def write(self, text: str) -> int:
        self.writing.set()
        self.release.wait()
        return super().write(text)


def test_lines_still_queued_at_exit_are_counted_and_reported() -> None:
    handler = BufferingHandler(capacity=100)
    logger = logging.getLogger("test.logging_setup.exit")
    _record(logger, handler)
    stream = StalledStream()
    output = logging.StreamHandler(stream)
    queued = QueuedLogging(handler, output, interval_s=0.001)
    logger.info("first")  # taken by the writer, which then blocks on the stream
    assert stream.writing.wait(30)
    for n in range(7):
        logger.info("queued %d", n)
    report = io.StringIO()
    try:
        # The writer is stuck: the seven queued lines are lost, and counted as such.
        assert queued.stop(timeout_s=0.05, report=report) == 7
    finally:
        stream.release.set()
    assert report.getvalue() == "7 log lines were dropped because the log output stalled\n"
    logger.removeHandler(handler)
