"""Offline window bundles over v2 leaves (decision 0049): `export --window` carries the
bodies the exporting key may read and the environment leaves its records name; `verify`
checks every one against its envelope, filters as `query --prove` does and says so in
the same words; a tenant's bundle holds no other tenant's body and still proves the
whole window complete over the envelopes."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger.checkpoint import NoteSigner
from ledger.cosignature import Cosigner
from ledger.error_map import EXIT_CHECK_FAILED
from ledger.leaves.envelope import Leaf
from ledger.store.sql import SqlLedger
from tests.cli_runs import cli_text
from tests.mixed_log import DRIVER_A, MODEL_A, MODEL_B, append_all, mixed_leaves, seal_cosigned
from tests.tiles_service import tiles_service

ORIGIN = "window-bodies.test/log"
BASE = datetime(2026, 11, 3, 8, 0, 0)
COUNT, SWITCH = 420, 250  # environment A at leaf 0, B at leaf 250
SINCE, UNTIL = BASE + timedelta(seconds=100 * 30), BASE + timedelta(seconds=400 * 30)
RANGE = range(89, 411)  # the leaves that hold [SINCE, UNTIL) by the lag rule


def _when(i: int) -> datetime:
    return BASE + timedelta(seconds=30 * i)  # one leaf every 30 s: the lag is 10 leaves


@pytest.fixture(autouse=True)
def own_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUDIT_LEDGER_HOME", str(tmp_path / "home"))


@pytest.fixture(scope="module")
def keys() -> tuple[NoteSigner, Cosigner]:
    return (NoteSigner(ORIGIN, Ed25519PrivateKey.generate()),
            Cosigner("witness.test", Ed25519PrivateKey.generate()))


LEAVES = mixed_leaves(ORIGIN, COUNT, _when, v1=0, switch=SWITCH)


def _tenant(i: int) -> str | None:
    leaf = LEAVES[i]
    assert isinstance(leaf, Leaf)
    return leaf.content.get("tenant")


def _build(url: str, keys: Any) -> None:
    """The mixed log appended by the writer, sealed at COUNT and cosigned."""
    signer, witness = keys
    append_all(url, LEAVES)
    with SqlLedger(url) as ledger:
        seal_cosigned(ledger, ORIGIN, signer, witness, COUNT)


@pytest.fixture()
def served(empty_url: str, keys: Any) -> Iterator[tuple[str, dict[str, str]]]:
    """The log on SQLite or PostgreSQL, its tiles served on loopback (tokens of bank-a:
    an all-tenant auditor's and a tenant's client key)."""
    _build(empty_url, keys)
    ledger = SqlLedger(empty_url)
    try:
        with tiles_service(ledger) as (base, tokens):
            yield base, tokens
    finally:
        ledger.engine.dispose()


def _trust(keys: Any) -> list[str]:
    signer, witness = keys
    return ["--log-key", signer.verifier().encode(), "--witness", witness.witness_key.encode()]


WINDOW = ["--since", SINCE.isoformat(), "--until", UNTIL.isoformat()]


def _export(capsys: pytest.CaptureFixture[str], base: str, token: str, bundle: Path,
            keys: Any, *extra: str) -> dict[str, Any]:
    code, out, err = cli_text(capsys, "export", "--window", "--json", "--bundle", str(bundle),
                              "--tiles", base, "--api-key", token, *WINDOW, *extra,
                              *_trust(keys))
    assert code == 0, err
    return dict(json.loads(out))


def _bodies(bundle: Path) -> dict[int, bytes]:
    raw = json.loads(bundle.read_text())
    return {b["leaf_index"]: base64.b64decode(b["body"]) for b in raw["bodies"]}


def _verify(capsys: pytest.CaptureFixture[str], bundle: Path, keys: Any, *filters: str
            ) -> tuple[int, str, str]:
    return cli_text(capsys, "verify", "--bundle", str(bundle), "--no-state", *filters,
                    *_trust(keys))


def _query(capsys: pytest.CaptureFixture[str], base: str, token: str, keys: Any,
           *filters: str) -> str:
    code, out, err = cli_text(capsys, "query", "--prove", "--tiles", base, "--api-key", token,
                              "--no-state", *WINDOW, *filters, *_trust(keys))
    assert code == 0, err
    return out.splitlines()[-1]


def test_window_bundle_carries_bodies_and_verify_filters_as_query_does(
        served: tuple[str, dict[str, str]], keys: Any, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    base, tokens = served
    bundle = tmp_path / "window.json"
    result = _export(capsys, base, tokens["auditor"], bundle, keys)
    # Every leaf of the range has its body, and environment A (leaf 0, before the range)
    # comes with its own: once, though 249 records name it.
    assert (result["start"], result["end"], result["bodies_left_out"]) == (89, 411, 0)
    assert set(_bodies(bundle)) == {0, *RANGE}
    for filters, matched in (([], 300), (["--model-digest", MODEL_B], 149),
                             (["--tenant", "bank-b", "--driver-version", DRIVER_A], 75),
                             (["--accelerator-model", "NVIDIA H200", "--service-revision",
                               "b" * 40], 299),
                             (["--model-digest", MODEL_A, "--tenant", "bank-a"], 75)):
        code, out, err = _verify(capsys, bundle, keys, *filters)
        assert code == 0, (filters, err)
        line = out.splitlines()[-1]
        assert line.startswith(f"complete: every leaf in [89, 411) read and checked, "
                               f"{matched} matched (signed checkpoint of size {COUNT}, "
                               "witnessed by witness.test; 300 leaves in the window)"), line
        assert line == _query(capsys, base, tokens["auditor"], keys, *filters), filters


def test_tenant_window_bundle_holds_only_its_own_and_log_wide_bodies(
        served: tuple[str, dict[str, str]], keys: Any, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    base, tokens = served
    own = {0} | {i for i in RANGE if _tenant(i) in ("bank-a", None)}
    scoped, unscoped = tmp_path / "scoped.json", tmp_path / "unscoped.json"
    result = _export(capsys, base, tokens["client"], scoped, keys, "--tenant", "bank-a")
    # Without --tenant, bank-a's key gets the same bodies: bank-b's are refused to it.
    again = _export(capsys, base, tokens["client"], unscoped, keys)
    bank_b = sum(1 for i in RANGE if _tenant(i) == "bank-b")
    assert result["bodies_left_out"] == again["bodies_left_out"] == bank_b == 161
    for bundle in (scoped, unscoped):
        bodies = _bodies(bundle)
        assert set(bodies) == own
        assert not any(b"bank-b" in body for body in bodies.values())
        assert b"bank-b" not in bundle.read_bytes()
        # Completeness still holds over every envelope, bank-b's included.
        code, out, err = _verify(capsys, bundle, keys, "--tenant", "bank-a",
                                 "--model-digest", MODEL_B)
        assert code == 0, err
        assert out.splitlines()[-1] == _query(capsys, base, tokens["client"], keys,
                                              "--tenant", "bank-a", "--model-digest", MODEL_B)
        assert "every leaf in [89, 411) read and checked, 74 matched" in out
    # A filter that needs bank-b's bodies names the first leaf it could not read.
    code, _, err = _verify(capsys, scoped, keys, "--model-digest", MODEL_B)
    assert code == 1 and "leaf 101's body is not in the window bundle" in err, err


# --- a tampered bundle fails, naming the leaf and the check ---------------------------------


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, keys: Any) -> str:
    """An all-tenant window bundle of the log on SQLite, as text."""
    folder = tmp_path_factory.mktemp("exported")
    url = f"sqlite:///{folder / 'log.db'}"
    _build(url, keys)
    ledger = SqlLedger(url)
    bundle = folder / "window.json"
    try:
        with tiles_service(ledger) as (base, tokens), pytest.MonkeyPatch.context() as patch:
            patch.setenv("AUDIT_LEDGER_HOME", str(folder / "home"))
            from audit_cli.main import main

            assert main(["export", "--window", "--bundle", str(bundle), "--tiles", base,
                         "--api-key", tokens["auditor"], *WINDOW, *_trust(keys)]) == 0
    finally:
        ledger.engine.dispose()
    return bundle.read_text()


def _section(raw: dict[str, Any], name: str, index: int) -> dict[str, Any]:
    return next(item for item in raw[name] if item["leaf_index"] == index)


def _swap_bodies(raw: dict[str, Any]) -> None:
    first, second = _section(raw, "bodies", 102), _section(raw, "bodies", 104)
    first["body"], second["body"] = second["body"], first["body"]  # bank-a's, both


def _drop_leaf(raw: dict[str, Any]) -> None:
    raw["entries"] = [e for e in raw["entries"] if e["leaf_index"] != 250]


def _drop_environment(raw: dict[str, Any]) -> None:
    raw["leaves"] = []


def _environment_b_as_a(raw: dict[str, Any]) -> None:
    # Environment B's own envelope and body, offered as leaf 0: the body matches its
    # envelope, but that envelope is not the tree's leaf 0.
    leaf_b = next(e for e in raw["entries"] if e["leaf_index"] == SWITCH)["leaf"]
    _section(raw, "leaves", 0)["leaf"] = leaf_b
    _section(raw, "bodies", 0)["body"] = _section(raw, "bodies", SWITCH)["body"]


def _body_without_leaf(raw: dict[str, Any]) -> None:
    raw["bodies"].append({"leaf_index": 5, "body": _section(raw, "bodies", 0)["body"]})


def _drop_environment_body(raw: dict[str, Any]) -> None:
    raw["bodies"] = [b for b in raw["bodies"] if b["leaf_index"] != 0]


def _body_twice(raw: dict[str, Any]) -> None:
    raw["bodies"].append(dict(_section(raw, "bodies", 102)))


def _leaf_twice(raw: dict[str, Any]) -> None:
    entry = next(e for e in raw["entries"] if e["leaf_index"] == 102)
    raw["leaves"].append(dict(entry))


@pytest.mark.parametrize(("tamper", "filters", "message"), [
    (_swap_bodies, [], "the body of leaf 102 in the window bundle does not hash to its "
                       "envelope's body digest"),
    (_drop_leaf, [], "leaf 250 is missing from the window bundle"),
    (_drop_environment, ["--model-digest", MODEL_A],
     "leaf 0, outside the range [89, 411), is not in the window bundle"),
    (_environment_b_as_a, [], "leaf 0 in the window bundle is not the tree's leaf 0"),
    (_body_without_leaf, [], "the window bundle holds a body for leaf 5, which is not a v2 "
                             "leaf it carries"),
    (_drop_environment_body, ["--driver-version", DRIVER_A],
     "leaf 0's body is not in the window bundle"),
    (_body_twice, [], "leaf 102 is given twice in the window bundle's bodies"),
    (_leaf_twice, [], "leaf 102 is given twice in the window bundle"),
])
def test_a_tampered_window_bundle_fails_naming_the_leaf_and_the_check(
        exported: str, keys: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        tamper: Any, filters: list[str], message: str) -> None:
    bundle = tmp_path / "window.json"
    bundle.write_text(exported)
    code, out, err = _verify(capsys, bundle, keys, *filters)
    assert code == 0, err  # the bundle as exported verifies, with these filters too
    raw = json.loads(exported)
    tamper(raw)
    bundle.write_text(json.dumps(raw))
    code, out, err = _verify(capsys, bundle, keys, *filters)
    assert code == 1 and message in err, err


def test_export_window_leaves_filters_other_than_the_tenant_to_verify(
        tmp_path: Path, keys: Any, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli_text(capsys, "export", "--window", "--bundle", str(tmp_path / "w.json"),
                            "--tiles", str(tmp_path), *WINDOW, "--model-digest", MODEL_B,
                            *_trust(keys))
    assert code == 2 and "--model-digest: a window bundle holds every leaf of the window: " \
                         "give this filter to verify" in err, err
    assert not (tmp_path / "w.json").exists()


def test_verify_names_the_window_a_bundle_proves_and_refuses_another_asked_for(
        served: tuple[str, dict[str, str]], keys: Any, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A bundle of another window than the auditor's proves nothing about the auditor's:
    verify says which window it proved, and with --since/--until fails unless the bundle's
    window holds the one asked for."""
    base, tokens = served
    bundle = tmp_path / "window.json"
    _export(capsys, base, tokens["auditor"], bundle, keys)
    edges = f"[{SINCE.isoformat()}Z, {UNTIL.isoformat()}Z)"
    code, out, err = _verify(capsys, bundle, keys)
    assert code == 0, err
    assert f"window proved: {edges}" in out.splitlines()
    code, out, err = _verify(capsys, bundle, keys, "--json")
    assert code == 0, err
    answer = json.loads(out)
    assert (answer["since"], answer["until"]) == tuple(edges[1:-1].split(", "))
    inside = ["--since", (SINCE + timedelta(seconds=60)).isoformat(),
              "--until", (UNTIL - timedelta(seconds=60)).isoformat()]
    code, out, err = _verify(capsys, bundle, keys, *inside)
    assert code == 0, err
    for asked, message in (
            (["--since", (SINCE - timedelta(hours=8)).isoformat()], "after the --since"),
            (["--until", (UNTIL + timedelta(hours=8)).isoformat()], "before the --until")):
        code, out, err = _verify(capsys, bundle, keys, *asked)
        assert code == EXIT_CHECK_FAILED, (asked, out)
        assert message in err + out, (asked, err, out)


def test_verify_of_a_record_refuses_a_window(keys: Any, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli_text(capsys, "verify", "0193a1b2-c3d4-7e5f-8a6b-000000000001",
                              "--db", f"sqlite:///{tmp_path / 'none.db'}", "--no-state",
                              "--since", SINCE.isoformat(), *_trust(keys))
    assert code != 0 and "--since" in err and "window bundle" in err, (out, err)
    assert not (tmp_path / "none.db").exists()
