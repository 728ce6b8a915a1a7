"""The anchoring worker: anchors the newest sealed checkpoint, retrying with backoff.

The outbox is durable by construction: it is the ``checkpoints`` table itself; every
checkpoint larger than the newest anchored one is pending. Anchoring the newest covers
all older ones (each is a prefix of it, proven by consistency), so nothing is dropped
and anchors never go backwards.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from ledger.anchor.local import LocalAnchor
from ledger.errors import BackendUnavailableError
from ledger.store.sql import SqlLedger

log = logging.getLogger(__name__)
POLICIES = ("keep-serving", "fail-closed")


class Anchor(Protocol):
    kind: str

    def anchor(self, note: bytes) -> object: ...


@dataclass(frozen=True)
class AnchorStatus:
    anchored_size: int
    newest_size: int
    backlog: int  # sealed checkpoints newer than the newest anchored one
    lag_s: float  # how long the oldest pending checkpoint has waited (0 if none)
    slo_breached: bool


class AnchorWorker:
    def __init__(self, ledger: SqlLedger, anchor: Anchor, *, interval_s: float = 1.0,
                 max_backoff_s: float = 30.0, lag_slo_s: float = 10.0,
                 policy: str = "keep-serving", leader: Callable[[], bool] | None = None
                 ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}")
        self.ledger, self.anchor = ledger, anchor
        self.interval_s, self.max_backoff_s = interval_s, max_backoff_s
        self.lag_slo_s, self.policy = lag_slo_s, policy
        # Several replicas on one log: only the one this says leads anchors (no race on
        # the anchors table); None anchors unconditionally.
        self.leader = leader
        self.failures = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def status(self) -> AnchorStatus:
        anchored = LocalAnchor.latest_row(self.ledger)
        anchored_size = anchored.size if anchored else 0
        backlog, oldest, newest = self.ledger.checkpoints_after(anchored_size)
        lag = 0.0
        if oldest is not None:
            lag = (datetime.now(UTC).replace(tzinfo=None) - oldest).total_seconds()
        return AnchorStatus(anchored_size, newest, backlog, lag, lag > self.lag_slo_s)

    @property
    def serving_allowed(self) -> bool:
        """False only under the fail-closed policy while the lag SLO is breached."""
        return self.policy == "keep-serving" or not self.status().slo_breached

    def run_once(self) -> bool:
        """Anchor the newest checkpoint if it is not anchored yet; True if it anchored."""
        newest = self.ledger.latest_checkpoint()
        anchored = LocalAnchor.latest_row(self.ledger)
        if newest is None or (anchored is not None and anchored.size >= newest.size):
            return False
        self.anchor.anchor(newest.note)
        return True

    def start(self) -> AnchorWorker:
        self._thread = threading.Thread(target=self._loop, name="anchor-worker", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _loop(self) -> None:
        wait = self.interval_s
        while not self._stop.wait(wait):
            try:
                if self.leader is None or self.leader():
                    self.run_once()
                self.failures, wait = 0, self.interval_s
            except BackendUnavailableError as exc:
                self.failures += 1
                wait = min(self.max_backoff_s, self.interval_s * 2 ** self.failures)
                log.warning("anchor unavailable (%s); retrying in %.1f s", exc, wait)
            except Exception:
                self.failures += 1
                wait = min(self.max_backoff_s, self.interval_s * 2 ** self.failures)
                log.exception("anchoring failed; retrying in %.1f s", wait)
            status = self.status() if self.failures else None
            if status is not None and status.slo_breached:
                log.error("anchoring lag %.1f s breaches the %.1f s SLO (%d pending, policy %s)",
                          status.lag_s, self.lag_slo_s, status.backlog, self.policy)


