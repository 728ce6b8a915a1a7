"""The ledger's durable append, watched: ``/readyz`` says not ready while appends fail.

Every append of the serving path (a batch's records, a stream's start record) goes
through ``WatchedJournal``. After a failed append the service is not ready until an
append succeeds, or until ``recheck_after_s`` passed without a new failure: a balancer
that took the replica out then sends traffic again, and the next append tells (a disk
that filled up and was freed, a database that became writable again).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from ledger.store.log_api import Appender


class WatchedJournal:
    def __init__(self, ledger: Appender, recheck_after_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ledger = ledger
        self.recheck_after_s = recheck_after_s
        self._clock = clock
        self.failed_at: float | None = None  # the latest failed append, while unresolved
        self.failures = 0

    def appending(self) -> bool:
        """False while the latest append failed (within ``recheck_after_s``)."""
        failed_at = self.failed_at
        return failed_at is None or self._clock() - failed_at > self.recheck_after_s

    def _outcome(self, ok: bool) -> None:
        if ok:
            self.failed_at = None
        else:
            self.failures += 1
            self.failed_at = self._clock()

    async def append_async(self, record: Any) -> Any:
        try:
            receipt = await self.ledger.append_async(record)
        except Exception:
            self._outcome(False)
            raise
        self._outcome(True)
        return receipt

    async def append_many_async(self, records: Sequence[Any]) -> list[Any]:
        try:
            outcomes = await self.ledger.append_many_async(records)
        except Exception:
            self._outcome(False)
            raise
        self._outcome(not any(isinstance(o, BaseException) for o in outcomes))
        return outcomes
