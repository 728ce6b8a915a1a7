"""A test's own hooks around the tiny generator and its in-process engine.

Everything a subclass does not override is the inner generator's. ``run_batch(batch,
on_step)`` is what the engine runs on its model thread for each batch (an
``EngineBatch``), so a subclass can count, hold or change the model step; ``gate`` holds
back whichever step the subclass makes wait (``wait_for_gate``), so a test decides when
that step may go on instead of sleeping and hoping.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any


class HookedEngine:
    """An engine that runs each batch through its wrapper's ``run_batch``."""

    def __init__(self, wrapper: WrappedGenerator, inner: Any) -> None:
        self.wrapper, self.inner = wrapper, inner
        self.engine_id = inner.engine_id
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="model")

    def environment(self) -> Mapping[str, Any]:
        return self.inner.environment()  # type: ignore[no-any-return]

    def alive(self) -> bool:
        return self.inner.alive()  # type: ignore[no-any-return]

    async def generate(self, batch: Any, on_step: Callable[[list[int | None]], None] | None
                       ) -> Any:
        loop = asyncio.get_running_loop()
        step = None if on_step is None else functools.partial(loop.call_soon_threadsafe,
                                                              on_step)
        return await loop.run_in_executor(
            self._thread, functools.partial(self.wrapper.run_batch, batch, step))

    async def close(self) -> None:
        self._thread.shutdown(wait=False)


class WrappedGenerator:
    def __init__(self, inner: Any, *, gate_open: bool = False) -> None:
        self.inner = inner
        self.engine = inner.engines[0]
        self.engines = [HookedEngine(self, self.engine)]
        self.gate = threading.Event()
        if gate_open:
            self.gate.set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def run_batch(self, batch: Any, on_step: Any = None) -> Any:
        """One batch on the model thread; ``on_step`` when the batch streams."""
        return self.engine.run(batch, on_step)

    def wait_for_gate(self) -> None:
        assert self.gate.wait(120), "the test never opened the gate"
