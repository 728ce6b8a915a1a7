"""Hostile-review fixes in the verifiers (decision 0050).

A streamed v2 record's ``stream.start_record_id`` must name a real stream start: an
``audit-stream-start/v2`` leaf before it in the log, of the same tenant, committing the
same prompt. A log writer who points the record elsewhere (no such leaf, another
tenant's, another prompt's, one appended after it, a leaf of another kind) is caught by
``verify`` (check 1, from the database, a bundle and the server), ``audit`` and ``log
fsck``, each naming the stream start. And a v2 body must be the canonical bytes its
envelope commits to. Real SQLite, real CLI, and a real service over loopback HTTP for
the server path."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from inference_wrapper.server.app import KEYS, LEDGER, SETTINGS
from ledger import merkle
from ledger.anchor.local import LocalAnchor
from ledger.checkpoint import NoteSigner
from ledger.leaves.commitments import INPUT, commit, row_commitments
from ledger.leaves.envelope import Leaf, envelope_bytes, tenant_tag
from ledger.leaves.environment import build_environment
from ledger.leaves.record_v2 import EnvironmentRef, build_record_v2, row_data
from ledger.leaves.stream_start import build_stream_start_v2
from ledger.store.migrate import upgrade
from ledger.store.sql import SqlLedger
from tests.cli_runs import cli_json

# The real service fixture of the verify tests (a tiny model behind the real app).
from tests.integration.test_verify import SELF, Service, cli, service  # noqa: F401

VECTORS = Path(__file__).resolve().parents[1] / "vectors"
META = json.loads((VECTORS / "v1_log.json").read_text())
ORIGIN, KEY = META["origin"], META["verifier_key"]
SEED = bytes(range(32))  # the golden log's test-only key (make_vectors.SEED)
TRUST = ("--log-key", KEY, "--accept-self-anchored")
SALT = bytes(range(200, 232))
START_ID = "0192f0c0-0000-7000-8000-00000000a001"
RECORD_ID = "0192f0c0-0000-7000-8000-00000000b001"
EVERYTHING = ("--from", "2000-01-01T00:00:00Z", "--to", "2100-01-01T00:00:00Z")


@pytest.fixture(autouse=True)
def verifier_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUDIT_LEDGER_HOME", str(tmp_path / "home"))


def _environment(engine: str = "engine-0") -> Leaf:
    return build_environment(
        engine=engine, model={"name": "tiny-llama", "digest": "sha256:" + "cd" * 32,
                                  "pinned": True},
        hardware={"accelerator": "cuda", "accelerator_model": "NVIDIA H200"},
        software={"torch": {"version": "2.6.0"}},
        tokenization_contract={"tokenizer_digest": "sha256:" + "01" * 32},
        generation_config_digest="sha256:" + "02" * 32)


def _start(env_index: int, env: Leaf, *, tenant: str = "acme", prompt: str = "streamed",
           record_id: str = START_ID) -> Leaf:
    return build_stream_start_v2(
        origin=ORIGIN, tenant=tenant, engine="engine-0",
        environment=EnvironmentRef(env_index, env.leaf_hash),
        commitments={INPUT: commit(SALT, INPUT, prompt.encode())},
        generation={"max_new_tokens": 4}, route="/v1/completions", record_id=record_id)


def _record(env_index: int, env: Leaf, start_id: str | None, *, record_id: str = RECORD_ID,
            tenant: str = "acme", engine: str = "engine-0") -> Leaf:
    return build_record_v2(
        origin=ORIGIN, tenant=tenant, engine=engine,
        environment=EnvironmentRef(env_index, env.leaf_hash),
        commitments=row_commitments(input_salt=SALT, output_salt=SALT, prompt="streamed",
                                    input_ids=[1, 2], output="ok", output_ids=[3]),
        data=row_data(input_token_count=2, output_token_count=1, truncated=False,
                      finish_reason="stop", rows=1, padded_length=2, padding_side="left",
                      padding_count=0, generation={"max_new_tokens": 4}),
        batch={"id": "c" * 32, "size": 1, "row": 0}, timings_ms={"forward": 3.0},
        stream_start_record_id=start_id, record_id=record_id)


# Each case: the leaves after the environment (leaf 5), given its index and leaf; the
# streamed record is the one with RECORD_ID. Then what verify's check 1 and what audit
# and fsck say about it.
Build = Callable[[int, Leaf], list[Leaf]]
FORGED: dict[str, tuple[Build, str, str]] = {
    "no such leaf": (
        lambda i, env: [_record(i, env, "0192f0c0-0000-7000-8000-00000000dead")],
        "names stream start 0192f0c0-0000-7000-8000-00000000dead and the source gave no "
        "such leaf", "which is no audit-stream-start/v2 leaf before it"),
    "another tenant's start": (
        lambda i, env: [_start(i, env, tenant="globex"), _record(i, env, START_ID)],
        "which is tenant 'globex''s, not 'acme''s", "which is tenant 'globex''s"),
    "a start of another prompt": (
        lambda i, env: [_start(i, env, prompt="something else"), _record(i, env, START_ID)],
        "whose input commitment is not the record's", "whose input commitment is not"),
    "a start appended after it": (
        lambda i, env: [_record(i, env, START_ID), _start(i, env)],
        "appended at leaf 7, after the record at leaf 6",
        "which is no audit-stream-start/v2 leaf before it"),
    "a leaf of another kind": (
        lambda i, env: [_record(i, env, None, record_id=START_ID),
                        _record(i, env, START_ID)],
        "which is a audit-record/v2 leaf, not an audit-stream-start/v2",
        "which is no audit-stream-start/v2 leaf before it"),
}


def _log(tmp_path: Path, build: Build) -> str:
    """The golden v1 log, migrated, with an environment at leaf 5 and ``build``'s leaves
    after it, sealed and anchored."""
    shutil.copy(VECTORS / "v1_log.sqlite", tmp_path / "log.sqlite")
    url = f"sqlite:///{tmp_path / 'log.sqlite'}"
    upgrade(url)
    signer = NoteSigner(ORIGIN, Ed25519PrivateKey.from_private_bytes(SEED))
    env = _environment()
    with SqlLedger(url).start() as ledger:
        index = ledger.append(env).leaf_index
        for leaf in build(index, env):
            ledger.append(leaf)
        ledger.seal_checkpoint(signer, ORIGIN)
        LocalAnchor(ledger, signer.verifier(), ORIGIN).anchor(ledger.latest_checkpoint().note)  # type: ignore[union-attr]
    return url


def _bundle(url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    bundle = tmp_path / "bundle.json"
    code, out = cli_json(capsys, "export", "--db", url, "--bundle", str(bundle))
    assert code == 0, out
    return bundle


def test_an_honest_streamed_record_verifies_with_its_start_audits_and_fscks(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = _log(tmp_path, lambda i, env: [_start(i, env), _record(i, env, START_ID)])
    code, out = cli_json(capsys, "verify", RECORD_ID, "--db", url, *TRUST,
                         "--prompt", "streamed", "--input-salt", SALT.hex())
    assert code == 0, out
    assert f"stream start leaf {START_ID} at index 6 opens" in out["checks"][0]["reason"]
    assert "and its stream start leaf 6 are in the tree" in out["checks"][1]["reason"]
    code, out = cli_json(capsys, "audit", "--db", url, *EVERYTHING, "--log-key", KEY)
    assert code == 0 and out["complete"], out
    code, out = cli_json(capsys, "log", "fsck", "--db", url, "--log-key", KEY)
    assert code == 0 and out["ok"], out
    bundle = _bundle(url, tmp_path, capsys)
    written = json.loads(bundle.read_text())
    assert list(written["stream_starts"]) == ["6"]
    code, out = cli_json(capsys, "verify", "--bundle", str(bundle), *TRUST, "--no-state")
    assert code == 0 and (out["verified"], out["failed"]) == (8, 0), out


@pytest.mark.parametrize("case", list(FORGED))
def test_a_record_naming_a_wrong_stream_start_fails_verify_audit_and_fsck(
        case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    build, verify_says, audit_says = FORGED[case]
    url = _log(tmp_path, build)
    code, out = cli_json(capsys, "verify", RECORD_ID, "--db", url, *TRUST)
    assert code == 1 and out["failed_check"] == 1, out
    reason = out["checks"][0]["reason"]
    assert reason.startswith("stream start: LeafBindingError: ") and verify_says in reason, \
        reason
    code, out = cli_json(capsys, "audit", "--db", url, *EVERYTHING, "--log-key", KEY)
    assert code == 1, out
    assert [(f["kind"], f["record_id"]) for f in out["findings"]] == [
        ("stream_start_mismatch", RECORD_ID)], out
    assert audit_says in out["findings"][0]["message"]
    code, out = cli_json(capsys, "log", "fsck", "--db", url, "--log-key", KEY, "--no-state")
    assert code == 1
    assert [f["kind"] for f in out["findings"]] == ["stream_start_mismatch"], out
    assert audit_says in out["findings"][0]["detail"]
    assert RECORD_ID in out["findings"][0]["where"]
    bundle = _bundle(url, tmp_path, capsys)
    code, out = cli_json(capsys, "verify", "--bundle", str(bundle), *TRUST, "--no-state")
    assert code == 1 and out["failed"] == 1, out
    failed, = (r for r in out["results"] if not r["verified"])
    assert failed["record_id"] == RECORD_ID and failed["failed_check"] == 1
    assert verify_says in failed["checks"][0]["reason"]


def test_a_second_record_naming_a_completed_start_is_found_by_audit_and_fsck(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    second = "0192f0c0-0000-7000-8000-00000000b002"
    url = _log(tmp_path, lambda i, env: [_start(i, env), _record(i, env, START_ID),
                                         _record(i, env, START_ID, record_id=second)])
    code, out = cli_json(capsys, "audit", "--db", url, *EVERYTHING, "--log-key", KEY)
    assert [(f["kind"], f["record_id"]) for f in out["findings"]] == [
        ("stream_start_mismatch", second)], out
    assert "that no other record completed" in out["findings"][0]["message"]
    code, out = cli_json(capsys, "log", "fsck", "--db", url, "--log-key", KEY, "--no-state")
    assert [f["kind"] for f in out["findings"]] == ["stream_start_mismatch"], out


def test_a_stream_served_by_another_engine_than_its_start_names_verifies(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Decision 0058: the start names the first engine's environment at admission, the
    record the environment of the engine that ran it; with two engines they differ, and
    every verifier accepts it (each reference is checked on its own)."""
    second = _environment("engine-1")
    url = _log(tmp_path, lambda i, env: [second, _start(i, env),
                                         _record(i + 1, second, START_ID, engine="engine-1")])
    code, out = cli_json(capsys, "verify", RECORD_ID, "--db", url, *TRUST)
    assert code == 0, out
    code, out = cli_json(capsys, "audit", "--db", url, *EVERYTHING, "--log-key", KEY)
    assert code == 0 and out["complete"], out
    code, out = cli_json(capsys, "log", "fsck", "--db", url, "--log-key", KEY, "--no-state")
    assert code == 0 and out["ok"], out


