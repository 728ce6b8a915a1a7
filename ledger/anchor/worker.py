"""The anchoring worker: anchors the newest sealed checkpoint, retrying with backoff.

The outbox is durable by construction: it is the ``checkpoints`` table itself; every
checkpoint larger than the newest anchored one is pending. Anchoring the newest covers
all older ones (each is a prefix of it, proven by consistency), so nothing is dropped
and anchors never go backwards.
"""

from __future__ import annotations

import logging
import threading
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
                 policy: str = "keep-serving") -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}")
        self.ledger, self.anchor = ledger, anchor
        self.interval_s, self.max_backoff_s = interval_s, max_backoff_s
        self.lag_slo_s, self.policy = lag_slo_s, policy
        self.failures = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # The last state read from the database, kept in memory so that routes and
        # metrics never query on the event loop: (anchored, newest, backlog, oldest).
        self._known: tuple[int, int, int, datetime | None] = (0, 0, 0, None)

    def status(self) -> AnchorStatus:
        """Read the state from the database (blocking) and remember it."""
        anchored = LocalAnchor.latest_row(self.ledger)
        anchored_size = anchored.size if anchored else 0
        backlog, oldest, newest = self.ledger.checkpoints_after(anchored_size)
        self._known = (anchored_size, newest, backlog, oldest)
        return self.current()

    def current(self) -> AnchorStatus:
        """The remembered state, with the lag aged to now; no I/O."""
        anchored_size, newest, backlog, oldest = self._known
        lag = 0.0
        if oldest is not None:
            lag = max(0.0, (datetime.now(UTC).replace(tzinfo=None) - oldest).total_seconds())
        return AnchorStatus(anchored_size, newest, backlog, lag, lag > self.lag_slo_s)

    @property
    def serving_allowed(self) -> bool:
        """False only under the fail-closed policy while the lag SLO is breached."""
        return self.policy == "keep-serving" or not self.current().slo_breached

    @property
    def alive(self) -> bool:
        """False only if the thread ended without being asked to stop."""
        return self._thread is None or self._thread.is_alive() or self._stop.is_set()

    def run_once(self) -> bool:
        """Anchor the newest checkpoint if it is not anchored yet; True if it anchored."""
        newest = self.ledger.latest_checkpoint()
        anchored = LocalAnchor.latest_row(self.ledger)
        if newest is None or (anchored is not None and anchored.size >= newest.size):
            return False
        self.anchor.anchor(newest.note)
        return True

    def start(self) -> AnchorWorker:
        try:
            self.status()
        except Exception:
            log.warning("could not read the anchoring state at start")
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
            try:
                status = self.status()
            except Exception:  # the database is away: keep the last known state
                log.warning("could not read the anchoring state; keeping the last one")
                status = self.current()
            if self.failures and status.slo_breached:
                log.error("anchoring lag %.1f s breaches the %.1f s SLO (%d pending, policy %s)",
                          status.lag_s, self.lag_slo_s, status.backlog, self.policy)


