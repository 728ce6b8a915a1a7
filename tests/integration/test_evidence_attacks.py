"""The evidence path under attack (one test per attack): a fork planted through a cosigned
anchor, the API key sent to another origin, hostile input that once ended in an internal
error (exit 4), the wrong check blamed, and notes read more leniently than Go reads them.

The CLI runs in this process (``audit_cli.main.main``) against bundles, SQLite ledgers
and canned HTTP servers on loopback."""

from __future__ import annotations

import base64
import http.server
import json
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import delete, insert

from ledger.anchor.local import LocalAnchor
from ledger.bundle import Bundle, BundleEntry
from ledger.checkpoint import Checkpoint, NoteSigner, NoteVerifier
from ledger.client import safe_http
from ledger.errors import CheckpointFormatError, SignatureError
from ledger.store.migrate import upgrade
from ledger.store.schema import cosignatures, tree_nodes
from ledger.store.sql import SqlLedger
from tests.cli_runs import cli_json
from tests.records import make_record
from tests.simulator import ORIGIN, SimLog, witness_keys, witnesses


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AUDIT_LEDGER_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def bundle_of(log: SimLog, size: int, note: bytes, indices: list[int], *,
              anchored: bytes | None = None, anchor_proof: list[bytes] | None = None,
              ) -> Bundle:
    entries = [BundleEntry(str(log.records[i].body["record_id"]), i, log.records[i].canonical,
                           log.tree.inclusion_proof(i, size)) for i in indices]
    return Bundle(log.origin, log.signer.verifier().encode(), note, entries, anchored,
                  "local:anchor" if anchored else None, anchor_proof or ())


def write(tmp_path: Path, bundle: Bundle | str, name: str = "bundle.json") -> str:
    path = tmp_path / name
    path.write_text(bundle if isinstance(bundle, str) else bundle.dumps())
    return str(path)


def witness_args(cosigners: list[Any]) -> list[str]:
    return [arg for w in witness_keys(cosigners) for arg in ("--witness", w.encode())]


# --- 1. a fork planted through a cosigned anchor ---------------------------------------

def test_planted_fork_behind_a_cosigned_anchor_proves_the_record_but_is_never_remembered(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], home: Path) -> None:
    both = witnesses(2)
    honest = SimLog().append(40)
    fork = honest.fork(at=30, extra=12)  # the operator's key signs a size-42 fork
    anchor = honest.note(30, cosigners=both)  # the honest, cosigned size-30 note
    planted = bundle_of(fork, 42, fork.note(42), [5], anchored=anchor,
                        anchor_proof=fork.tree.consistency_proof(30, 42))
    key = honest.signer.verifier().encode()
    code, result = cli_json(capsys, "verify", "--bundle", write(tmp_path, planted),
                           "--log-key", key, *witness_args(both))
    # The record (index 5) is in the cosigned size-30 tree: proven; the verifier
    # remembers that cosigned size 30, never the fork's 42.
    assert code == 0, result
    assert "remembers the anchored size 30, not this one" in result["checks"][3]["reason"]
    state = list((home / "verifier").glob("*.note"))
    assert len(state) == 1 and state[0].read_bytes() == anchor
    # The honest, fully cosigned size-40 bundle still verifies (no "rollback"), proving
    # that it extends the remembered size 30.
    genuine = replace(bundle_of(honest, 40, honest.note(40, cosigners=both), [5, 35]),
                      consistency_from={30: honest.tree.consistency_proof(30, 40)})
    code, result = cli_json(capsys, "verify", "--bundle", write(tmp_path, genuine),
                           "--log-key", key, *witness_args(both))
    assert code == 0, result
    assert Checkpoint.peek(state[0].read_bytes()).size == 40
    # The fork again, now that the verifier saw 40: refused, and the state stays.
    code, result = cli_json(capsys, "verify", "--bundle", write(tmp_path, planted),
                           "--log-key", key, *witness_args(both))
    assert code == 1 and result["failed_check"] == 4, result
    assert Checkpoint.peek(state[0].read_bytes()).size == 40


# --- 2. credentials across origins -----------------------------------------------------

class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[tuple[str, str | None]] = []
    redirect_to = ""
    body = b"{}"

    def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
        type(self).seen.append((self.path, self.headers.get("Authorization")))
        if type(self).redirect_to:
            self.send_response(302)
            self.send_header("Location", type(self).redirect_to + self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(type(self).body)))
        self.end_headers()
        self.wfile.write(type(self).body)

    def log_message(self, *_: object) -> None:
        return