def test_a_start_naming_no_environment_leaf_is_found_by_audit_and_fsck(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The start's own environment reference is judged as a record's is (0058): here it
    names the leaf after the environment, which is no environment leaf."""
    url = _log(tmp_path, lambda i, env: [_start(i + 1, env), _record(i, env, START_ID)])
    code, out = cli_json(capsys, "audit", "--db", url, *EVERYTHING, "--log-key", KEY)
    assert code == 1, out
    assert [(f["kind"], f["record_id"]) for f in out["findings"]] == [
        ("environment_mismatch", START_ID)], out
    assert "names leaf 6 as its environment, which is no environment leaf before it" in \
        out["findings"][0]["message"]
    code, out = cli_json(capsys, "log", "fsck", "--db", url, "--log-key", KEY, "--no-state")
    assert code == 1
    assert [f["kind"] for f in out["findings"]] == ["environment_mismatch"], out


async def _streamed(service: Service) -> dict[str, Any]:  # noqa: F811
    response = await service.client.post(
        "/v1/completions", json={"model": "tiny-llama", "prompt": "Once upon",
                                 "max_tokens": 4, "temperature": 0, "stream": True},
        headers={"Authorization": f"Bearer {service.token}"})
    assert response.status == 200
    events = [line[len("data: "):] for line in (await response.text()).split("\n\n")
              if line.startswith("data: ")]
    audit: dict[str, Any] = json.loads(events[-2])["audit"]
    return audit


async def test_over_the_server_the_start_is_fetched_and_a_forged_link_fails_check_1(
        service: Service, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    audit = await _streamed(service)
    service.seal()
    args = ("--server", service.url, "--api-key", service.token, "--log-key",
            service.log_key, *SELF, "--no-state", "--json")
    code, out = await cli(capsys, "verify", audit["record_id"], *args)
    assert code == 0, out
    assert (f"stream start leaf {audit['stream_start_record_id']} at index "
            f"{audit['stream_start_leaf_index']} opens") in out["checks"][0]["reason"]
    assert f"stream start leaf {audit['stream_start_leaf_index']}" in out["checks"][1]["reason"]

    # The operator appends a record of another tenant naming bank-a's genuine start: the
    # other tenant's key cannot read that start, and no verifier may take the link on
    # trust.
    ledger = service.app[LEDGER]
    genuine = json.loads(ledger.get_record(audit["record_id"]).leaf_body)  # type: ignore[union-attr]
    env_index = genuine["environment"]["leaf_index"]
    forged = build_record_v2(
        origin=service.app[SETTINGS].origin, tenant="bank-b", engine=genuine["engine"],
        environment=EnvironmentRef(env_index, bytes.fromhex(
            genuine["environment"]["leaf_hash"])),
        commitments=genuine["commitments"], data=genuine["data"],
        batch=genuine["batch"], timings_ms=genuine["timings_ms"],
        stream_start_record_id=audit["stream_start_record_id"])
    ledger.append(forged)
    service.seal()
    other = service.app[KEYS].create("bank-b", "client")[0]
    code, out = await cli(capsys, "verify", forged.record_id, "--server", service.url,
                          "--api-key", other, "--log-key", service.log_key, *SELF,
                          "--no-state", "--json")
    assert code == 1 and out["failed_check"] == 1, out
    assert (f"names stream start {audit['stream_start_record_id']} and the source gave no "
            "such leaf") in out["checks"][0]["reason"]
    # The auditor reads every tenant's leaves: it gets the start, and check 1 names the
    # other tenant.
    code, out = await cli(capsys, "verify", forged.record_id, "--server", service.url,
                          "--api-key", service.auditor, "--log-key", service.log_key,
                          *SELF, "--no-state", "--json")
    assert code == 1 and out["failed_check"] == 1, out
    assert "which is tenant 'bank-a''s, not 'bank-b''s" in out["checks"][0]["reason"]


def test_a_body_that_is_not_its_canonical_bytes_fails_check_1_naming_the_body(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The same members with a space after a colon, and an envelope committing to those
    # bytes: one meaning, but not the bytes the writer makes (verify.js refuses it too).
    def spaced(i: int, env: Leaf) -> list[Leaf]:
        honest = _record(i, env, None)
        body = honest.body.replace(b'"tenant":"acme"', b'"tenant": "acme"')
        envelope = envelope_bytes(honest.kind, honest.created_at,
                                  tenant_tag(ORIGIN, "acme"), body)
        return [Leaf(envelope, body, merkle.hash_leaf(envelope), honest.kind, honest.content)]

    url = _log(tmp_path, spaced)
    code, out = cli_json(capsys, "verify", RECORD_ID, "--db", url, *TRUST)
    assert code == 1 and out["failed_check"] == 1, out
    assert out["checks"][0]["reason"] == (
        "the v2 leaf does not open: CanonicalFormError: body: must be the canonical bytes "
        "committed to: bytes are JSON but not in RFC 8785 canonical form")
    code, out = cli_json(capsys, "log", "fsck", "--db", url, "--log-key", KEY, "--no-state")
    assert [f["kind"] for f in out["findings"]] == ["record_unparseable"], out


def test_a_scoped_bundle_carries_no_other_tenants_start_or_any_tenants_environment(
        tmp_path: Path) -> None:
    # The console's bundle for a tenant-scoped session: a record naming another tenant's
    # start (only a faulty or lying operator writes one) must not hand that start over.
    from ledger.client.exporter import NamedLeaves

    url = _log(tmp_path, FORGED["another tenant's start"][0])
    with SqlLedger(url) as ledger:
        row = ledger.get_record(RECORD_ID)
        assert row is not None
        size = ledger.latest_checkpoint().size  # type: ignore[union-attr]
        everything = NamedLeaves(ledger, size)
        assert everything.entry(row).stream_start_index is not None
        assert everything.starts and everything.environments
        scoped = NamedLeaves(ledger, size, scope=row.tenant)
        assert scoped.entry(row).stream_start_index is None
        assert scoped.starts == {} and list(scoped.environments) == [row.environment_index]
