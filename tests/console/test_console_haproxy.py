"""Console sessions on every replica, behind the shipped HAProxy configuration.

Two real ``audit-ledger serve`` processes on one PostgreSQL log (one log key) and a real
``haproxy`` (Debian's, installed by scripts/setup.sh) on loopback, started from
deploy/haproxy/haproxy.cfg with only its Docker parts replaced (bind address, DNS
resolver, server addresses); the balancing, health checks and the absence of
stickiness are the shipped file's. A browser-like client signs in once and keeps
opening console pages, each on a new connection: HAProxy's own request log shows that
both replicas served them, and every one was signed in (decision 0041).
Every child's output goes to a file, never an undrained pipe.
"""

from __future__ import annotations

import http.client
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode

import pytest
from sqlalchemy import create_engine

from ledger.store.apikeys import ApiKeyStore
from ledger.store.keys import open_log_identity
from ledger.store.migrate import upgrade
from ledger.store.sql import SqlLedger
from tests.integration.conftest import make_pg_database
from tests.replica_cluster import ROOT, free_port, launch, wait_ready

__all__ = ["make_pg_database"]  # the fixture, imported for this test
SHIPPED = ROOT / "deploy" / "haproxy" / "haproxy.cfg"
OVERALL_S = 180.0  # a generous ceiling for each awaited state on a loaded 2-core machine


def loopback_config(port: int, replicas: list[int]) -> str:
    """The shipped configuration for loopback: each Docker-only line replaced, and each
    replacement checked to have matched (a changed shipped file fails here, loudly)."""
    text = SHIPPED.read_text()
    servers = "\n".join(f"    server replica{i + 1} 127.0.0.1:{p}"
                        for i, p in enumerate(replicas))
    for old, new in (
            ("    bind :8080", f"    bind 127.0.0.1:{port}"),
            (" resolvers docker init-addr none", ""),
            ("    server-template replica 1-8 audit-ledger:8080", servers)):
        assert text.count(old) == 1, f"the shipped haproxy.cfg no longer has {old!r}"
        text = text.replace(old, new)
    resolvers = re.search(r"^resolvers docker\n(?:    .*\n)+", text, re.M)
    assert resolvers is not None
    return text.replace(resolvers.group(0), "")


def request(port: int, method: str, path: str, cookies: dict[str, str],
            form: dict[str, str] | None = None) -> tuple[int, dict[str, str], str]:
    """One request on a new connection (so HAProxy balances each one)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Connection": "close"}
    if cookies:
        headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in cookies.items())
    body = None
    if form is not None:
        body = urlencode(form)
        headers["Content-Type"] = "application/x-www-form-urlencoded"
    try:
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        for header in response.headers.get_all("Set-Cookie") or []:
            name, _, rest = header.partition("=")
            cookies[name.strip()] = rest.split(";", 1)[0]
        # Lower-case names: HAProxy sends header names in lower case.
        headers = {k.lower(): v for k, v in response.headers.items()}
        return response.status, headers, response.read().decode()
    finally:
        connection.close()


def served_by(log: Path, path: str) -> list[str]:
    """The backend server of each logged request for ``path`` (HAProxy's httplog)."""
    return re.findall(rf" replicas/(replica\d) .*\"GET {re.escape(path)} HTTP",
                      log.read_text(errors="replace"))


@pytest.fixture()
def haproxy() -> Iterator[str]:
    executable = shutil.which("haproxy") or "/usr/sbin/haproxy"
    assert Path(executable).is_file(), "haproxy is missing: run `make setup`"
    yield executable


def test_a_console_session_is_valid_on_both_replicas_behind_haproxy(
        tmp_path: Path, tiny_model_dir: Path, make_pg_database, haproxy: str) -> None:  # type: ignore[no-untyped-def]
    url = make_pg_database()
    upgrade(url)
    # Before the replicas start: each keeps its keys in memory, reloaded on a timer.
    engine = create_engine(url)
    token = ApiKeyStore(engine).create("audit-firm", "auditor")[0]
    engine.dispose()
    # The log and its key too, so that both replicas start at once (neither creates it).
    with SqlLedger(url) as ledger:
        open_log_identity(ledger, key_path=tmp_path / "log.key")
    env = {"AUDIT_LEDGER_LOG_KEY_PATH": str(tmp_path / "log.key")}
    first = launch("replica-a", tmp_path, tiny_model_dir, url, env)
    children: list[subprocess.Popen[bytes]] = [first.process]
    try:
        second = launch("replica-b", tmp_path, tiny_model_dir, url, env)
        children.append(second.process)
        wait_ready(first, OVERALL_S)
        wait_ready(second, OVERALL_S)
        port = free_port()
        replicas = [int(r.base_url.rsplit(":", 1)[1]) for r in (first, second)]
        config = tmp_path / "haproxy.cfg"
        config.write_text(loopback_config(port, replicas))
        log = tmp_path / "haproxy.log"
        with log.open("wb") as out:
            proxy = subprocess.Popen([haproxy, "-db", "-f", str(config)], stdout=out,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        children.append(proxy)
        # Until HAProxy answers and has sent a request to each replica (its log says).
        deadline = time.monotonic() + OVERALL_S
        while set(served_by(log, "/readyz")) != {"replica1", "replica2"}:
            assert proxy.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            try:
                request(port, "GET", "/readyz", {})
            except OSError:
                pass  # not listening yet
        cookies: dict[str, str] = {}
        status, _, form = request(port, "GET", "/console/login", cookies)
        assert status == 200
        csrf = re.search(r'name="csrf" value="([^"]+)"', form)
        assert csrf is not None
        status, headers, answer = request(port, "POST", "/console/login", cookies,
                                          {"api_key": token, "csrf": csrf.group(1)})
        assert status == 303, (status, answer[-1500:])
        assert headers["location"] == "/console"
        assert "alc_session" in cookies
        # Pages until each replica has served at least two: every one signed in.
        while min(served_by(log, "/console").count(r) for r in ("replica1", "replica2")) < 2:
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            status, _, page = request(port, "GET", "/console", cookies)
            assert status == 200 and "signed in as auditor" in page, page[-2000:]
        # The sign-in form went through HAProxy too: its CSRF cookie is not per replica.
        assert len(served_by(log, "/console/login")) == 1
        # An altered cookie is refused by either replica: back to the sign-in page.
        cookies["alc_session"] = cookies["alc_session"][:-2] + "AA"
        for _ in range(4):
            status, headers, _ = request(port, "GET", "/console", cookies)
            assert status == 303 and headers["location"] == "/console/login"
    finally:  # every child told to stop first, then each awaited: they stop side by side
        for child in reversed(children):
            if child.poll() is None:
                child.terminate()
        for child in reversed(children):
            child.wait(timeout=120)
    for replica in (first, second):
        assert "Traceback" not in replica.output(), replica.output()[-3000:]
