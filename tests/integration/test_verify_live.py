"""The verifier as auditors run it: `audit-ledger` processes against a real service
process over HTTP, and bundle files, with the verifier's own state on disk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from tests.live_service import ROOT, LiveService, start_service


def cli(home: Path, *argv: str) -> tuple[int, Any]:
    done = subprocess.run([sys.executable, "-m", "audit_cli.main", *argv, "--json"], cwd=ROOT,
                          env=dict(os.environ, AUDIT_LEDGER_HOME=str(home)),
                          capture_output=True, text=True, timeout=300, check=False)
    try:
        return done.returncode, json.loads(done.stdout)
    except ValueError:
        return done.returncode, done.stdout + done.stderr


def call(service: LiveService, path: str, body: dict[str, Any] | None = None) -> Any:
    request = urllib.request.Request(
        service.base_url + path, data=json.dumps(body).encode() if body else None,
        headers={"Authorization": f"Bearer {service.client_token}",
                 "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def wait_anchored(service: LiveService, size: int) -> None:
    """Poll until the service anchored a checkpoint of at least ``size`` (it seals and
    anchors on its own every second; the bound is generous, not a tuned deadline)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if call(service, "/v1/checkpoints/anchored")["tree_size"] >= size:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"no anchor of size {size} within 120 s")


def test_live_service_then_an_older_bundle_is_a_rollback_offline(
        tmp_path: Path, tiny_model_dir: Path) -> None:
    service = start_service(tmp_path / "service", tiny_model_dir)
    verifier_home = tmp_path / "auditor"
    try:
        log_key = call(service, "/v1/log/public-key")["verifier_key"]
        first = [call(service, "/v1/generate", {"prompt": f"a{i}", "max_new_tokens": 4})
                 for i in range(2)]
        wait_anchored(service, 2)
        old = tmp_path / "old.json"
        code, _ = cli(verifier_home, "export", "--db", service.database_url, "--bundle", str(old))
        assert code == 0
        for i in range(2):
            call(service, "/v1/generate", {"prompt": f"b{i}", "max_new_tokens": 4})
        wait_anchored(service, 4)
        base = ("--log-key", log_key, "--accept-self-anchored")
        code, result = cli(verifier_home, "verify", first[0]["record_id"], "--server",
                           service.base_url, "--api-key", service.client_token, *base)
        assert code == 0 and result["tree_size"] >= 4 and result["trust"] == "self-anchored"
        code, result = cli(verifier_home, "verify", "--bundle", str(old), *base)
        assert code == 1, result
        assert {r["failed_check"] for r in result["results"]} == {4}
        assert "RollbackError" in result["results"][0]["checks"][3]["reason"]
        # Without the operator's own anchor accepted, the online check fails check 4.
        code, result = cli(verifier_home, "verify", first[1]["record_id"], "--server",
                           service.base_url, "--api-key", service.client_token,
                           "--log-key", log_key)
        assert code == 1 and result["failed_check"] == 4
        assert "SelfAnchoredError" in result["checks"][3]["reason"]
    finally:
        service.stop()
