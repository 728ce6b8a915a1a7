"""Watching the service's workers: if one dies, fail its waiters, turn unready, exit.

The workers are the ledger writer thread, the batching task, the integrator thread and
the anchor worker thread. Each already survives the errors it expects; one that stops
anyway has hit a bug, and the state it leaves (a half-committed group, a lost batch) is
safest rebuilt from the database by a fresh process. So the service does not restart a
worker in place: it answers 503 to every waiter, reports the dead worker on ``/readyz``
and stops with a non-zero exit status for its process supervisor (systemd, Kubernetes)
to restart it. See docs/decisions/0016-supervised-workers.md.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


@dataclass
class Lifecycle:
    """Process-wide state read by middleware and routes (no I/O to read it)."""

    shutting_down: bool = False  # set at SIGTERM / shutdown start: new requests get 503
    dead_worker: str | None = None  # the first worker found dead, if any
    on_fatal: list[Callable[[str], None]] = field(default_factory=list)
    in_flight: int = 0  # requests let past the shutdown gate and not yet answered
    # Set whenever in_flight drops to 0: the shutdown drain waits on it, not on a timer.
    _idle: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    @contextmanager
    def serving(self) -> Iterator[None]:
        """Count one request as in flight for as long as its handler runs."""
        self.in_flight += 1
        self._idle.clear()
        try:
            yield
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self._idle.set()

    async def drained(self) -> None:
        """Return once no request is in flight (at once if none is)."""
        while self.in_flight:  # a loop: another may have started since the event was set
            await self._idle.wait()


class Supervisor:
    """Polls each worker's liveness (in memory, cheap) on the event loop."""

    def __init__(self, checks: Mapping[str, Callable[[], bool]], lifecycle: Lifecycle,
                 interval_s: float = 0.2) -> None:
        self.checks = dict(checks)
        self.lifecycle = lifecycle
        self.interval_s = interval_s
        self._task: asyncio.Task[None] | None = None

    def status(self) -> dict[str, bool]:
        """``{"worker:<name>": alive}`` for ``/readyz`` (acting on a death it sees)."""
        found = {name: bool(alive()) for name, alive in self.checks.items()}
        for name, alive in found.items():
            if not alive:
                self._died(name)
        return {f"worker:{name}": alive for name, alive in found.items()}

    def check_once(self) -> str | None:
        """The first dead worker's name (acting on it once), or None."""
        for name, alive in self.checks.items():
            if not alive():
                self._died(name)
                return name
        return None

    def _died(self, name: str) -> None:
        if self.lifecycle.dead_worker is not None:
            return
        log.critical("worker %s died; failing its waiters and stopping the service", name)
        self.lifecycle.dead_worker = name
        self.lifecycle.shutting_down = True
        for action in self.lifecycle.on_fatal:
            try:
                action(name)
            except Exception:  # every action must run even if one fails
                log.exception("an action on the death of %s failed", name)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._watch(), name="supervisor")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task])

    async def _watch(self) -> None:
        while self.lifecycle.dead_worker is None:
            self.check_once()
            await asyncio.sleep(self.interval_s)
