"""The integrator: seals new log entries into signed checkpoints.

Several replicas may share one PostgreSQL log; a lease (an advisory lock on PostgreSQL, a
file lock beside a SQLite database) makes sure exactly one of them integrates (and
anchors) at a time. Safety never rests on the lease: the ``tree_state`` row lock orders
seals, so two replicas that both believe they lead still seal each size once. The lease
only keeps the work in one place, and it must move when its holder hangs.

On PostgreSQL the lease is a session-level advisory lock held on its own unpooled
session with ``idle_session_timeout = lease_ttl_s``; the holder renews it (a round trip
on that session) at least three times per TTL. A holder that freezes (SIGSTOP, a stalled
VM, a partition) stops renewing, the server ends its session, the lock is free, and
another replica takes it on its next tick. The holder checks its session is alive before
every seal, so a replica that wakes up after losing its session seals nothing.

The holder also fences: on every tick it ends other processes' writer sessions that hold
the ``tree_state`` row while waiting too long on their client
(``ledger.store.fencing``). A replica frozen between statements is ended by the server's
idle-in-transaction timeout anyway, but one frozen while still sending a statement leaves
its session "active" with no timeout armed, and only a terminate frees the sequencer then.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Protocol

from sqlalchemy.exc import DBAPIError

from ledger.checkpoint import NoteSigner
from ledger.errors import BackendError, SequencerBusyError
from ledger.store.fencing import Fencing, FencingReach
from ledger.store.lease import Lease, LeasedLog, PostgresLease, lease_for
from ledger.store.log_api import CheckpointSealer, StoredCheckpoint

log = logging.getLogger(__name__)


def default_replica_id() -> str:
    """``host:pid``: unique among live replicas, readable in ``sealed_by``."""
    return f"{socket.gethostname()}:{os.getpid()}"


class SealedLog(CheckpointSealer, Fencing, LeasedLog, Protocol):
    """What the integrator works on: a log it seals, whose stuck writers it fences, in a
    database where it takes its lease."""


class Integrator:
    """Seals a checkpoint every ``interval_s`` while it holds the lease, and on demand.

    The loop wakes at least three times per lease TTL to renew (or try to take) the
    lease, and seals when ``interval_s`` has passed since its last seal.
    """

    def __init__(self, ledger: SealedLog, signer: NoteSigner, origin: str,
                 interval_s: float = 1.0, lease: Lease | None = None,
                 replica_id: str | None = None) -> None:
        self.ledger = ledger
        self.signer = signer
        self.origin = origin
        self.interval_s = interval_s
        self.lease = lease or lease_for(ledger)
        self.replica_id = replica_id or default_replica_id()
        self._tick_s = min(interval_s, ledger.pg.lease_ttl_s / 3)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._on_seal: list[Callable[[StoredCheckpoint], None]] = []
        self.fenced_sessions = 0  # other replicas' stuck writer sessions this one ended
        # Whose stuck writers this replica's role can end (PostgreSQL; None until known).
        self.fencing_reach: FencingReach | None = None

    def subscribe(self, callback: Callable[[StoredCheckpoint], None]) -> None:
        """Call ``callback`` after each checkpoint this integrator seals (the anchoring
        worker's wake-up: it should return at once)."""
        self._on_seal.append(callback)

    @property
    def is_leader(self) -> bool:
        """Renew or take the lease now (a round trip); True if this replica holds it."""
        return self.lease.try_acquire()

    @property
    def holds_lease(self) -> bool:
        """The lease state at the last check, without a round trip (for /readyz)."""
        return self.lease.held

    def seal_now(self) -> StoredCheckpoint | None:
        """Seal the current head if this replica holds the lease and the tree grew."""
        if not self.lease.try_acquire():  # also proves the lease session is alive
            return None
        self.fence()
        sealed = self.ledger.seal_checkpoint(self.signer, self.origin,
                                             sealed_by=self.replica_id,
                                             lock_wait_s=self._tick_s)
        if sealed is not None:
            for callback in self._on_seal:
                callback(sealed)
        return sealed

    def fence(self) -> int:
        """As lease holder, end other replicas' writer sessions stuck on the sequencer.

        Never raises: a failed fence must not stop sealing (a seal waits at most one
        tick for the row anyway, and the next tick fences again)."""
        try:
            ended = self.ledger.fence_stuck_writers(self.ledger.pg.fence_after_s)
        except (DBAPIError, BackendError) as exc:
            log.warning("fencing stuck writers failed (%s: %s); sealing goes on",
                        type(exc).__name__, str(exc).splitlines()[0][:200])
            return 0
        for pid, application, quiet_s in ended:
            log.warning("ended a stuck writer session (pid %d, %s): it had held the "
                        "sequencer, waiting on its client, for %.1f s", pid, application,
                        quiet_s)
        self.fenced_sessions += len(ended)
        return len(ended)

    @property
    def alive(self) -> bool:
        """False only if the thread ended without being asked to stop."""
        return self._thread is None or self._thread.is_alive() or self._stop.is_set()

    def check_fencing_reach(self) -> FencingReach | None:
        """Learn (once) whose stuck writers this replica can fence, and warn if only its
        own role's: it would otherwise silently never fence replicas of another role."""
        if self.fencing_reach is not None or not self.ledger.is_postgres:  # no fencing
            return self.fencing_reach
        try:
            reach = self.ledger.fencing_reach()
        except (DBAPIError, BackendError):
            log.warning("cannot check this replica's fencing roles yet; retrying")
            return None
        if reach is not None and not reach.other_roles:
            log.warning("fencing limited: %s", reach.describe())
        self.fencing_reach = reach
        return reach

    def start(self) -> Integrator:
        self.check_fencing_reach()
        self._thread = threading.Thread(target=self._loop, name="integrator", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            self.seal_now()  # seal what the last appends added before going away
        finally:
            self.lease.release()
            if isinstance(self.lease, PostgresLease):
                self.lease.dispose()

    def _loop(self) -> None:
        # The first seal comes one interval after start, as every later one does (a zero
        # here made it depend on how long ago the machine booted: monotonic time).
        last_seal = time.monotonic()
        while not self._stop.wait(self._tick_s):
            try:
                self.check_fencing_reach()  # until known (the database may be away)
                if time.monotonic() - last_seal >= self.interval_s:
                    last_seal = time.monotonic()
                    self.seal_now()
                elif self.lease.try_acquire():  # renew between seals
                    self.fence()
            except SequencerBusyError:  # a peer holds the row: fence it if it stays stuck
                log.info("the sequencer row is busy; sealing at the next tick")
            except (DBAPIError, BackendError) as exc:  # expected: a peer froze, a failover
                log.warning("sealing a checkpoint failed (%s: %s); retrying",
                            type(exc).__name__, str(exc).splitlines()[0][:200])
            except Exception:  # a bug: keep integrating, but show where it came from
                log.exception("sealing a checkpoint failed; retrying")
