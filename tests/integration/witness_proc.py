"""Start ``audit-ledger witness serve`` as its own process on a free loopback port."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class WitnessProcess:
    process: subprocess.Popen[bytes]
    url: str
    home: Path
    vkey: str

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=60)

    def post(self, body: bytes) -> tuple[int, str, bytes]:
        """POST add-checkpoint; (status, full Content-Type header, body)."""
        request = urllib.request.Request(f"{self.url}/add-checkpoint", data=body,
                                         method="POST")
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, response.headers["Content-Type"], response.read()
        except urllib.error.HTTPError as exc:
            with exc:
                return exc.code, exc.headers["Content-Type"], exc.read()


def start_witness(home: Path, logs: list[tuple[str, str]], *, name: str = "witness.test/w",
                  port: int | None = None) -> WitnessProcess:
    """Serve with the given (origin, vkey) logs; wait until /healthz answers."""
    port = port or free_port()
    args = [sys.executable, "-m", "audit_cli.main", "witness", "--home", str(home),
            "--name", name, "serve", "--port", str(port)]
    for origin, vkey in logs:
        args += ["--log", origin, vkey]
    home.mkdir(parents=True, exist_ok=True)
    output = open(home / "witness.out", "ab")  # noqa: SIM115 - the child owns it
    process = subprocess.Popen(args, cwd=ROOT, stdout=output, stderr=subprocess.STDOUT,
                               env=dict(os.environ, PYTHONUNBUFFERED="1"))
    output.close()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=5) as response:
                health = json.load(response)
            return WitnessProcess(process, url, home, str(health["key"]))
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                process.wait()
                raise RuntimeError("witness did not start:\n" +
                                   (home / "witness.out").read_text()[-2000:]) from None
            time.sleep(0.1)
