"""``audit-ledger generate`` without a log (decision 0043): an ``audit-record/v2`` leaf
and its ``environment/v1`` leaf, as a bundle carries them, that open and bind the way a
verifier opens them; the printed salts open the commitments."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from ledger.leaves import commitments
from ledger.leaves.envelope import tenant_tag
from ledger.leaves.kinds import open_leaf
from tests.cli_runs import cli_json


def test_generate_without_a_log_prints_v2_leaves_that_open(
        tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = cli_json(capsys, "generate", "hello there", "--max-new-tokens", "3",
                         "--model-dir", str(tiny_model_dir), "--tenant", "acme",
                         "--origin", "local.example/log")
    assert code == 0, out
    entry, named = out["entry"], out["environments"]["0"]
    record = open_leaf(base64.b64decode(entry["canonical"]), base64.b64decode(entry["body"]),
                       "local.example/log", strict=True)
    environment = open_leaf(base64.b64decode(named["envelope"]),
                            base64.b64decode(named["body"]), "local.example/log",
                            strict=True)
    assert (record.kind, environment.kind) == ("audit-record/v2", "environment/v1")
    assert record.content == out["record"] and environment.content == out["environment"]
    assert record.leaf_hash.hex() == out["leaf_hash"]
    # The record names leaf 0 by its hash, as check 1 requires.
    assert entry["environment_index"] == 0
    assert record.content["environment"] == {"leaf_index": 0,
                                             "leaf_hash": environment.leaf_hash.hex()}
    assert base64.b64decode(entry["canonical"]).decode().count(
        tenant_tag("local.example/log", "acme")) == 1
    held = record.content["commitments"]
    assert commitments.opens(held["input"], base64.b64decode(out["input_salt"]), "input",
                             b"hello there")
    assert commitments.opens(held["output"], base64.b64decode(out["output_salt"]), "output",
                             out["output"].encode())
    assert "input_ids_digest" not in entry["body"] and "hardware" not in out["record"]
