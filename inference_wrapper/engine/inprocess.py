"""The in-process engine: the model on one thread of this process (tests, ``generate``)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from inference_wrapper.engine.contract import TokenizationContract
from inference_wrapper.engine.environment import bind_contract, capture_environment
from inference_wrapper.engine.fingerprint.hardware import GpuProbe
from inference_wrapper.engine.generate import run_batch
from inference_wrapper.engine.model import LoadedModel
from inference_wrapper.engine.protocol import EngineBatch, EngineDownError, EngineResult, OnStep

GpuSampler = Callable[[], dict[str, Any] | None]


class InProcessEngine:
    """An ``EngineClient`` whose model runs on a dedicated thread named ``model``."""

    def __init__(self, loaded: LoadedModel, contract: TokenizationContract | None = None, *,
                 engine_id: str = "engine-0", probe: GpuProbe | None = None,
                 sample_gpu: GpuSampler | None = None) -> None:
        self.engine_id = engine_id
        self.loaded = loaded
        self.contract = bind_contract(loaded, contract)
        self._environment = capture_environment(loaded, self.contract, engine_id, probe)
        self._sample_gpu = sample_gpu
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="model")
        self._closed = False

    def environment(self) -> Mapping[str, Any]:
        return self._environment

    def run(self, batch: EngineBatch,
            on_step: Callable[[list[int | None]], None] | None = None) -> EngineResult:
        """The batch on the calling thread (``on_step`` called there too)."""
        return run_batch(self.loaded, self.contract, batch, engine_id=self.engine_id,
                         on_step=on_step, sample_gpu=self._sample_gpu)

    async def generate(self, batch: EngineBatch, on_step: OnStep | None) -> EngineResult:
        if self._closed:
            raise EngineDownError(f"{self.engine_id} is closed")
        loop = asyncio.get_running_loop()
        step = None if on_step is None else _on_loop(loop, on_step)
        try:
            return await loop.run_in_executor(self._thread,
                                              functools.partial(self.run, batch, step))
        except RuntimeError as exc:  # the thread was shut down under this batch
            if self._closed:
                raise EngineDownError(f"{self.engine_id} closed during a batch") from exc
            raise

    def alive(self) -> bool:
        return not self._closed

    async def close(self) -> None:
        self._closed = True
        # The batch in the model (if any) finishes; nothing new starts.
        await asyncio.get_running_loop().run_in_executor(
            None, functools.partial(self._thread.shutdown, wait=True, cancel_futures=True))


def _on_loop(loop: asyncio.AbstractEventLoop, on_step: OnStep) -> Callable[[list[int | None]],
                                                                          None]:
    """The model thread's per-step callback: hands the step's tokens to the event loop."""

    def step(tokens: list[int | None]) -> None:
        try:
            loop.call_soon_threadsafe(on_step, tokens)
        except RuntimeError:  # the loop is closed (shutdown): nobody reads any more
            pass

    return step
