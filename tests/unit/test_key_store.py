"""The key store's own rules: daily epochs, replacing KEKs for an erasure (doomed until
destroyed, never the current one), old keyring files, and writes that leave no copy."""

from __future__ import annotations

import base64
import json
import os
import stat
from pathlib import Path

import pytest

from ledger.store.keyring import FileKeyring
from ledger.vault_crypto import KeyringData
from ledger.vault_errors import KeyUnavailableError


def test_a_new_kek_each_epoch() -> None:
    now = [1000.0]
    keys = KeyringData(epoch_s=86400.0, clock=lambda: now[0])
    first, _ = keys.wrap("bank-a", b"k" * 32, b"c")
    now[0] += 86399.0
    assert keys.wrap("bank-a", b"k" * 32, b"c")[0] == first
    now[0] += 1.0
    second, wrapped = keys.wrap("bank-a", b"k" * 32, b"c")
    assert second != first and keys.current_kek_id("bank-a") == second
    assert keys.unwrap("bank-a", second, wrapped, b"c") == b"k" * 32
    assert set(keys.kek_ids("bank-a")) == {first, second}  # the old epoch still opens


def test_replace_dooms_then_destroy_removes_never_the_current() -> None:
    keys = KeyringData()
    old = keys.current_kek_id("bank-a")
    kek_id, wrapped = keys.wrap("bank-a", b"d" * 32, b"ctx")
    new = keys.replace("bank-a", [old])
    assert keys.current_kek_id("bank-a") == new != old  # the current one moved on
    assert keys.doomed("bank-a") == [old]
    assert keys.destroy("bank-a", [old, new]) == [old]  # the current one survives
    assert keys.doomed("bank-a") == [] and keys.kek_ids("bank-a") == [new]
    with pytest.raises(KeyUnavailableError) as caught:
        keys.unwrap("bank-a", kek_id, wrapped, b"ctx")
    assert caught.value.kek_id == old
    # Replacing a KEK that is not current leaves the current one current.
    other = keys.rotate("bank-a")
    spare = keys.replace("bank-a", [new])
    assert keys.current_kek_id("bank-a") == other and spare in keys.kek_ids("bank-a")


def test_subject_keys_rotate_and_retire() -> None:
    keys = KeyringData()
    first = keys.subject_key("bank-a")
    second = keys.rotate_subject_key("bank-a")
    assert keys.subject_keys("bank-a") == [second, first]
    assert keys.retire_subject_keys("bank-a") == 1
    assert keys.subject_keys("bank-a") == [second]


def test_a_version_1_keyring_file_still_opens(tmp_path: Path) -> None:
    path = tmp_path / "vault.keyring"
    kek, subject = os.urandom(32), os.urandom(32)
    path.write_text(json.dumps({"version": 1, "tenants": {"bank-a": {
        "current": "kek-1", "keks": {"kek-1": base64.b64encode(kek).decode()},
        "subject_key": base64.b64encode(subject).decode()}}}))
    path.chmod(0o644)
    keyring = FileKeyring(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # tightened on load
    assert keyring.kek("bank-a", "kek-1") == kek and keyring.subject_key("bank-a") == subject
    # Its first wrap starts an epoch (it has no start time) and rewrites it as version 2.
    assert keyring.wrap("bank-a", b"d" * 32, b"c")[0] != "kek-1"
    assert json.loads(path.read_text())["version"] == 2


def test_a_failed_write_leaves_no_copy_of_the_keys(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    keyring = FileKeyring(tmp_path / "vault.keyring")
    keyring.current_kek_id("bank-a")
    before = (tmp_path / "vault.keyring").read_bytes()

    def refuse(*_: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError, match="disk full"):
        keyring.rotate("bank-a")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vault.keyring", "vault.keyring.lock"]
    assert (tmp_path / "vault.keyring").read_bytes() == before
