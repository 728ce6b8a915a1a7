"""A log's identity: a unique origin fixed at creation, and the key check every replica
makes before it may seal (issue 14 item 3, issue 9 item 4)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from audit_cli.main import main
from ledger.errors import LogIdentityError, SignatureError
from ledger.store.keys import (
    KEY_PATH_SETTING,
    KEY_SETTING,
    ORIGIN_SETTING,
    load_or_create_signer,
    open_log_identity,
)
from ledger.store.migrate import upgrade
from ledger.store.sql import SqlLedger
from tests.records import make_record
from tests.replica_cluster import launch

ORIGIN_PATTERN = r"acme\.example/log/[0-9a-f]{8}"


def test_a_new_log_gets_a_unique_origin_and_replicas_join_it(ledger_url: str,
                                                              tmp_path: Path) -> None:
    key = tmp_path / "log.key"
    with SqlLedger(ledger_url) as ledger:
        first = open_log_identity(ledger, key_path=key, log_name="acme.example/log")
        assert re.fullmatch(ORIGIN_PATTERN, first.origin) and first.created
        assert first.signer.name == first.origin  # the key name IS the origin
        stored = ledger.log_meta()
        assert stored is not None and stored.origin == first.origin
        assert stored.verifier_key == first.signer.verifier().encode()
        ledger.append(make_record(0))
        ledger.seal_checkpoint(first.signer, first.origin, sealed_by="r1")
        # Another replica: same key file, or the key given as text; other log_name ignored.
        again = open_log_identity(ledger, key_path=key, log_name="other/log")
        by_text = open_log_identity(ledger, key_path=tmp_path / "absent.key",
                                    key_text=key.read_text())
        named = open_log_identity(ledger, key_path=key, origin=first.origin)
    assert {again.origin, by_text.origin, named.origin} == {first.origin}
    assert not again.created and not by_text.created
    assert by_text.signer.public_key == first.signer.public_key
    latest = SqlLedger(ledger_url).latest_checkpoint()
    assert latest is not None and latest.sealed_by == "r1"


def test_a_foreign_key_or_origin_is_refused(ledger_url: str, tmp_path: Path) -> None:
    key = tmp_path / "log.key"
    foreign = tmp_path / "foreign.key"
    load_or_create_signer(foreign, "someone.else/log")
    with SqlLedger(ledger_url) as ledger:
        identity = open_log_identity(ledger, key_path=key)
        # Refused before any checkpoint exists: the stored verifier key decides.
        with pytest.raises(LogIdentityError) as before:
            open_log_identity(ledger, key_path=foreign)
        assert before.value.field == KEY_PATH_SETTING and "does not sign" in str(before.value)
        ledger.seal_checkpoint(identity.signer, identity.origin)
        with pytest.raises(LogIdentityError) as by_path:
            open_log_identity(ledger, key_path=foreign)
        with pytest.raises(LogIdentityError) as by_text:
            open_log_identity(ledger, key_path=key, key_text=foreign.read_text())
        with pytest.raises(LogIdentityError) as by_origin:
            open_log_identity(ledger, key_path=key, origin="audit-ledger.local/log")
        with pytest.raises(LogIdentityError) as missing:
            open_log_identity(ledger, key_path=tmp_path / "nowhere" / "log.key")
    assert by_path.value.field == KEY_PATH_SETTING and "does not sign" in str(by_path.value)
    assert by_text.value.field == KEY_SETTING
    assert by_origin.value.field == ORIGIN_SETTING and identity.origin in str(by_origin.value)
    assert missing.value.field == KEY_PATH_SETTING and "no signing key" in str(missing.value)
    assert not (tmp_path / "nowhere").exists()  # no key was made up for an existing log


def test_an_origin_that_cannot_name_a_key_is_refused(ledger_url: str, tmp_path: Path) -> None:
    with SqlLedger(ledger_url) as ledger:
        with pytest.raises(LogIdentityError) as given:
            open_log_identity(ledger, key_path=tmp_path / "log.key", origin="my log")
        with pytest.raises(LogIdentityError) as named:
            open_log_identity(ledger, key_path=tmp_path / "log.key", log_name="a+b")
        assert ledger.log_meta() is None
    assert given.value.field == ORIGIN_SETTING and "not a valid origin" in str(given.value)
    assert named.value.field == "AUDIT_LEDGER_LOG_NAME"
    assert not (tmp_path / "log.key").exists()


def test_a_log_from_before_stored_origins_keeps_its_origin(ledger_url: str,
                                                           tmp_path: Path) -> None:
    key = tmp_path / "log.key"
    signer = load_or_create_signer(key, "audit-ledger.local/log")
    with SqlLedger(ledger_url) as ledger:
        ledger.append(make_record(0))
        ledger.seal_checkpoint(signer, "audit-ledger.local/log")
        with pytest.raises(LogIdentityError) as foreign:
            open_log_identity(ledger, key_path=tmp_path / "new.key",
                              key_text=_foreign_key(tmp_path))
        assert foreign.value.field == KEY_SETTING and "did not sign" in str(foreign.value)
        assert ledger.log_meta() is None  # a refused replica records nothing
        identity = open_log_identity(ledger, key_path=key)
        assert identity.origin == "audit-ledger.local/log" and identity.created
        stored = ledger.log_meta()
        assert stored is not None and stored.origin == "audit-ledger.local/log"


def test_two_logs_under_one_home_cannot_be_confused(tmp_path: Path, make_pg_database,  # type: ignore[no-untyped-def]
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    key = tmp_path / "log.key"  # one key file shared by both logs
    sqlite_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    pg_url = str(make_pg_database())
    notes = {}
    for url in (sqlite_url, pg_url):
        upgrade(url)
        with SqlLedger(url) as ledger:
            identity = open_log_identity(ledger, key_path=key)
            ledger.append(make_record(0))
            checkpoint = ledger.seal_checkpoint(identity.signer, identity.origin)
            assert checkpoint is not None
            notes[url] = (identity, checkpoint.note)
    (lite, lite_note), (pg, pg_note) = notes[sqlite_url], notes[pg_url]
    assert lite.origin != pg.origin and lite.signer.public_key == pg.signer.public_key
    # The same record at the same index, the same key: still no verifier mixes them up.
    with pytest.raises(SignatureError):
        pg.signer.verifier().open_checkpoint(lite_note, pg.origin)
    with pytest.raises(SignatureError):
        lite.signer.verifier().open(pg_note)
    # fsck with the shared key file checks each log under its own origin, and the
    # public key an auditor pins from it is the one for that log.
    for url, identity in ((sqlite_url, lite), (pg_url, pg)):
        assert main(["log", "--db", url, "--key-file", str(key), "fsck"]) == 0
        capsys.readouterr()
        assert main(["log", "--db", url, "--key-file", str(key), "public-key"]) == 0
        assert capsys.readouterr().out.strip() == identity.signer.verifier().encode()


def _foreign_key(tmp_path: Path) -> str:
    path = tmp_path / "foreign.key"
    load_or_create_signer(path, "someone.else/log")
    return path.read_text()


def _serve_exit(tmp_path: Path, tiny_model_dir: Path, url: str, name: str,
                env: dict[str, str]) -> tuple[int, str]:
    replica = launch(name, tmp_path, tiny_model_dir, url, env)
    try:
        code = replica.process.wait(timeout=180)
    finally:
        replica.stop()
    return code, replica.output()


def test_serve_refuses_a_foreign_key_or_origin(tmp_path: Path, tiny_model_dir: Path,
                                               make_pg_database) -> None:  # type: ignore[no-untyped-def]
    url = str(make_pg_database())
    upgrade(url)
    key = tmp_path / "log.key"
    with SqlLedger(url) as ledger:
        identity = open_log_identity(ledger, key_path=key)
        ledger.append(make_record(0))
        ledger.seal_checkpoint(identity.signer, identity.origin)
        size_before = ledger.tree_head()[0]
    foreign = tmp_path / "foreign.key"
    load_or_create_signer(foreign, "someone.else/log")
    cases = {
        "path": ({"AUDIT_LEDGER_LOG_KEY_PATH": str(foreign)}, KEY_PATH_SETTING, "does not sign"),
        "text": ({"AUDIT_LEDGER_LOG_KEY_PATH": str(key),
                  "AUDIT_LEDGER_LOG_SIGNING_KEY": foreign.read_text()}, KEY_SETTING,
                 "does not sign"),
        "origin": ({"AUDIT_LEDGER_LOG_KEY_PATH": str(key),
                    "AUDIT_LEDGER_ORIGIN": "audit-ledger.local/log"}, ORIGIN_SETTING,
                   identity.origin),
    }
    for name, (env, setting, words) in cases.items():
        started = time.monotonic()
        code, output = _serve_exit(tmp_path, tiny_model_dir, url, name, env)
        assert code == 2, output[-2000:]
        assert f"LogIdentityError: {setting}:" in output and words in output, output[-2000:]
        assert "Traceback" not in output and "serving" not in output
        print(f"{name}: refused with exit 2 in {time.monotonic() - started:.1f} s")
    with SqlLedger(url) as ledger:  # nothing was written by the refused replicas
        assert ledger.tree_head()[0] == size_before
        assert len(list(ledger.iter_checkpoints())) == 1


def test_settings_never_show_the_signing_key() -> None:
    # The signing key may sit in the environment: a logged Settings must not reveal it.
    from inference_wrapper.server.settings import Settings

    settings = Settings(log_signing_key="PRIVATE+KEY+x+00+AAAA")
    assert "PRIVATE+KEY" not in repr(settings) and settings.log_signing_key
