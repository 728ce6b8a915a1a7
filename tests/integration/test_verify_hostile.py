"""Findings of a hostile review of the verifier, each kept as a test: a log that renames
its origin to get a fresh state file, one witness pinned under two names, a server that
answers with something that is not evidence."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger import merkle
from ledger.bundle import Bundle, BundleEntry
from ledger.checkpoint import Checkpoint, NoteSigner
from ledger.cosignature import Cosigner, WitnessKey
from tests.records import make_record

ORIGIN = "audit.example/log/abcd1234"
ROOT = Path(__file__).resolve().parents[2]


def _bundle(signer: NoteSigner, first: int, size: int, origin: str = ORIGIN) -> Bundle:
    records = [make_record(first + i) for i in range(size)]
    tree = merkle.MemoryTree(r.leaf_hash for r in records)
    note = signer.sign_checkpoint(Checkpoint(origin, size, tree.root()))
    entries = [BundleEntry(r.record_id, i, r.canonical, tree.inclusion_proof(i))
               for i, r in enumerate(records)]
    return Bundle(origin, signer.verifier().encode(), note, entries, note, f"local:{size}")


def _verify(home: Path, path: Path, key: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "audit_cli.main", "verify", "--bundle",
                           str(path), "--log-key", key, "--accept-self-anchored", *extra],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, AUDIT_LEDGER_HOME=str(home)))


def test_a_fork_relabelled_under_another_origin_is_not_verified(tmp_path: Path) -> None:
    signer = NoteSigner(ORIGIN, Ed25519PrivateKey.generate())
    key, path = signer.verifier().encode(), tmp_path / "bundle.json"
    path.write_text(_bundle(signer, 0, 8).dumps())
    assert _verify(tmp_path, path, key).returncode == 0  # the state now holds size 8
    # Another history of the same size, signed by the same key under another origin line:
    # it must not get a state file of its own (and so "first checkpoint seen").
    path.write_text(_bundle(signer, 100, 8, origin=ORIGIN + "x").dumps())
    done = _verify(tmp_path, path, key, "--json")
    assert done.returncode == 1, done.stdout[-2000:]
    first = json.loads(done.stdout)["results"][0]
    assert first["failed_check"] == 3 and "origin" in first["checks"][2]["reason"]


def test_one_witness_key_pinned_under_two_names_is_a_usage_error(tmp_path: Path) -> None:
    signer = NoteSigner(ORIGIN, Ed25519PrivateKey.generate())
    path = tmp_path / "bundle.json"
    path.write_text(_bundle(signer, 0, 2).dumps())
    witness = Cosigner("w1.example", Ed25519PrivateKey.generate()).witness_key
    twin = WitnessKey("w2.example", witness.public_key).encode()  # same key, another name
    done = _verify(tmp_path, path, signer.verifier().encode(), "--witness", witness.encode(),
                   "--witness", twin, "--json")
    assert done.returncode == 2, done.stdout
    error = json.loads(done.stdout)["error"]
    assert error["field"] == "--witness" and "same witness key" in error["message"]


class _Canned(http.server.BaseHTTPRequestHandler):
    answers: dict[str, bytes] = {}

    def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
        body = next((v for k, v in self.answers.items() if self.path.startswith(k)), b"{}")
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        return


@pytest.fixture()
def canned() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Canned)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join()


@pytest.mark.parametrize("answers, code, words", [
    ({"/v1/records/": b"<html>not json</html>"}, 3, "is not evidence"),
    ({"/v1/records/r1/proof": b'{"leaf_hash": "00"}', "/v1/records/r1": b"{}"}, 3,
     "lacks a valid field"),
])
def test_a_server_answering_something_else_than_evidence_is_exit_3(
        canned: str, tmp_path: Path, answers: dict[str, bytes], code: int, words: str) -> None:
    _Canned.answers = answers
    key = NoteSigner(ORIGIN, Ed25519PrivateKey.generate()).verifier().encode()
    done = subprocess.run([sys.executable, "-m", "audit_cli.main", "verify", "r1", "--server",
                           canned, "--api-key", "alk_x_y", "--log-key", key, "--no-state"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, AUDIT_LEDGER_HOME=str(tmp_path)))
    assert done.returncode == code and words in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
