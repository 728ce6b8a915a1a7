"""Start ``audit-ledger serve`` as its own process on the tiny model, for tests that need
a real service process (fuzzing, signals)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class LiveService:
    process: subprocess.Popen[str]
    base_url: str
    client_token: str
    database_url: str

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=60)


def start_service(home: Path, model_dir: Path, *extra: str, module: str = "audit_cli.main",
                  env: dict[str, str] | None = None) -> LiveService:
    """Serve on a free port with a SQLite ledger under ``home``; wait until ready.

    After the start line the output pipe is never read again (as by a stalled log
    collector); ``module`` runs the CLI through a wrapper, ``env`` adds variables.
    """
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    database_url = f"sqlite:///{home / 'ledger.db'}"
    process = subprocess.Popen(
        [sys.executable, "-m", module, "serve", "--port", str(port),
         "--db", database_url, "--model-dir", str(model_dir),
         "--model-manifest", str(model_dir.parent / f"{model_dir.name}.manifest.json"), *extra],
        cwd=ROOT, env=dict(os.environ, AUDIT_LEDGER_HOME=str(home), PYTHONUNBUFFERED="1",
                           **(env or {})),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None
    token = ""
    for line in process.stdout:  # the first start prints the keys, then "serving ..."
        match = re.search(r"client\s+\(tenant default\): (\S+)", line)
        token = match.group(1) if match else token
        if line.startswith("serving"):
            break
    base_url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(f"{base_url}/readyz", timeout=1)
            break
        except OSError:
            time.sleep(0.1)
    return LiveService(process, base_url, token, database_url)
