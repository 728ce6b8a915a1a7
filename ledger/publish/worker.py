"""Keep a published copy of the log current: after each seal (or every ``interval_s``),
publish the latest checkpoint, with its cosignatures, and the tiles it needs."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from ledger.publish.directory import DirectorySink
from ledger.publish.publisher import publish
from ledger.publish.s3 import S3Sink
from ledger.publish.sink import TileSink
from ledger.store.log_api import PublishableLog
from ledger.witness.cosignatures import cosigned_note

log = logging.getLogger(__name__)


def open_sink(location: str, retention_days: int | None = None) -> TileSink:
    """A directory path, or ``s3://bucket/prefix`` (objects locked for ``retention_days``)."""
    if location.startswith("s3://"):
        return S3Sink.from_url(location, **({} if retention_days is None
                                             else {"retention_days": retention_days}))
    return DirectorySink(Path(location))


def publish_latest(ledger: PublishableLog, sink: TileSink) -> int:
    """Publish the latest checkpoint; returns its size (0 when there is none yet)."""
    latest = ledger.latest_checkpoint()
    if latest is None:
        return 0
    note = cosigned_note(ledger, latest.size, latest.note)
    return publish(ledger.tiles, note, sink).size


class PublishWorker:
    def __init__(self, ledger: PublishableLog, sink: TileSink, interval_s: float = 5.0) -> None:
        self.ledger, self.sink, self.interval_s = ledger, sink, interval_s
        self.published = 0  # the size last published
        self.last_error: str | None = None
        self._wake, self._stop = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tiles-publisher", daemon=True)

    def start(self) -> PublishWorker:
        self._thread.start()
        return self

    def wake(self, *_: object) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(30)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval_s)
            self._wake.clear()
            try:
                self.published = publish_latest(self.ledger, self.sink)
                self.last_error = None
            except Exception as exc:  # a target that fails is retried next time
                if self.last_error != str(exc):
                    log.warning("publishing tiles failed: %s", exc)
                self.last_error = str(exc)