def _serve(handler: type[_Recorder]) -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join()


class _Redirector(_Recorder):
    seen: list[tuple[str, str | None]] = []


class _Collector(_Recorder):
    seen: list[tuple[str, str | None]] = []


@pytest.fixture()
def redirector() -> Iterator[str]:
    yield from _serve(_Redirector)


@pytest.fixture()
def collector() -> Iterator[str]:
    yield from _serve(_Collector)


KEY = NoteSigner(ORIGIN, Ed25519PrivateKey.generate()).verifier().encode()


@pytest.mark.parametrize("command", [
    ["verify", "r1", "--no-state", "--log-key", KEY],
    ["content", "r1", "--purpose", "review"],
], ids=["verify", "content"])
def test_cross_origin_redirect_never_carries_the_api_key(
        redirector: str, collector: str, capsys: pytest.CaptureFixture[str],
        command: list[str]) -> None:
    _Redirector.seen, _Collector.seen = [], []
    # Another port on the same host is another origin (RFC 6454).
    _Redirector.redirect_to = collector
    code, result = cli_json(capsys, *command, "--server", redirector, "--api-key",
                           "alk_secret_key")
    assert code == 3, result
    assert "another origin" in result["error"]["message"]
    assert _Redirector.seen and _Collector.seen == []  # the key never left its origin


# --- 3. hostile input is never exit 4 ----------------------------------------------------

def _hostile_bundle(canonical: bytes) -> Bundle:
    log = SimLog().append(2)
    entry = BundleEntry("r-hostile", 0, canonical, log.tree.inclusion_proof(0, 2))
    return Bundle(log.origin, log.signer.verifier().encode(), log.note(2), [entry],
                  log.note(2), "local:2")


@pytest.mark.parametrize("canonical", [
    b"[" * 100_000 + b"]" * 100_000,
    b'{"record_id": ' + b"7" * 5000 + b"}",
    b'{"a":' * 70 + b"1" + b"}" * 70,
], ids=["deeply_nested", "5000_digit_number", "nested_past_the_bound"])
def test_hostile_record_bytes_in_a_bundle_fail_check_1_not_exit_4(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], canonical: bytes) -> None:
    bundle = _hostile_bundle(canonical)
    code, result = cli_json(capsys, "verify", "--bundle", write(tmp_path, bundle),
                           "--log-key", bundle.log_key, "--accept-self-anchored")
    assert code == 1, result
    assert result["failed_check"] == 1
    assert "not an audit record" in result["checks"][0]["reason"]


