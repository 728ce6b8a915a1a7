"""The report's SLO section and its own digest in the log (report-record/v1), on a real
SQLite ledger: the report appends its leaf, the log seals it (as the service's integrator
would), and `audit-ledger verify <id> --db` then proves the report."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import insert

from audit_cli.main import main
from ledger.anchor.local import LocalAnchor
from ledger.checkpoint import NoteSigner
from ledger.leaves.report import REPORT_KIND
from ledger.store.migrate import upgrade
from ledger.store.schema import readiness_history
from ledger.store.sql import SqlLedger
from tests.console.conftest import synthetic

ORIGIN = "audit-ledger.test/log"
RANGE = ["--from", "2026-11-30T09:00:00", "--to", "2026-11-30T10:00:00"]


@pytest.fixture()
def ledger_db(tmp_path: Path) -> tuple[str, NoteSigner]:
    """Seven records (forward 1.5 ms each), sealed and anchored; a readiness history with
    one 90 s outage and one planned stop inside 09:00-10:00."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    upgrade(url)
    signer = NoteSigner(ORIGIN, Ed25519PrivateKey.generate())
    with SqlLedger(url) as ledger:
        for i in range(7):
            ledger.append(synthetic(i))
        sealed = ledger.seal_checkpoint(signer, ORIGIN)
        assert sealed is not None
        LocalAnchor(ledger, signer.verifier(), ORIGIN).anchor(sealed.note)
        spans = [  # (ready, start, end, clean stop)
            (1, "09:00:00", "09:10:00", 0),
            (0, "09:10:00", "09:11:30", 0),  # 90 s not ready
            (1, "09:11:30", "09:20:00", 1),  # clean stop: the gap to 09:40 is planned
            (1, "09:40:00", "10:00:00", 0),
        ]
        with ledger.engine.begin() as conn:
            for ready, start, end, clean in spans:
                conn.execute(insert(readiness_history).values(
                    replica="r1", ready=ready, clean_stop=clean,
                    started_at=datetime.fromisoformat(f"2026-11-30T{start}"),
                    ended_at=datetime.fromisoformat(f"2026-11-30T{end}")))
    return url, signer


