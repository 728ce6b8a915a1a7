"""The anchoring worker: anchors the newest sealed checkpoint, retrying with backoff.

The outbox is durable by construction: it is the ``checkpoints`` table itself; every
checkpoint larger than the newest anchored one is pending. Anchoring the newest covers
all older ones (each is a prefix of it, proven by consistency), so nothing is dropped
and anchors never go backwards.

The worker is woken by the integrator as soon as a checkpoint is sealed (``wake``), so a
checkpoint waits for no polling interval; the interval is only a safety net. Registration
with the anchor (Fabric's ``InitLog``) happens here, with the same backoff, so the service
starts and serves (under its keep-serving or fail-closed policy) while the anchor is
unreachable. A configuration error (unknown channel or chaincode) is kept in
``config_error`` for /readyz and retried only after a long pause; so is a conflict (the
anchor holds something that is not a checkpoint of this log: a restored backup, a fork),
kept in ``conflict``: retrying soon cannot fix either, and both need an operator.

The backlog and lag that /metrics and /readyz show are re-read from the database every
``refresh_s`` while the worker waits or backs off, not only when it anchors: an outage
shows its growing backlog as it grows.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from ledger.errors import (
    BackendConfigurationError,
    BackendUnavailableError,
    VerificationError,
)
from ledger.store.log_api import AnchorStore, StoredCheckpoint

log = logging.getLogger(__name__)
POLICIES = ("keep-serving", "fail-closed")


class Anchor(Protocol):
    kind: str

    def prepare(self) -> None:
        """Whatever must happen once before anchoring (e.g. registering the log's key);
        idempotent, retried by the worker until it succeeds."""

    def anchor(self, note: bytes) -> object: ...


class CheckpointOutbox(Protocol):
    """What the worker reads of the log: its checkpoints, the outbox of anchoring, and
    the anchors recorded for them."""

    def latest_checkpoint(self) -> StoredCheckpoint | None: ...

    def checkpoints_after(self, size: int) -> tuple[int, datetime | None, int]:
        """(how many checkpoints are larger than ``size``, the oldest one's seal time,
        the largest size)."""

    @property
    def anchors(self) -> AnchorStore: ...


@dataclass(frozen=True)
class AnchorStatus:
    anchored_size: int
    newest_size: int
    backlog: int  # sealed checkpoints newer than the newest anchored one
    lag_s: float  # how long the oldest pending checkpoint has waited (0 if none)
    slo_breached: bool


class AnchorWorker:
    def __init__(self, ledger: CheckpointOutbox, anchor: Anchor, *, interval_s: float = 1.0,
                 max_backoff_s: float = 30.0, config_backoff_s: float = 300.0,
                 lag_slo_s: float = 10.0, policy: str = "keep-serving",
                 store: AnchorStore | None = None,
                 leader: Callable[[], bool] | None = None, refresh_s: float = 1.0) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}")
        self.ledger, self.anchor = ledger, anchor
        self.store: AnchorStore = store or getattr(anchor, "store", None) or ledger.anchors
        self.interval_s, self.max_backoff_s = interval_s, max_backoff_s
        self.config_backoff_s = config_backoff_s
        self.lag_slo_s, self.policy = lag_slo_s, policy
        # Several replicas on one log: only the one this says leads anchors (no race on
        # the anchors table); None anchors unconditionally.
        self.leader = leader
        self.failures = 0
        self.prepared = False
        self.config_error: str | None = None  # shown by /readyz until anchoring works
        self.conflict: str | None = None  # likewise: the anchor holds another history
        self.refresh_s = refresh_s
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._running = threading.Lock()  # one anchoring attempt at a time per process
        self._thread: threading.Thread | None = None
        self.after_anchor: Callable[[], object] | None = None  # e.g. wake the witness client
        # The last state read from the database, kept in memory so that routes and
        # metrics never query on the event loop: (anchored, newest, backlog, oldest).
        self._known: tuple[int, int, int, datetime | None] = (0, 0, 0, None)

    def status(self) -> AnchorStatus:
        """Read the state from the database (blocking) and remember it."""
        anchored = self.store.latest()
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

    def wake(self, *_: object) -> None:
        """A checkpoint was sealed: anchor it now rather than at the next interval."""
        self._wake.set()

    def run_once(self) -> bool:
        """Anchor the newest checkpoint if it is not anchored yet; True if it anchored.

        What it read is remembered as the state (nothing pending as of those reads), so
        the loop need not query it again after each anchoring: a checkpoint sealed since
        wakes the worker, and the next pass reads and anchors it."""
        with self._running:
            if not self.prepared:
                self.anchor.prepare()
                self.prepared = True
            newest = self.ledger.latest_checkpoint()
            anchored = self.store.latest()
            anchored_size = anchored.size if anchored is not None else 0
            if newest is None or (anchored is not None and anchored_size >= newest.size):
                self._known = (anchored_size, anchored_size, 0, None)
                return False
            self.anchor.anchor(newest.note)
            self._known = (newest.size, newest.size, 0, None)
        if self.after_anchor is not None:
            self.after_anchor()
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
        self._wake.set()
        if self._thread is not None:
            self._thread.join()

    def _pause(self, wait: float) -> None:
        """Wait ``wait`` seconds (a wake ends it unless backing off), refreshing the
        remembered state every ``refresh_s`` meanwhile."""
        deadline = time.monotonic() + wait
        while not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            event = self._stop if self.failures else self._wake  # backing off: no wake
            if event.wait(min(left, self.refresh_s)):
                return
            self._refresh()

    def _refresh(self) -> None:
        try:
            self.status()
        except Exception:  # the database is away: keep the last known state
            log.debug("could not refresh the anchoring state", exc_info=True)

    def _loop(self) -> None:
        wait = 0.0  # register (and anchor any backlog) at once
        while not self._stop.is_set():
            self._pause(wait)
            if self._stop.is_set():
                break
            self._wake.clear()  # cleared BEFORE reading the newest checkpoint: no lost wake
            read = False  # did run_once leave the state it read (no query needed)?
            try:
                # Only the replica holding the sealing lease anchors (no races on the
                # anchors table between replicas).
                if self.leader is None or self.leader():
                    self.run_once()
                    read = True
                self.failures, wait, self.config_error = 0, self.interval_s, None
                self.conflict = None
            except VerificationError as exc:
                self.failures += 1
                self.conflict = str(exc)
                wait = self.config_backoff_s
                log.error("anchoring stopped: %s; an operator must look (retrying in %.0f s)",
                          exc, wait)
            except BackendConfigurationError as exc:
                self.failures += 1
                self.config_error = str(exc)
                wait = self.config_backoff_s
                log.error("anchoring is misconfigured: %s; retrying in %.0f s",
                          exc.diagnostics(), wait)
            except BackendUnavailableError as exc:
                self.failures += 1
                wait = min(self.max_backoff_s, self.interval_s * 2 ** self.failures)
                log.warning("anchor unavailable (%s); retrying in %.1f s", exc, wait)
            except Exception:
                self.failures += 1
                wait = min(self.max_backoff_s, self.interval_s * 2 ** self.failures)
                log.exception("anchoring failed; retrying in %.1f s", wait)
            if read:  # once a second under load: two queries fewer each time
                continue
            try:
                status = self.status()
            except Exception:  # the database is away: keep the last known state
                log.warning("could not read the anchoring state; keeping the last one")
                status = self.current()
            if self.failures and status.slo_breached:
                log.error("anchoring lag %.1f s breaches the %.1f s SLO (%d pending, policy %s)",
                          status.lag_s, self.lag_slo_s, status.backlog, self.policy)
