"""The service's periodic retention expiry names every erasure leaf it wrote: a large
expiry is logged in several leaves (decision 0061), and an operator tracing one in the
log must find them all, not only the first."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from typing import Any

import pytest
from aiohttp import web

from inference_wrapper.server.appkeys import LEDGER
from inference_wrapper.server.content import _expire_periodically
from ledger.store.vault import Erasure


class _ExpiringVault:
    """What the loop asks of the vault: ``expire`` (the real one erases and appends;
    here its answer is fixed, since only the log line is under test). Its second call
    means the first run has been logged."""

    def __init__(self, erasures: list[Erasure], logged: asyncio.Event,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.erasures, self.logged, self.loop, self.calls = erasures, logged, loop, 0

    def expire(self, ledger: Any) -> tuple[list[Erasure], list[Any]]:
        self.calls += 1
        if self.calls == 2:
            self.loop.call_soon_threadsafe(self.logged.set)
            return [], []
        return self.erasures, []


def test_an_expiry_in_several_leaves_is_logged_with_every_leaf(
        caplog: pytest.LogCaptureFixture) -> None:
    erasure = Erasure("bank-1", [f"r{n}" for n in range(450)], "e-1", 10,
                      datetime(2026, 12, 6, tzinfo=UTC), ("e-1", "e-2", "e-3"), (10, 11, 12))

    async def run() -> None:
        logged = asyncio.Event()
        app = web.Application()
        app[LEDGER] = object()  # type: ignore[assignment]
        vault = _ExpiringVault([erasure], logged, asyncio.get_running_loop())
        task = asyncio.create_task(_expire_periodically(vault, app, 0.0))  # type: ignore[arg-type]
        await logged.wait()
        task.cancel()

    with caplog.at_level(logging.INFO, logger="audit_ledger.vault"):
        asyncio.run(run())
    said = [r.getMessage() for r in caplog.records if "retention expiry" in r.getMessage()]
    assert said == ["retention expiry erased 450 records of tenant bank-1 (erasure records "
                    "e-1, e-2, e-3)"]
