"""Configuring witnesses: the log's AUDIT_LEDGER_WITNESSES and the witness's logs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit_cli.main import main
from ledger.checkpoint import NoteSigner
from ledger.cosignature import Cosigner
from ledger.witness.client import WitnessEndpoint, parse_witnesses
from ledger.witness.service import load_logs
from ledger.witness.state import decode_cosigner_key, encode_cosigner_key


def _vkey(name: str) -> str:
    return Cosigner(name, Ed25519PrivateKey.generate()).witness_key.encode()


def test_url_equals_vkey_splits_where_a_valid_vkey_follows() -> None:
    w1, w2 = _vkey("witness.test/w1"), _vkey("witness.test/w2")
    endpoints = parse_witnesses(f"http://a.test:8090/w?x=1={w1}, https://b.test/={w2}")
    assert [(e.url, e.key.name) for e in endpoints] == [
        ("http://a.test:8090/w?x=1", "witness.test/w1"), ("https://b.test", "witness.test/w2")]
    assert parse_witnesses("") == []


def test_witness_file_and_bad_entries(tmp_path: Path) -> None:
    listing = tmp_path / "witnesses.txt"
    listing.write_text(f"# two witnesses\nhttp://a.test={_vkey('w/1')}\n\n"
                       f"http://b.test={_vkey('w/2')}\n")
    assert [e.key.name for e in parse_witnesses(str(listing))] == ["w/1", "w/2"]
    with pytest.raises(ValueError, match="URL=VKEY"):
        WitnessEndpoint.parse("http://a.test=not-a-key")
    log_key = NoteSigner("log.test/x", Ed25519PrivateKey.generate()).verifier().encode()
    with pytest.raises(ValueError, match="URL=VKEY"):  # a log key is not a cosigner key
        WitnessEndpoint.parse(f"http://a.test={log_key}")
    with pytest.raises(ValueError, match="http"):
        WitnessEndpoint.parse(f"ftp://a.test={_vkey('w/1')}")
    same = _vkey("w/1")
    with pytest.raises(ValueError, match="share a name"):
        parse_witnesses(f"http://a.test={same},http://b.test={same}")


def test_logs_from_flags_and_config(tmp_path: Path) -> None:
    a = NoteSigner("log.test/a", Ed25519PrivateKey.generate()).verifier()
    b = NoteSigner("log.test/b", Ed25519PrivateKey.generate()).verifier()
    config = tmp_path / "logs.json"
    config.write_text(json.dumps({"logs": [{"origin": "log.test/b", "key": b.encode()}]}))
    logs = load_logs([("log.test/a", a.encode())], config)
    assert {o: [k.encode() for k in keys] for o, keys in logs.items()} == {
        "log.test/a": [a.encode()], "log.test/b": [b.encode()]}
    config.write_text(json.dumps({"logs": [{"origin": "log.test/b"}]}))
    with pytest.raises(ValueError, match="origin and a key"):
        load_logs([], config)


def test_witness_key_file_round_trip() -> None:
    private = Ed25519PrivateKey.generate()
    text = encode_cosigner_key("witness.test/w1", private)
    assert text.startswith("PRIVATE+KEY+witness.test/w1+")
    assert (decode_cosigner_key(text).witness_key
            == Cosigner("witness.test/w1", private).witness_key)
    with pytest.raises(ValueError, match="hash"):
        decode_cosigner_key(text.replace("+witness.test/w1+", "+witness.test/w2+"))


def test_serve_without_logs_is_a_usage_error(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["witness", "--home", str(tmp_path), "serve"]) == 2
    assert "--log" in capsys.readouterr().err
    assert main(["witness", "--home", str(tmp_path), "serve", "--log", "o", "junk"]) == 2


async def test_service_refuses_a_bad_witness_setting_naming_it() -> None:
    from aiohttp import web

    from inference_wrapper.server.app import SETTINGS
    from inference_wrapper.server.settings import Settings
    from inference_wrapper.server.witnessing import witness_context
    from ledger.errors import InvalidInputError

    app = web.Application()
    app[SETTINGS] = Settings(witnesses="http://w.test=not-a-vkey")
    with pytest.raises(InvalidInputError) as caught:
        await witness_context(app).__anext__()
    assert caught.value.field == "AUDIT_LEDGER_WITNESSES"
