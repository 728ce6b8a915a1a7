"""A supervised engine process: restarted with backoff whenever it dies.

While it is down, ``alive()`` is False and ``generate`` raises ``EngineDownError`` at once
(the audit pipeline answers 503); the API process keeps serving everything else. When it
comes back, its environment is captured afresh; ``on_environment`` hears of every
environment it starts with, so a change (another GPU, a new driver) reaches the log
before any record made under it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from inference_wrapper.engine.process import EngineSpec, ProcessEngine
from inference_wrapper.engine.protocol import EngineBatch, EngineDownError, EngineResult, OnStep

log = logging.getLogger(__name__)

# Seconds before each restart attempt; an engine that keeps dying young climbs the list.
BACKOFF_S = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
# An engine that served this long before dying counts as healthy: its backoff starts over.
HEALTHY_AFTER_S = 30.0


class SupervisedEngine:
    """An ``EngineClient`` over a succession of ``ProcessEngine``s."""

    def __init__(self, spec: EngineSpec, *, backoff_s: tuple[float, ...] = BACKOFF_S,
                 on_environment: Callable[[Mapping[str, Any]], None] | None = None,
                 reserve: bool = True) -> None:
        self.spec = spec
        self.engine_id = spec.engine_id
        self.backoff_s = backoff_s
        self.on_environment = on_environment
        self.restarts = 0  # how many times it came back
        self.deaths = 0
        self._current: ProcessEngine | None = None
        self._environment: Mapping[str, Any] | None = None
        self._started_at = 0.0
        self._failures = 0  # consecutive young deaths or failed starts
        self._restarter: asyncio.Task[None] | None = None
        # A warm process held in reserve (``reserve``): a restart loads the model into it
        # instead of starting an interpreter and importing torch (tens of seconds on a
        # busy machine), at the cost of one idle process per engine.
        self.reserve = reserve
        self._reserve: ProcessEngine | None = None
        self._reserving: asyncio.Task[None] | None = None
        self._closing = False
        self.up = asyncio.Event()  # set while an engine process serves

    @property
    def pid(self) -> int | None:
        return self._current.pid if self._current is not None else None

    @property
    def reserve_pid(self) -> int | None:
        """The warm reserve's process, when one is ready."""
        spare = self._reserve
        return spare.pid if spare is not None and spare.warm else None

    async def start(self) -> None:
        """The first start: an engine that cannot load its model is an error to the caller
        (``serve`` refuses to start), not a restart loop."""
        await self._spawn()

    async def _spawn(self) -> None:
        if self._reserve is None and self._reserving is not None:
            # A reserve is part-way through its start: finishing it beats starting over.
            await asyncio.wait([self._reserving])
        engine, self._reserve = self._reserve, None
        if engine is None or not engine.warm:
            engine = ProcessEngine(self.spec, on_exit=self._exited)
        await engine.start()
        if self._closing:
            await engine.close()
            return
        environment = engine.environment()
        if self.on_environment is not None and environment != self._environment:
            try:
                self.on_environment(environment)  # may refuse it (another model)
            except BaseException:
                await engine.close()
                raise
        self._environment = environment
        self._current, self._started_at = engine, time.monotonic()
        self.up.set()
        if self.reserve and self._reserving is None:
            self._reserving = asyncio.get_running_loop().create_task(
                self._keep_reserve(), name=f"{self.engine_id}-reserve")

    async def _keep_reserve(self) -> None:
        spare = ProcessEngine(self.spec, on_exit=self._exited)
        try:
            await spare.spawn()
        except asyncio.CancelledError:  # closing: the half-started process goes too
            await asyncio.shield(spare.discard())
            raise
        except Exception:  # no reserve: the next restart starts a process from scratch
            log.exception("engine %s: no warm reserve", self.engine_id)
            return
        finally:
            self._reserving = None
        if self._closing:
            await spare.discard()
        else:
            self._reserve = spare

    def _exited(self, engine: ProcessEngine) -> None:
        if engine is not self._current:
            return
        self.up.clear()
        self.deaths += 1
        lived = time.monotonic() - self._started_at
        self._failures = 0 if lived >= HEALTHY_AFTER_S else self._failures + 1
        if not self._closing and self._restarter is None:
            self._restarter = asyncio.get_running_loop().create_task(
                self._restart(), name=f"{self.engine_id}-restart")

    async def _restart(self) -> None:
        try:
            while not self._closing:
                delay = self.backoff_s[min(self._failures, len(self.backoff_s) - 1)]
                log.warning("engine %s is down; restarting in %.1f s", self.engine_id, delay)
                await asyncio.sleep(delay)
                try:
                    await self._spawn()
                except Exception:
                    self._failures += 1
                    log.exception("engine %s failed to restart", self.engine_id)
                    continue
                self.restarts += 1
                log.warning("engine %s is back (pid %s)", self.engine_id, self.pid)
                return
        finally:
            self._restarter = None

    def environment(self) -> Mapping[str, Any]:
        if self._environment is None:
            raise EngineDownError(f"engine {self.engine_id} has not started")
        return self._environment

    def alive(self) -> bool:
        return self._current is not None and self._current.alive()

    async def generate(self, batch: EngineBatch, on_step: OnStep | None) -> EngineResult:
        current = self._current
        if current is None or not current.alive():
            raise EngineDownError(f"engine {self.engine_id} is down")
        return await current.generate(batch, on_step)

    async def close(self) -> None:
        self._closing = True
        for task in (self._restarter, self._reserving):
            if task is not None:
                task.cancel()
                await asyncio.wait([task])
        if self._reserve is not None:
            await self._reserve.discard()
        if self._current is not None:
            await self._current.close()
        self.up.clear()