def test_report_shows_slo_targets_against_measured_values(
        ledger_db: tuple[str, NoteSigner], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    url, signer = ledger_db
    monkeypatch.setenv("AUDIT_LEDGER_SLO_LATENCY", "/v1/generate=0.001:0.5")
    monkeypatch.setenv("AUDIT_LEDGER_SLO_MAX_OUTAGE_S", "60")
    out = tmp_path / "pack"
    assert main(["report", "--db", url, "--log-key", signer.verifier().encode(),
                 "--out", str(out), *RANGE]) == 0
    html = (out / "report.html").read_text()
    assert 'id="slo-table"' in html
    # 1.5 ms of forward time per record against a 1 ms p99 target.
    assert ("<td>latency p99 (records&#x27; service time)</td><td>1 ms</td>"
            "<td>1.500 ms</td><td>MISSED</td>") in html
    assert "<td>jitter p99 - p50</td><td>500 ms</td><td>0.000 ms</td><td>met</td>" in html
    # 90 s down in 60 minutes observed: budget 43.2 min/month prorated to 1 h = 0.060 min.
    assert "<td>0.060 min</td><td>1.500 min in 1 outage(s)</td><td>MISSED</td>" in html
    assert "<td>longest single outage</td><td>60 s</td><td>90.0 s</td><td>MISSED</td>" in html
    # The readiness line: up at 09:00, down at 09:10, up at 09:11:30, planned stop at 09:20.
    assert "<title>replicas ready</title></polyline>" in html
    assert "<title>replicas ready 09:10: 0</title>" in html


def test_report_digest_is_logged_and_verifies_once_sealed(
        ledger_db: tuple[str, NoteSigner], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    url, signer = ledger_db
    key = signer.verifier().encode()
    out = tmp_path / "pack"
    assert main(["report", "--db", url, "--log-key", key, "--out", str(out), *RANGE,
                 "--tenant", "bank-b", "--made-by", "auditor:jane"]) == 0
    printed = capsys.readouterr().out
    logged = json.loads((out / "report.record.json").read_text())
    assert f"report record {logged['record_id']}" in printed
    html = "sha256:" + hashlib.sha256((out / "report.html").read_bytes()).hexdigest()
    assert (out / "report.html.sha256").read_text().split()[0] == html
    # The logged digest covers the whole pack: the list of its files' digests.
    manifest = (out / "report.pack.sha256").read_text()
    bundle = "sha256:" + hashlib.sha256((out / "bundle.json").read_bytes()).hexdigest()
    assert manifest == f"{bundle}  bundle.json\n{html}  report.html\n"
    digest = "sha256:" + hashlib.sha256(manifest.encode()).hexdigest()
    assert logged["digest"] == digest

    with SqlLedger(url) as ledger:
        stored = ledger.get_record(logged["record_id"])
        assert stored is not None
        body = json.loads(stored.leaf_body)
        assert body["schema"] == REPORT_KIND
        assert body["report"] == {"digest": digest, "from": "2026-11-30T09:00:00.000Z",
                                  "to": "2026-11-30T10:00:00.000Z", "scope_tenant": "bank-b",
                                  "made_by": "auditor:jane", "file": "report.pack.sha256"}
        assert stored.leaf_index == logged["leaf_index"] == 7

    verify = ["verify", logged["record_id"], "--db", url, "--log-key", key, "--no-state",
              "--json"]
    # Not yet sealed: no signed checkpoint covers the leaf (the evidence is not there yet).
    assert main([*verify, "--accept-self-anchored"]) == 3
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["message"].endswith("is not yet covered by a checkpoint")
    with SqlLedger(url) as ledger:  # what the service's integrator and anchor do
        sealed = ledger.seal_checkpoint(signer, ORIGIN)
        assert sealed is not None and sealed.size == 8
        LocalAnchor(ledger, signer.verifier(), ORIGIN).anchor(sealed.note)
    # Only the operator's own anchor vouches: refused unless accepted explicitly.
    assert main(verify) == 1
    refused = {c["check"]: c["status"] for c in json.loads(capsys.readouterr().out)["checks"]}
    assert refused[3] == "pass" and refused[4] == "fail"
    assert main([*verify, "--accept-self-anchored"]) == 0
    checks = {c["check"]: c["status"] for c in json.loads(capsys.readouterr().out)["checks"]}
    assert checks[1] == checks[2] == checks[3] == "pass"
    assert checks[4] == "self-anchored"

    # The whole pack against the log: recomputed from its files, compared with the leaf.
    check_pack = ["verify", "--report", str(out), "--db", url, "--log-key", key,
                  "--accept-self-anchored", "--json"]
    assert main(check_pack) == 0
    assert json.loads(capsys.readouterr().out)["pack_digest"] == digest
    with (out / "bundle.json").open("a") as bundle_file:
        bundle_file.write(" ")
    assert main(check_pack) == 1
    problems = json.loads(capsys.readouterr().out)["problems"]
    assert problems[0] == f"bundle.json has changed: its digest is no longer {bundle}"
    # Rewriting the list to match the altered file moves the digest off the logged one.
    altered = "sha256:" + hashlib.sha256((out / "bundle.json").read_bytes()).hexdigest()
    (out / "report.pack.sha256").write_text(manifest.replace(bundle, altered))
    assert main(check_pack) == 1
    problems = json.loads(capsys.readouterr().out)["problems"]
    rewritten = hashlib.sha256(manifest.replace(bundle, altered).encode()).hexdigest()
    assert problems == [f"the pack's digest is sha256:{rewritten}; the log's report "
                        f"record {logged['record_id']} names {digest}"]


def test_no_log_leaves_the_log_unchanged(ledger_db: tuple[str, NoteSigner],
                                         tmp_path: Path) -> None:
    url, signer = ledger_db
    assert main(["report", "--db", url, "--log-key", signer.verifier().encode(),
                 "--out", str(tmp_path / "pack"), *RANGE, "--no-log"]) == 0
    assert not (tmp_path / "pack" / "report.record.json").exists()
    with SqlLedger(url) as ledger:
        assert ledger.tree_head()[0] == 7


def test_an_earlier_reports_leaf_is_counted_apart_not_as_a_record(
        ledger_db: tuple[str, NoteSigner], tmp_path: Path) -> None:
    url, signer = ledger_db
    key = signer.verifier().encode()
    everything = ["--from", "2026-11-30T09:00:00", "--to", "2100-01-01"]
    assert main(["report", "--db", url, "--log-key", key, "--out", str(tmp_path / "first"),
                 *everything]) == 0
    with SqlLedger(url) as ledger:  # the first report's leaf, sealed
        sealed = ledger.seal_checkpoint(signer, ORIGIN)
        assert sealed is not None
        LocalAnchor(ledger, signer.verifier(), ORIGIN).anchor(sealed.note)
    assert main(["report", "--db", url, "--log-key", key, "--out", str(tmp_path / "second"),
                 *everything]) == 0
    html = (tmp_path / "second" / "report.html").read_text()
    assert '<p id="record-count">7 records in scope.</p>' in html
    assert f"<td>{REPORT_KIND}</td><td>1</td>" in html
    assert "unknown" not in html  # no fingerprint "changed" to a leaf without one
    assert "<td>_reports</td>" not in html
