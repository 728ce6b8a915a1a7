"""Retained content end to end on a live service process (tiny model, SQLite ledger),
with the real command line: who may read, audited reads, erasure under and without a
legal hold, 410 afterwards, and `audit-ledger verify` still passing checks 1-4."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ledger.leaves import commitments
from tests.live_service import ROOT, LiveService, start_service


@dataclass
class Live:
    service: LiveService
    home: Path
    auditor: str
    admin: str

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "audit_cli.main", *args], cwd=ROOT, text=True,
            capture_output=True, timeout=300,
            env=dict(os.environ, AUDIT_LEDGER_HOME=str(self.home)))

    def call(self, method: str, path: str, token: str, body: Any = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.service.base_url + path, data=data, method=method,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())


def _key(live_home: Path, url: str, tenant: str, role: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "audit_cli.main", "keys", "--db", url, "--json", "create",
         "--tenant", tenant, "--role", role], cwd=ROOT, text=True, capture_output=True,
        timeout=300, env=dict(os.environ, AUDIT_LEDGER_HOME=str(live_home)), check=True)
    return str(json.loads(done.stdout)["token"])


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[Live]:
    home = tmp_path_factory.mktemp("retention-svc")
    url = f"sqlite:///{home / 'ledger.db'}"
    env = dict(os.environ, AUDIT_LEDGER_HOME=str(home))
    # The policy is set before the service starts, by the operator's command.
    subprocess.run([sys.executable, "-m", "audit_cli.main", "retention", "--db", url, "set",
                    "--tenant", "default", "--mode", "content", "--days", "200"],
                   cwd=ROOT, env=env, check=True, capture_output=True, timeout=300)
    # Keys made before the start: a running service sees another process's new keys only
    # after its key cache reloads (API_KEY_CACHE_TTL_S).
    auditor, admin = _key(home, url, "audit-firm", "auditor"), _key(home, url, "default", "admin")
    client = _key(home, url, "default", "client")
    service = start_service(home, tiny_model_dir)
    service.client_token = client  # keys exist already, so the start prints none
    try:  # start_service drains the service's output
        yield Live(service, home, auditor, admin)
    finally:
        service.stop()


def _generate(live: Live, prompt: str, subject: str | None) -> dict[str, Any]:
    status, answer = live.call("POST", "/v1/generate", live.service.client_token,
                               {"prompt": prompt, "max_new_tokens": 4, "subject": subject})
    assert status == 200, answer
    return dict(answer)


def _content(live: Live, token: str, record_id: str, purpose: str | None) -> tuple[int, Any]:
    query = "" if purpose is None else "?" + urllib.parse.urlencode({"purpose": purpose})
    return live.call("GET", f"/v1/records/{record_id}/content{query}", token)


def _anchored_at_least(live: Live, size: int) -> None:
    deadline = time.monotonic() + 120  # generous: the anchor worker runs every second
    while time.monotonic() < deadline:
        status, body = live.call("GET", "/v1/checkpoints/anchored", live.auditor)
        if status == 200 and body["tree_size"] >= size:
            return
        time.sleep(0.2)
    raise AssertionError(f"no anchored checkpoint of size {size} within the timeout")


def _verify(live: Live, record_id: str) -> dict[str, Any]:
    key = live.cli("log", "public-key")
    assert key.returncode == 0, key.stderr
    done = live.cli("verify", record_id, "--server", live.service.base_url, "--api-key",
                    live.auditor, "--log-key", key.stdout.strip().splitlines()[-1], "--no-state",
                    "--accept-self-anchored",
                    "--json")
    verdict: dict[str, Any] = json.loads(done.stdout)
    verdict["exit"] = done.returncode
    return verdict


def test_only_auditors_read_content_with_a_purpose_and_each_read_is_logged(live: Live) -> None:
    answer = _generate(live, "What did I ask?", "alice")
    record_id = answer["record_id"]
    for token in (live.service.client_token, live.admin):
        status, problem = _content(live, token, record_id, "curiosity")
        assert status == 403 and "may not use this route" in problem["detail"]
    status, problem = _content(live, live.auditor, record_id, None)
    assert (status, problem["field"]) == (400, "purpose")

    status, content = _content(live, live.auditor, record_id, "MiFID II review")
    assert status == 200, content
    assert content["prompt"] == "What did I ask?" and content["output"] == answer["output"]
    assert (content["input_salt"], content["output_salt"]) == (answer["input_salt"],
                                                               answer["output_salt"])
    # The access leaf is in the log, before the answer came back.
    status, leaf = live.call("GET", f"/v1/records/{content['access_record_id']}", live.auditor)
    assert status == 200 and leaf["leaf_index"] == content["access_leaf_index"]
    assert leaf["record"]["schema"] == "access-record/v2"
    assert leaf["record"]["access"]["purpose"] == "MiFID II review"
    assert leaf["record"]["access"]["record_id"] == record_id
    status, record = live.call("GET", f"/v1/records/{record_id}", live.auditor)
    assert commitments.opens(record["record"]["commitments"]["input"],
                             bytes.fromhex(content["input_salt"]), "input",
                             content["prompt"].encode())
    assert "alice" not in json.dumps(record) and "alice" not in json.dumps(leaf)

    # The command line does the same and opens the commitments (check 5).
    done = live.cli("content", record_id, "--purpose", "SEC 17a-4 sample", "--server",
                    live.service.base_url, "--api-key", live.auditor)
    assert done.returncode == 0, done.stderr
    assert "[PASS] 5. prompt and output open their commitments" in done.stdout
    _anchored_at_least(live, content["access_leaf_index"] + 1)
    verdict = _verify(live, content["access_record_id"])
    assert verdict["exit"] == 0 and verdict["verified"] is True


def test_openai_user_field_tags_the_subject(live: Live) -> None:
    status, models = live.call("GET", "/v1/models", live.service.client_token)
    status, answer = live.call("POST", "/v1/completions", live.service.client_token, {
        "model": models["data"][0]["id"], "prompt": "hi", "max_tokens": 3, "user": "zoe"})
    assert status == 200, answer
    status, erased = live.call("POST", "/v1/admin/erasures", live.admin,
                               {"subject": "zoe", "legal_basis": "GDPR Art. 17 request, ticket 7"})
    assert status == 200 and erased["records"] == [answer["audit"]["record_id"]]


def test_erasure_respects_holds_then_shreds_and_proofs_still_verify(live: Live) -> None:
    neighbour = _generate(live, "neighbour before", "bob")
    erased = [_generate(live, f"about carol {i}", "carol") for i in range(2)]
    after = _generate(live, "neighbour after", None)
    url = live.service.database_url

    held = live.cli("retention", "--db", url, "--json", "hold", "--tenant", "default",
                    "--reason", "litigation 2026-17")
    assert held.returncode == 0, held.stderr
    hold_id = json.loads(held.stdout)["hold_id"]
    status, problem = live.call("POST", "/v1/admin/erasures", live.admin,
                                {"subject": "carol",
                                 "legal_basis": "GDPR Art. 17 request, ticket 7"})
    assert status == 409 and problem["hold_id"] == hold_id
    refused = live.cli("erase", "--db", url, "--tenant", "default", "--subject", "carol",
                       "--legal-basis", "GDPR Art. 17 request, ticket 7")
    assert refused.returncode == 1 and hold_id in refused.stderr
    status, _ = _content(live, live.auditor, erased[0]["record_id"], "still readable")
    assert status == 200
    assert live.cli("retention", "--db", url, "release", hold_id).returncode == 0

    status, problem = live.call("POST", "/v1/admin/erasures", live.admin,
                                {"subject": "carol", "tenant": "someone-else",
                                 "legal_basis": "GDPR Art. 17 request, ticket 7"})
    assert (status, problem["field"]) == (403, "tenant")
    status, erasure = live.call("POST", "/v1/admin/erasures", live.admin,
                                {"subject": "carol",
                                 "legal_basis": "GDPR Art. 17 request, ticket 7"})
    assert status == 200, erasure
    assert erasure["records"] == sorted(e["record_id"] for e in erased)
    for answer in erased:
        status, gone = _content(live, live.auditor, answer["record_id"], "after erasure")
        assert status == 410
        assert gone["erasure_record_id"] == erasure["erasure_record_id"]
        assert gone["erased_at"] == erasure["erased_at"]
    # The command line erases by record id too.
    by_id = live.cli("erase", "--db", url, "--tenant", "default", neighbour["record_id"],
                     "--legal-basis", "GDPR Art. 17 request, ticket 7")
    assert by_id.returncode == 0, by_id.stderr
    status, _ = _content(live, live.auditor, neighbour["record_id"], "after erasure")
    assert status == 410
    gone = live.cli("content", neighbour["record_id"], "--purpose", "after erasure",
                    "--server", live.service.base_url, "--api-key", live.auditor)
    assert gone.returncode == 1 and "was erased" in gone.stderr

    # Checks 1-4 still pass for the erased records, their neighbours and the erasure leaf.
    status, head = live.call("GET", "/v1/checkpoints/latest", live.auditor)
    _anchored_at_least(live, int(erasure["leaf_index"]) + 2)
    for record_id in [*(e["record_id"] for e in erased), neighbour["record_id"],
                      after["record_id"], erasure["erasure_record_id"]]:
        verdict = _verify(live, record_id)
        assert verdict["exit"] == 0, verdict
        # Check 4 is self-anchored here (local anchor only, accepted explicitly).
        assert [c["status"] for c in verdict["checks"][:4]] == ["pass"] * 3 + ["self-anchored"]
