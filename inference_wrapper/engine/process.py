"""The subprocess engine: the model in a child process, driven over a socket pair.

The API process keeps no model and no GIL contention with one: audit work and the
decode loop run on different interpreters. A child that dies (``kill -9``, a CUDA error,
a segfault) fails the batch it held with ``EngineDownError``; the API process goes on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inference_wrapper.engine import wire
from inference_wrapper.engine.protocol import EngineBatch, EngineDownError, EngineResult, OnStep

log = logging.getLogger(__name__)


class EngineStartError(Exception):
    """The engine process could not load its model (the message says why)."""


class EngineBatchError(Exception):
    """The engine process failed one batch and goes on serving."""


@dataclass(frozen=True)
class EngineSpec:
    """What an engine process loads, and where."""

    engine_id: str
    model_dir: Path
    name: str | None = None
    manifest: Path | None = None  # the pinned manifest file the directory must match
    device: str | None = None
    torch_threads: int = 1
    contract: Mapping[str, Any] | None = None  # TokenizationContract fields
    env: Mapping[str, str] = field(default_factory=dict)  # e.g. CUDA_VISIBLE_DEVICES

    def argument(self, fd: int) -> str:
        return json.dumps({
            "engine_id": self.engine_id, "model_dir": str(self.model_dir), "name": self.name,
            "manifest": str(self.manifest) if self.manifest else None, "device": self.device,
            "torch_threads": self.torch_threads,
            "contract": dict(self.contract) if self.contract else None, "fd": fd})


@dataclass(eq=False)
class _Pending:
    future: asyncio.Future[EngineResult]
    on_step: OnStep | None


class ProcessEngine:
    """One engine process, from start to exit; ``SupervisedEngine`` starts the next."""

    def __init__(self, spec: EngineSpec, on_exit: Callable[[ProcessEngine], None] | None = None
                 ) -> None:
        self.spec = spec
        self.engine_id = spec.engine_id
        self.on_exit = on_exit
        self.pid: int | None = None
        self._environment: Mapping[str, Any] | None = None
        self._process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._pending: dict[int, _Pending] = {}
        self._next_id = 0
        self._down = True
        self._tasks: list[asyncio.Task[Any]] = []
        self._relay: asyncio.Task[None] | None = None

    async def spawn(self, timeout_s: float = 600.0) -> None:
        """Start the process and wait until it is warm (model stack imported, nothing
        loaded yet); raises ``EngineStartError``."""
        ours, theirs = socket.socketpair()
        try:
            self._process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "inference_wrapper.engine.worker",
                self.spec.argument(theirs.fileno()), pass_fds=(theirs.fileno(),),
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT, env={**os.environ, **self.spec.env})
        finally:
            theirs.close()  # the child holds its end; ours sees EOF when it dies
        self.pid = self._process.pid
        assert self._process.stdout is not None
        self._relay = asyncio.get_running_loop().create_task(
            _relay(self._process.stdout, self.engine_id), name=f"{self.engine_id}-output")
        self._reader, self._writer = await asyncio.open_unix_connection(sock=ours)
        await self._expect("warm", timeout_s)

    @property
    def warm(self) -> bool:
        """Spawned and waiting for ``start``, its process still there."""
        return (self._reader is not None and self._down and self._environment is None
                and self._process is not None and self._process.returncode is None)

    async def start(self, timeout_s: float = 600.0) -> None:
        """Load the model (spawning first unless warm) and wait for its environment;
        raises ``EngineStartError``."""
        if not self.warm:
            await self.spawn(timeout_s)
        assert self._writer is not None and self._reader is not None
        self._writer.write(wire.encode({"type": "load"}))
        first = await self._expect("ready", timeout_s)
        self._environment = first["environment"]
        self._down = False
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._read(self._reader),
                                        name=f"{self.engine_id}-reader")]

    async def _expect(self, kind: str, timeout_s: float) -> dict[str, Any]:
        assert self._reader is not None and self._process is not None
        try:
            message = await asyncio.wait_for(wire.read(self._reader), timeout_s)
        except TimeoutError:
            message = {"type": "failed", "error": f"no answer within {timeout_s:.0f} s"}
        if message is None or message["type"] != kind:
            await self.discard()
            why = "it exited" if message is None else message.get("error", message["type"])
            raise EngineStartError(f"engine {self.engine_id} did not start: {why}")
        return message

    async def discard(self) -> None:
        """Stop a process that never served (a failed start, an unused reserve)."""
        if self._process is not None and self._process.returncode is None:
            self._process.kill()
        if self._process is not None:
            await self._process.wait()
        if self._writer is not None:
            self._writer.close()
        if self._relay is not None:
            await asyncio.wait([self._relay], timeout=30)  # its output, to the last line

    def environment(self) -> Mapping[str, Any]:
        if self._environment is None:
            raise EngineDownError(f"engine {self.engine_id} has not started")
        return self._environment

    def alive(self) -> bool:
        return not self._down

    async def generate(self, batch: EngineBatch, on_step: OnStep | None) -> EngineResult:
        if self._down or self._writer is None:
            raise EngineDownError(f"engine {self.engine_id} is down")
        self._next_id += 1
        batch_id = self._next_id
        pending = _Pending(asyncio.get_running_loop().create_future(), on_step)
        self._pending[batch_id] = pending
        self._writer.write(wire.encode({"type": "generate", "id": batch_id,
                                        "stream": on_step is not None,
                                        "batch": batch.to_wire()}))
        try:
            return await pending.future
        finally:
            self._pending.pop(batch_id, None)

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                message = await wire.read(reader)
                if message is None:
                    break
                pending = self._pending.get(message.get("id", -1))
                if pending is None or pending.future.done():
                    continue
                if message["type"] == "step":
                    if pending.on_step is not None:
                        pending.on_step(message["tokens"])
                elif message["type"] == "result":
                    pending.future.set_result(EngineResult.from_wire(message["result"]))
                elif message["type"] == "error":
                    pending.future.set_exception(EngineBatchError(message["error"]))
        except Exception:  # a garbled frame: this engine cannot be trusted any more
            log.exception("engine %s sent a frame that could not be read", self.engine_id)
        finally:
            await self._gone()

    async def _gone(self) -> None:
        was_down, self._down = self._down, True
        for pending in self._pending.values():
            if not pending.future.done():
                pending.future.set_exception(
                    EngineDownError(f"engine {self.engine_id} went down during the batch"))
        if not was_down and self.on_exit is not None:
            self.on_exit(self)  # before anyone who saw the failure runs again
        if self._process is not None and self._process.returncode is None:
            self._process.kill()  # a garbled stream: make sure it is really gone
        if self._process is not None:
            code = await self._process.wait()
            if not was_down:
                log.error("engine %s (pid %s) exited with %s", self.engine_id, self.pid, code)
        if self._writer is not None:
            self._writer.close()
        if self._relay is not None:
            await asyncio.wait([self._relay], timeout=30)

    async def close(self, timeout_s: float = 30.0) -> None:
        """Ask the process to exit after its batch; kill it if it does not."""
        if self._down or self._writer is None or self._process is None:
            return
        self._down = True  # an exit from here on is expected: no on_exit
        try:
            self._writer.write(wire.encode({"type": "close"}))
            await asyncio.wait_for(self._process.wait(), timeout_s)
        except (TimeoutError, ConnectionError):
            self._process.kill()
            await self._process.wait()
        for task in self._tasks:
            await asyncio.wait([task], timeout=timeout_s)
        self._writer.close()
        if self._relay is not None:
            await asyncio.wait([self._relay], timeout=timeout_s)


async def _relay(output: asyncio.StreamReader, engine_id: str) -> None:
    """The engine's output, line by line, into this process's log: always read (an
    unread pipe would stall the engine), and subject to the log's own drop policy."""
    while True:
        try:
            line = await output.readline()
        except ValueError:  # a line over the stream's limit: take it in pieces
            line = await output.read(1 << 16)
        if not line:
            return
        log.info("engine %s: %s", engine_id, line.decode(errors="replace").rstrip())
