"""Real ``audit-ledger serve`` replicas on one database, for failover tests and the bench.

Each replica's output goes to its own log file (never an undrained pipe), so tests can
read what it printed and look for errors afterwards.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Replica:
    name: str
    process: subprocess.Popen[bytes]
    base_url: str
    log_path: Path

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def readyz(self, timeout: float = 2.0) -> dict[str, Any] | None:
        """The /readyz body, or None when the replica does not answer in time."""
        try:
            with urllib.request.urlopen(f"{self.base_url}/readyz", timeout=timeout) as resp:
                body: dict[str, Any] = json.loads(resp.read())
                return body
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read())
            return body
        except (OSError, http.client.HTTPException, ValueError):
            return None  # not (yet) answering, or not answering HTTP

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.terminate()
        return self.process.wait(timeout=120)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def launch(name: str, workdir: Path, model_dir: Path, database_url: str,
           env: dict[str, str] | None = None, *extra: str) -> Replica:
    """Start a replica; do not wait for it."""
    port = free_port()
    log_path = workdir / f"{name}.log"
    manifest = model_dir.parent / f"{model_dir.name}.manifest.json"
    with log_path.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "audit_cli.main", "serve", "--port", str(port),
             "--db", database_url, "--model-dir", str(model_dir),
             "--model-manifest", str(manifest), *extra],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=dict(os.environ, PYTHONUNBUFFERED="1", AUDIT_LEDGER_REPLICA_ID=name,
                     AUDIT_LEDGER_HOME=str(workdir / "home"), **(env or {})))
    return Replica(name, process, f"http://127.0.0.1:{port}", log_path)


def wait_ready(replica: Replica, timeout_s: float = 180.0) -> None:
    """Until /readyz says ready; fails with the replica's output if it exits or never is."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if replica.process.poll() is not None:
            raise AssertionError(f"{replica.name} exited {replica.process.returncode}:\n"
                                 f"{replica.output()[-3000:]}")
        body = replica.readyz(timeout=1.0)
        if body is not None and body.get("ready"):
            return
        time.sleep(0.1)
    raise AssertionError(f"{replica.name} not ready in {timeout_s} s:\n{replica.output()[-3000:]}")


def client_token(replica: Replica) -> str:
    """The client key the first replica on a fresh log printed."""
    match = re.search(r"client\s+\(tenant default\): (\S+)", replica.output())
    assert match, replica.output()[-2000:]
    return match.group(1)


def generate(base_url: str, token: str, prompt: str, timeout: float = 60.0
             ) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        f"{base_url}/v1/generate", method="POST",
        data=json.dumps({"prompt": prompt, "max_new_tokens": 1}).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")
