"""Start ``audit-ledger serve`` as its own process on the tiny model, for tests that need
a real service process (fuzzing, signals)."""

from __future__ import annotations

import collections
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
READY_TIMEOUT_S = 300.0  # generous: a loaded machine loads torch slowly


@dataclass
class LiveService:
    process: subprocess.Popen[str]
    base_url: str
    client_token: str
    database_url: str
    # The last lines the service printed (its output is always drained, so a full pipe
    # never stalls it).
    output: collections.deque[str] = field(default_factory=lambda: collections.deque(
        maxlen=2000))

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=60)


def start_service(home: Path, model_dir: Path, *extra: str, module: str = "audit_cli.main",
                  env: dict[str, str] | None = None, drain: bool = True) -> LiveService:
    """Serve on a free port with a SQLite ledger under ``home``; wait until ready.

    After the start line the output is drained by a thread, unless ``drain`` is False:
    then the pipe is never read again (as by a stalled log collector). ``module`` runs the
    CLI through a wrapper, ``env`` adds variables.
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
    service = LiveService(process, f"http://127.0.0.1:{port}", "", database_url)
    for line in process.stdout:  # the first start prints the keys, then "serving ..."
        service.output.append(line)
        match = re.search(r"client\s+\(tenant default\): (\S+)", line)
        token = match.group(1) if match else token
        if line.startswith("serving"):
            break
    service.client_token = token
    if drain:
        threading.Thread(target=service.output.extend, args=(process.stdout,), daemon=True,
                         name="drain-service-output").start()
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        try:
            urllib.request.urlopen(f"{service.base_url}/readyz", timeout=5)
            return service
        except OSError as exc:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError("the service did not become ready:\n"
                                   + "".join(service.output)[-3000:]) from exc
            time.sleep(0.1)
