"""A real S3 API on loopback: moto's server mode in a child process (its Object Lock
included), for the tiles publisher's S3 driver."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def s3_server(log_dir: Path) -> Iterator[str]:
    """Start moto's server; yields its endpoint URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with open(log_dir / "moto.log", "wb") as log:  # output to a file: never an unread pipe
        child = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1",
                                  "-p", str(port)], stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), 0.5).close()
                    break
                except OSError:
                    if child.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError("moto server did not start") from None
                    time.sleep(0.05)
            yield f"http://127.0.0.1:{port}"
        finally:
            child.terminate()
            child.wait(30)


def s3_client(endpoint: str) -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                        aws_access_key_id="test", aws_secret_access_key="test")
