"""The key store sealed by AWS KMS, against a real KMS API on loopback (moto's server
mode): one KMS key per tenant seals every key in the keyring file; content opens only
with both; an erasure destroys the KEK in the file at once, without deleting any KMS
key; a KMS that refuses makes the keys unavailable (503), never readable."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ledger.digest import new_salt
from ledger.store.keyring import FileKeyring, load_keks
from ledger.store.kms import AwsKmsSealer
from ledger.store.vault import ContentVault, RetainItem
from ledger.vault_errors import ContentErasedError, KeyUnavailableError
from tests.integration.conftest import ORIGIN
from tests.s3_server import s3_server

CREATED = "2026-01-05T09:00:00.000Z"  # outside the minimum retention: no legal basis


@pytest.fixture(scope="module")
def kms(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any]]:
    import boto3

    with s3_server(tmp_path_factory.mktemp("moto")) as endpoint:
        client = boto3.client("kms", endpoint_url=endpoint, region_name="eu-central-1",
                              aws_access_key_id="test", aws_secret_access_key="test")
        for tenant in ("bank-a", "bank-b"):
            key = client.create_key(Description=f"audit-ledger {tenant}")["KeyMetadata"]
            client.create_alias(AliasName=f"alias/audit-ledger-{tenant}",
                                TargetKeyId=key["KeyId"])
        yield endpoint, client


class Appended:
    leaf_index = 0


class Journal:
    """The erasure leaves' log (a list): this test is about the key store."""

    def __init__(self) -> None:
        self.leaves: list[Any] = []

    def append(self, record: Any, timeout: float | None = 60.0) -> Appended:
        self.leaves.append(record)
        return Appended()

    def append_many(self, records: Any, timeout: float | None = 60.0) -> list[Any]:
        return [self.append(record) for record in records]


def _item(i: int, tenant: str = "bank-a") -> RetainItem:
    return RetainItem(f"rec-{i}", bytes([i]) * 32, tenant, CREATED, f"prompt {i}",
                      f"output {i}", new_salt(), new_salt(), None)


def test_keys_are_sealed_by_the_tenants_kms_key_and_erasure_needs_no_kms_deletion(
        kms: tuple[str, Any], tmp_path: Path) -> None:
    endpoint, client = kms
    sealer = AwsKmsSealer("alias/audit-ledger-{tenant}", client)
    path = tmp_path / "home" / "vault.keyring"
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    from ledger.store.migrate import upgrade

    upgrade(url)
    vault = ContentVault(url, FileKeyring(path, sealer=sealer), policy_cache_s=0.0, origin=ORIGIN)
    try:
        vault.set_policy("bank-a", "content", 183)
        vault.set_policy("bank-b", "content", 183)
        items = [_item(1), _item(2), _item(3, "bank-b")]
        vault.retain(items)
        keks = vault.keks
        assert isinstance(keks, FileKeyring)
        raw_keys = [k for entry in keks.tenants.values()
                    for k in entry["keks"].values()]  # type: ignore[attr-defined]
        stored = path.read_bytes()
        document = json.loads(stored)
        assert document["sealed_by"] == "aws-kms"
        for key in raw_keys:  # only KMS ciphertexts of the keys are in the file
            assert key not in stored and base64.b64encode(key) not in stored
        # Another process with the same file and KMS opens the content; without the
        # KMS the file is refused, not misread.
        other = ContentVault(url, FileKeyring(path, sealer=sealer), origin=ORIGIN)
        assert other.decrypt("rec-3")[1].output == "output 3"
        other.close()
        with pytest.raises(ValueError, match="sealed by 'aws-kms'"):
            FileKeyring(path)
        # Erasure destroys the KEK in the file at once; no KMS key is scheduled for
        # deletion, and the other tenant's KMS key still opens its keys.
        erasure = vault.erase(Journal(), "bank-a", record_ids=["rec-1"],
                              requested_by="cli:dpo")
        assert erasure.records == ["rec-1"]
        with pytest.raises(ContentErasedError):
            vault.decrypt("rec-1")
        assert vault.decrypt("rec-2")[1].prompt == "prompt 2"
        states = [client.describe_key(KeyId=f"alias/audit-ledger-{t}")["KeyMetadata"]
                  ["KeyState"] for t in ("bank-a", "bank-b")]
        assert states == ["Enabled", "Enabled"]
        fresh = FileKeyring(path, sealer=sealer)
        assert set(fresh.tenants["bank-a"]["keks"]) == {  # type: ignore[arg-type]
            vault.keks.current_kek_id("bank-a")}
        # The KMS refuses (here: the alias now names another key; moto does not enforce
        # a disabled key's state): the tenant's keys are unavailable (503), not readable.
        client.update_alias(AliasName="alias/audit-ledger-bank-b", TargetKeyId=client.
                            describe_key(KeyId="alias/audit-ledger-bank-a")["KeyMetadata"]
                            ["KeyId"])
        with pytest.raises(KeyUnavailableError) as caught:
            FileKeyring(path, sealer=sealer)
        assert "AWS KMS" in str(caught.value) and caught.value.tenant == "bank-b"
    finally:
        vault.close()


def test_the_service_setting_builds_the_kms_sealed_keyring(
        kms: tuple[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    endpoint, _ = kms
    for name, value in {"AUDIT_LEDGER_KMS_KEY_ID": "alias/audit-ledger-{tenant}",
                        "AUDIT_LEDGER_KMS_ENDPOINT": endpoint,
                        "AUDIT_LEDGER_KMS_REGION": "eu-central-1",
                        "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}.items():
        monkeypatch.setenv(name, value)
    keks = load_keks(tmp_path / "vault.keyring", "aws-kms")
    assert isinstance(keks, FileKeyring) and keks.sealer.name == "aws-kms"
    kek_id, wrapped = keks.wrap("bank-a", b"k" * 32, b"context")
    assert keks.unwrap("bank-a", kek_id, wrapped, b"context") == b"k" * 32
    monkeypatch.setenv("AUDIT_LEDGER_KMS_KEY_ID", "")
    from ledger.errors import InvalidInputError

    with pytest.raises(InvalidInputError) as caught:
        load_keks(tmp_path / "vault.keyring", "aws-kms")
    assert caught.value.field == "AUDIT_LEDGER_KMS_KEY_ID"