def test_deeply_nested_bundle_json_is_a_usage_error_not_exit_4(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key = NoteSigner(ORIGIN, Ed25519PrivateKey.generate()).verifier().encode()
    path = write(tmp_path, '{"format": "audit-ledger-bundle/v2", "x": ' + "[" * 100_000
                 + "]" * 100_000 + "}")
    code, result = cli_json(capsys, "verify", "--bundle", path, "--log-key", key)
    assert code == 2 and result["error"]["field"] == "bundle", result
    assert "nested deeper" in result["error"]["message"]


@pytest.fixture()
def recorder() -> Iterator[str]:
    yield from _serve(_Recorder)


@pytest.mark.parametrize("body, words", [
    (b"[" * 100_000 + b"]" * 100_000, "nested deeper"),
    (b'{"leaf_index": ' + b"9" * 5000 + b"}", "digits"),
    (b'{"canonical_base64": "e30=", "canonical_base64": "e30="}', "duplicate key"),
], ids=["deeply_nested", "5000_digit_number", "duplicate_key"])
def test_hostile_server_json_is_exit_3_malformed_not_exit_4(
        recorder: str, capsys: pytest.CaptureFixture[str], body: bytes, words: str) -> None:
    _Recorder.redirect_to, _Recorder.body = "", body
    key = NoteSigner(ORIGIN, Ed25519PrivateKey.generate()).verifier().encode()
    code, result = cli_json(capsys, "verify", "r1", "--server", recorder, "--api-key", "k",
                           "--log-key", key, "--no-state")
    assert code == 3, result
    assert "not evidence" in result["error"]["message"] and words in result["error"]["message"]


def test_oversized_server_answer_is_refused_with_a_clear_error(
        recorder: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(safe_http, "MAX_ANSWER_BYTES", 1000)
    _Recorder.redirect_to, _Recorder.body = "", b'{"pad": "' + b"x" * 5000 + b'"}'
    key = NoteSigner(ORIGIN, Ed25519PrivateKey.generate()).verifier().encode()
    code, result = cli_json(capsys, "verify", "r1", "--server", recorder, "--api-key", "k",
                           "--log-key", key, "--no-state")
    assert code == 3 and "(at most 1000)" in result["error"]["message"], result


def test_oversized_bundle_is_refused_with_a_clear_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    import ledger.bundle

    monkeypatch.setattr(ledger.bundle, "MAX_BUNDLE_BYTES", 1000)
    bundle = _hostile_bundle(b"{}" + b" " * 2000)
    code, result = cli_json(capsys, "verify", "--bundle", write(tmp_path, bundle),
                           "--log-key", bundle.log_key)
    assert code == 2 and "larger than 1000 bytes" in result["error"]["message"], result


def test_state_pointing_at_a_directory_is_a_usage_error_naming_the_state(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bundle = _hostile_bundle(b"{}")
    code, result = cli_json(capsys, "verify", "--bundle", write(tmp_path, bundle),
                           "--log-key", bundle.log_key, "--state", str(tmp_path))
    assert code == 2 and result["error"]["field"] == "--state", result


def test_one_bad_entry_fails_that_entry_and_the_others_are_judged(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = SimLog().append(3)
    data = json.loads(bundle_of(log, 3, log.note(3), [0, 1, 2], anchored=log.note(3)).dumps())
    data["entries"][1]["leaf_index"] = 1.9  # read as 1 it would name another leaf
    data["entries"][2]["inclusion_proof"] = {"not": "a list"}
    code, result = cli_json(capsys, "verify", "--bundle", write(tmp_path, json.dumps(data)),
                           "--log-key", log.signer.verifier().encode(),
                           "--accept-self-anchored")
    assert code == 1 and result["verified"] == 1 and result["failed"] == 2, result
    bad = [r for r in result["results"] if not r["verified"]]
    assert {r["failed_check"] for r in bad} == {1}
    assert any("leaf_index must be an integer" in r["checks"][0]["reason"] for r in bad)


def test_a_refused_note_is_parsed_once_per_bundle(monkeypatch: pytest.MonkeyPatch) -> None:
    log = SimLog().append(2)
    verifier = log.signer.verifier()
    junk = log.note(2) + b"\xff" * 1000  # not UTF-8 after the signature
    calls = []
    real = NoteVerifier._open_uncached
    monkeypatch.setattr(NoteVerifier, "_open_uncached",
                        lambda self, note: calls.append(1) or real(self, note))
    for _ in range(40):
        with pytest.raises(CheckpointFormatError):
            verifier.open(junk)
    assert len(calls) == 1
    with pytest.raises(CheckpointFormatError, match="at most 65536"):
        verifier.open(log.note(2) + b"x" * 70_000)  # junk past the note cap: no parse


# --- databases: missing tree node, checkpoint beyond the log, cosignatures, public-key ---

@pytest.fixture()
def small_log(tmp_path: Path) -> tuple[str, NoteSigner, list[str]]:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    upgrade(url)
    signer = NoteSigner(ORIGIN, Ed25519PrivateKey.generate())
    with SqlLedger(url) as ledger:
        ledger.create_log_meta(ORIGIN, signer.verifier().encode())
        ids = [ledger.append(make_record(i)).record_id for i in range(7)]
        ledger.seal_checkpoint(signer, ORIGIN)
        ids += [ledger.append(make_record(i)).record_id for i in range(7, 40)]
        sealed = ledger.seal_checkpoint(signer, ORIGIN)
        assert sealed is not None
        LocalAnchor(ledger, signer.verifier(), ORIGIN).anchor(sealed.note)
    return url, signer, ids


def test_missing_tree_node_fails_check_2_or_the_consistency_not_exit_4(
        small_log: tuple[str, NoteSigner, list[str]],
        capsys: pytest.CaptureFixture[str]) -> None:
    url, signer, ids = small_log
    with SqlLedger(url) as ledger:
        with ledger.engine.begin() as conn:
            # (4, 0) is on leaf 20's inclusion path, (3, 1) on the 7 -> 40 proof.
            for level, idx in ((4, 0), (3, 1)):
                conn.execute(delete(tree_nodes).where(tree_nodes.c.level == level,
                                                      tree_nodes.c.idx == idx))
    key = signer.verifier().encode()
    code, result = cli_json(capsys, "verify", ids[20], "--db", url, "--log-key", key,
                           "--accept-self-anchored", "--no-state")
    assert code == 1 and result["failed_check"] == 2, result
    assert "lacks a node" in result["checks"][1]["reason"]
    code, result = cli_json(capsys, "log", "--db", url, "--log-key", key,
                           "consistency", "7", "40")
    assert code == 1 and "lacks a node" in result["error"]["message"], result


def test_signed_checkpoint_beyond_the_database_fails_check_4_not_check_2(
        small_log: tuple[str, NoteSigner, list[str]],
        capsys: pytest.CaptureFixture[str]) -> None:
    url, signer, ids = small_log
    with SqlLedger(url) as ledger:
        stored = ledger.latest_checkpoint()
        assert stored is not None
        fake = Checkpoint(ORIGIN, 42, bytes(32))
        with ledger.engine.begin() as conn:
            from ledger.store.schema import checkpoints

            conn.execute(insert(checkpoints).values(
                size=42, root=fake.root, note=signer.sign_checkpoint(fake),
                sealed_at=stored.sealed_at))
    code, result = cli_json(capsys, "verify", ids[3], "--db", url, "--log-key",
                           signer.verifier().encode(), "--accept-self-anchored", "--no-state")
    assert code == 1 and result["failed_check"] == 4, result
    assert "holds 40 entries but its signed checkpoint covers 42" in \
        result["checks"][3]["reason"]


def test_malformed_cosignature_row_is_left_out_and_reported_by_fsck_not_check_3(
        small_log: tuple[str, NoteSigner, list[str]],
        capsys: pytest.CaptureFixture[str]) -> None:
    url, signer, ids = small_log
    with SqlLedger(url) as ledger, ledger.engine.begin() as conn:
        conn.execute(insert(cosignatures).values(
            checkpoint_size=40, witness="w1.example", line="\u2014 w1.example not!base64",
            timestamp=1))
    key = signer.verifier().encode()
    code, result = cli_json(capsys, "verify", ids[3], "--db", url, "--log-key", key,
                           "--accept-self-anchored", "--no-state")
    assert code == 0, result
    code, result = cli_json(capsys, "log", "--db", url, "--log-key", key, "fsck")
    assert code == 1, result
    assert [f["kind"] for f in result["findings"]] == ["cosignature_malformed"]


def test_log_public_key_from_the_database_alone(
        small_log: tuple[str, NoteSigner, list[str]], tmp_path: Path,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    url, signer, _ = small_log
    monkeypatch.setenv("AUDIT_LEDGER_LOG_KEY_PATH", str(tmp_path / "no-such.key"))
    code, result = cli_json(capsys, "log", "--db", url, "public-key")
    assert code == 0, result
    assert result["verifier_key"] == signer.verifier().encode()


# --- 4. the right check blamed ---------------------------------------------------------

def test_corrupted_state_file_is_named_as_the_state_not_as_bad_evidence(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bundle = _hostile_bundle(b"{}")
    state = tmp_path / "state.note"
    state.write_bytes(b"garbage\n")
    code, result = cli_json(capsys, "verify", "--bundle", write(tmp_path, bundle),
                           "--log-key", bundle.log_key, "--state", str(state))
    assert code == 2 and result["error"]["field"] == "--state", result
    assert "state file" in result["error"]["message"]


def test_one_changed_byte_in_a_bundle_record_fails_check_2_as_the_readme_says(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = SimLog().append(3)
    data = json.loads(bundle_of(log, 3, log.note(3), [1], anchored=log.note(3)).dumps())
    canonical = base64.b64decode(data["entries"][0]["canonical"])
    data["entries"][0]["canonical"] = base64.b64encode(
        canonical.replace(b'"tag":"honest"', b'"tag":"hones7"')).decode()
    code, result = cli_json(capsys, "verify", "--bundle", write(tmp_path, json.dumps(data)),
                           "--log-key", log.signer.verifier().encode(),
                           "--accept-self-anchored")
    assert code == 1 and result["failed_check"] == 2, result


def test_record_id_not_in_the_bundle_fails_check_1(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = SimLog().append(3)
    path = write(tmp_path, bundle_of(log, 3, log.note(3), [0], anchored=log.note(3)))
    code, result = cli_json(capsys, "verify", "no-such-record", "--bundle", path,
                           "--log-key", log.signer.verifier().encode(),
                           "--accept-self-anchored")
    assert code == 1 and result["failed_check"] == 1, result


# --- 5. notes as strict as Go's -----------------------------------------------------------

def test_root_with_non_zero_padding_bits_is_refused_even_when_signed() -> None:
    log = SimLog().append(3)
    body = Checkpoint(ORIGIN, 3, log.tree.root()).body().decode().split("\n")
    assert body[2].endswith("=")
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    last = body[2][-2]
    body[2] = body[2][:-2] + alphabet[alphabet.index(last) | 1] + "="  # same bytes
    assert base64.b64decode(body[2]) == log.tree.root()
    note = log.signer.sign("\n".join(body).encode())
    with pytest.raises(CheckpointFormatError, match="canonical base64"):
        log.signer.verifier().open_checkpoint(note)


@pytest.mark.parametrize("corrupted_first", [True, False])
def test_repeated_signature_line_with_a_corrupted_copy_is_refused(
        corrupted_first: bool) -> None:
    log = SimLog().append(3)
    note = log.note(3).decode()
    body, line = note[: note.rindex("\n\n") + 2], note[note.rindex("\n\n") + 2:]
    name, blob = line.rstrip("\n").rsplit(" ", 1)
    raw = bytearray(base64.b64decode(blob))
    raw[-1] ^= 1
    bad = f"{name} {base64.b64encode(bytes(raw)).decode()}\n"
    lines = [bad, line] if corrupted_first else [line, bad]
    with pytest.raises(SignatureError, match="repeated"):
        log.signer.verifier().open((body + "".join(lines)).encode())
    assert log.signer.verifier().open((body + line + line).encode())  # identical: once


def test_duplicate_json_keys_in_a_bundle_are_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = SimLog().append(2)
    text = bundle_of(log, 2, log.note(2), [0]).dumps()
    text = text.replace('"origin":', '"origin": "evil", "origin":', 1)
    code, result = cli_json(capsys, "verify", "--bundle", write(tmp_path, text),
                           "--log-key", log.signer.verifier().encode())
    assert code == 2 and "duplicate key" in result["error"]["message"], result


@pytest.mark.parametrize("data", [
    b"[" * 100_000 + b"]" * 100_000, b"[" * 65 + b"]" * 65, b"7" * 5000, b"1e999",
    b'{"a": 1, "a": 2}',
], ids=["recursion", "past_the_bound", "5000_digits", "infinite", "duplicate_key"])
def test_every_evidence_parser_refuses_hostile_json_as_malformed(data: bytes) -> None:
    # parse_strict reads record bytes for verify (bundle, online, --db), audit and fsck,
    # and bundles and server answers: one refusal, never another exception.
    from ledger.canonical import parse_strict
    from ledger.errors import CanonicalFormError

    with pytest.raises(CanonicalFormError):
        parse_strict(data)


def test_cross_origin_redirect_never_carries_the_api_key_to_a_tiles_reader(
        redirector: str, collector: str) -> None:
    from ledger.client.safe_http import CrossOriginRedirectError
    from ledger.client.tiles import HttpTiles

    _Redirector.seen, _Collector.seen = [], []
    _Redirector.redirect_to = collector
    with pytest.raises(CrossOriginRedirectError):
        HttpTiles(redirector + "/tlog", api_key="alk_secret_key").get("checkpoint")
    assert _Redirector.seen and _Collector.seen == []


def test_witness_refuses_a_root_with_non_zero_padding_bits_even_when_signed() -> None:
    from ledger.witness_policy import AddCheckpoint, WitnessRefusal, decide

    log = SimLog().append(3)
    body = Checkpoint(ORIGIN, 3, log.tree.root()).body().decode().split("\n")
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    body[2] = body[2][:-2] + alphabet[alphabet.index(body[2][-2]) | 1] + "="
    note = log.signer.sign("\n".join(body).encode())
    with pytest.raises(WitnessRefusal) as refused:
        decide(AddCheckpoint(0, (), note), {ORIGIN: [log.signer.verifier()]}, None)
    assert refused.value.status == 400 and "canonical base64" in refused.value.reason
