"""Graceful shutdown of a real service process: in-flight requests are answered and
their records committed before the process exits."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import aiohttp

from ledger.store.sql import SqlLedger

ROOT = Path(__file__).resolve().parents[2]


async def test_sigterm_drains_in_flight_requests(tmp_path: Path, tiny_model_dir: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    db = f"sqlite:///{tmp_path / 'ledger.db'}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "audit_cli.main", "serve", "--port", str(port), "--db", db,
         "--model-dir", str(tiny_model_dir), "--max-batch", "4",
         "--model-manifest", str(tiny_model_dir.parent / "tiny-llama.manifest.json")],
        cwd=ROOT, env=dict(os.environ, AUDIT_LEDGER_HOME=str(tmp_path), PYTHONUNBUFFERED="1"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    token = ""
    for line in proc.stdout:
        match = re.search(r"client\s+\(tenant default\): (\S+)", line)
        token = match.group(1) if match else token
        if line.startswith("serving"):
            break
    base = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as session:
        for _ in range(300):
            try:
                async with session.get(f"{base}/readyz") as response:
                    if response.status == 200:
                        break
            except aiohttp.ClientError:
                await asyncio.sleep(0.1)

        async def call(i: int) -> tuple[int, dict[str, object]]:
            async with session.post(f"{base}/v1/generate", json={
                    "prompt": f"drain {i}", "max_new_tokens": 48},
                    headers={"Authorization": f"Bearer {token}"}) as response:
                return response.status, await response.json()

        calls = [asyncio.ensure_future(call(i)) for i in range(12)]
        await asyncio.sleep(0.3)  # the requests are queued or generating
        proc.send_signal(signal.SIGTERM)
        results = await asyncio.gather(*calls)
    assert proc.wait(timeout=120) == 0
    answered = [body for status, body in results if status == 200]
    assert len(answered) == 12, results
    with SqlLedger(db) as ledger:
        assert ledger.tree_head()[0] == 12
        for body in answered:
            assert ledger.get_record(str(body["record_id"])) is not None
