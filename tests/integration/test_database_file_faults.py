"""Issue 22: the SQLite database file vanishes, is replaced or stops being writable under
a real service process. The service fails closed: every generate is a 503 with
``Retry-After`` and no output, ``/readyz`` is 503, nothing is acknowledged into a file
nobody will read again, and the process never dies of SIGBUS (SQLite maps its WAL index
into memory; a write into that map of a file made unwritable is a SIGBUS), not even when
it stops."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import aiohttp
import pytest

from tests.live_service import LiveService, start_service

FILES = ("", "-wal", "-shm")


def _chattr(flag: str, paths: list[str]) -> bool:
    tool = shutil.which("chattr")
    return tool is not None and subprocess.run(
        [tool, flag, *paths], capture_output=True).returncode == 0


def _fault(kind: str, database: Path) -> None:
    files = [f"{database}{suffix}" for suffix in FILES]
    if kind == "vanished":
        for name in files:
            os.unlink(name)
    elif kind == "replaced":  # a restored copy moved over it, as an operator might
        shutil.copy(database, f"{database}.copy")
        os.replace(f"{database}.copy", database)
    elif not _chattr("+i", files):  # read-only even for root: the immutable flag
        pytest.skip("setting the immutable flag needs root on a file system that has it")


async def _generate(session: aiohttp.ClientSession, service: LiveService, i: int
                    ) -> tuple[int, dict[str, str], str]:
    try:
        async with session.post(f"{service.base_url}/v1/generate", json={
                "prompt": f"file fault {i}", "max_new_tokens": 2},
                headers={"Authorization": f"Bearer {service.client_token}"}) as response:
            return response.status, dict(response.headers), await response.text()
    except aiohttp.ClientError as exc:  # the service went away: say how it ended
        code = service.process.poll()
        raise AssertionError(f"request {i}: {exc!r}; the service's exit code {code}; its "
                             f"output: {''.join(service.output)[-3000:]}") from exc


@pytest.mark.parametrize("kind", ["vanished", "replaced", "read-only"])
async def test_a_database_file_fault_fails_closed_without_sigbus(
        tmp_path: Path, tiny_model_dir: Path, kind: str) -> None:
    service = start_service(tmp_path, tiny_model_dir)
    database = tmp_path / "ledger.db"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            assert (await _generate(session, service, 0))[0] == 200
            _fault(kind, database)
            # Several rounds: every one a 503 while the writer, the sealer and readiness
            # keep trying the database in the background.
            for i in range(1, 9):
                status, headers, body = await _generate(session, service, i)
                assert status == 503, body
                assert headers["Retry-After"] == "1"
                problem = json.loads(body)
                assert "output" not in problem and "record_id" not in problem, problem
                assert str(tmp_path) not in body and "sqlite" not in body.lower(), body
                async with session.get(f"{service.base_url}/readyz") as ready:
                    assert ready.status == 503, await ready.text()
                assert service.process.poll() is None, "".join(service.output)[-3000:]
        service.process.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(service.process.wait, 120)
        assert code != -signal.SIGBUS, "".join(service.output)[-3000:]
        assert code >= 0, "".join(service.output)[-3000:]  # it exited, no signal killed it
    finally:
        if service.process.poll() is None:
            service.process.kill()
            service.process.wait()
        if kind == "read-only":
            _chattr("-i", [f"{database}{suffix}" for suffix in FILES])
