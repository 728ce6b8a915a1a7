"""After an erasure, an attacker with the files and the live key store gets nothing back.

On SQLite the database file and its ``-wal``; on PostgreSQL the relation files of the
vault and receipts tables (after VACUUM and CHECKPOINT) and every ``pg_wal`` segment
written since the records were created, read through ``pg_read_binary_file``. The scan
looks for every plaintext of the erased records (prompt, output, both salts raw and hex)
and for every ciphertext they ever had (wrapped data keys, content, stored answers), and
tries each ciphertext it finds with every key in the current key store.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography.exceptions import InvalidTag
from sqlalchemy import create_engine, select, text

from ledger.digest import commit_text, new_salt
from ledger.record import build_record
from ledger.store.keyring import FileKeyring
from ledger.store.receipts import ReceiptStore
from ledger.store.schema import receipts, vault_content
from ledger.store.sql import SqlLedger
from ledger.store.vault import ContentVault, RetainItem
from ledger.vault_crypto import (
    aead_decrypt,
    content_aad,
    receipt_wrap_context,
    wrap_context,
)
from tests.integration.conftest import ORIGIN

# Old enough that no legal basis is needed (outside the 183-day minimum retention).
CREATED = (datetime.now(UTC) - timedelta(days=200)).isoformat(timespec="milliseconds"
                                                              ).replace("+00:00", "Z")


@dataclass
class Kept:
    item: RetainItem
    ciphertexts: dict[str, bytes]  # column -> bytes, as stored before the erasure
    answer: dict[str, bytes]  # the stored answer's columns, as stored before the erasure
    key: str  # its Idempotency-Key


@pytest.fixture()
def setting(ledger_url: str, tmp_path: Path) -> Iterator[tuple[SqlLedger, ContentVault,
                                                             ReceiptStore, Path]]:
    ledger = SqlLedger(ledger_url).start()
    keyring = tmp_path / "home" / "vault.keyring"
    vault = ContentVault(ledger_url, FileKeyring(keyring), policy_cache_s=0.0, origin=ORIGIN)
    vault.set_policy("bank-a", "content", 183)
    store = ReceiptStore(ledger.engine, keks=vault.keks)
    yield ledger, vault, store, keyring
    vault.close()
    ledger.close()


def _keep(ledger: SqlLedger, vault: ContentVault, store: ReceiptStore, i: int,
          subject: str) -> Kept:
    prompt, output = f"forensic prompt {i}: IBAN DE89 3704 {i:04d}", f"forensic answer {i}"
    input_salt, output_salt = new_salt(), new_salt()
    record = build_record(
        tenant="bank-a", model={"name": "tiny"}, hardware={}, software={},
        data={"input_commitment": commit_text(input_salt, prompt),
              "output_commitment": commit_text(output_salt, output)},
        timings_ms={"forward": 1.0}, created_at=CREATED)
    receipt = ledger.append(record)
    item = RetainItem(record.record_id, receipt.leaf_hash, "bank-a", record.created_at,
                      prompt, output, input_salt, output_salt, subject)
    vault.retain([item])
    # The Idempotency-Key answer, salts and output included, as the service stores it.
    key = f"key-{i}"
    assert store.claim("bank-a", key, b"\0" * 32, 600.0, "owner") is None
    assert store.complete("bank-a", key, "owner", {
        "body": {"record_id": record.record_id, "output": output,
                 "input_salt": input_salt.hex(), "output_salt": output_salt.hex()},
        "headers": {"X-Audit-Record-Id": record.record_id}})
    with vault.engine.connect() as conn:
        row = conn.execute(select(vault_content).where(
            vault_content.c.record_id == record.record_id)).one()._mapping
        answer = conn.execute(select(receipts).where(
            receipts.c.idempotency_key == key)).one()._mapping
    return Kept(item, {c: bytes(row[c]) for c in ("wrapped_key", "prompt_ct", "output_ct",
                                                  "input_salt_ct", "output_salt_ct")},
                {c: answer[c].encode() if isinstance(answer[c], str) else bytes(answer[c])
                 for c in ("wrapped_key", "response_ct", "response")
                 if answer.get(c) is not None}, key)


def _sqlite_bytes(url: str) -> bytes:
    path = Path(url[len("sqlite:///"):])
    return b"".join(Path(f"{path}{suffix}").read_bytes()
                    for suffix in ("", "-wal") if Path(f"{path}{suffix}").exists())


def _postgres_bytes(url: str, since: datetime) -> bytes:
    """Relation files of the two tables (and their TOAST) after VACUUM and CHECKPOINT,
    and every WAL segment modified since ``since``."""
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    blob = bytearray()
    with engine.connect() as conn:
        conn.execute(text("VACUUM vault_content"))
        conn.execute(text("VACUUM receipts"))
        conn.execute(text("CHECKPOINT"))  # heap pages reach their files
        paths = conn.execute(text(
            "SELECT pg_relation_filepath(c.oid) FROM pg_class c WHERE c.oid IN "
            "('vault_content'::regclass, 'receipts'::regclass) OR c.oid IN (SELECT "
            "reltoastrelid FROM pg_class WHERE oid IN ('vault_content'::regclass, "
            "'receipts'::regclass))")).scalars().all()
        segments = conn.execute(text(
            "SELECT name FROM pg_ls_waldir() WHERE modification >= :since "
            "AND name ~ '^[0-9A-F]{24}$' ORDER BY name"), {"since": since}).scalars().all()
        assert paths and segments
        for path in paths:
            if path:
                blob += conn.execute(text("SELECT pg_read_binary_file(:p)"),
                                     {"p": path}).scalar_one()
        for name in segments:
            blob += conn.execute(text("SELECT pg_read_binary_file(:p)"),
                                 {"p": f"pg_wal/{name}"}).scalar_one()
    engine.dispose()
    return bytes(blob)


def _every_kek(keyring: Path) -> list[tuple[str, bytes]]:
    """(tenant, key) for every key-encryption key the current key store holds."""
    live = FileKeyring(keyring)
    return [(tenant, key) for tenant, entry in live.tenants.items()
            for key in entry["keks"].values()]  # type: ignore[attr-defined]


def _open(stored: bytes, kept: Kept, keks: list[tuple[str, bytes]]) -> list[str]:
    """What an attacker recovers of one erased record from ``stored``."""
    recovered: list[str] = []
    if kept.answer.get("response") and kept.answer["response"] in stored:
        recovered.append("stored answer (plaintext)")
    record_id = kept.item.record_id
    for tenant, kek in keks:
        if kept.ciphertexts["wrapped_key"] in stored:
            try:
                data_key = aead_decrypt(kek, kept.ciphertexts["wrapped_key"],
                                        wrap_context(tenant, record_id))
            except InvalidTag:
                pass
            else:
                for column, field in (("prompt_ct", "prompt"), ("output_ct", "output")):
                    if kept.ciphertexts[column] in stored:
                        text_ = aead_decrypt(data_key, kept.ciphertexts[column], content_aad(
                            record_id, kept.item.leaf_hash, field)).decode()
                        recovered.append(f"{field}: {text_}")
        wrapped = kept.answer.get("wrapped_key")
        if wrapped and wrapped in stored:
            try:
                aead_decrypt(kek, wrapped, receipt_wrap_context(tenant, kept.key))
            except InvalidTag:
                pass
            else:
                recovered.append("stored answer key")
    return recovered


def _plaintexts(kept: Kept) -> list[bytes]:
    item = kept.item
    return [item.prompt.encode(), item.output.encode(), item.input_salt,
            item.output_salt, item.input_salt.hex().encode(), item.output_salt.hex().encode()]


def test_erased_records_cannot_be_recovered_from_any_stored_byte(
        setting: tuple[SqlLedger, ContentVault, ReceiptStore, Path], ledger_url: str) -> None:
    ledger, vault, store, keyring = setting
    since = datetime.now(UTC) - timedelta(seconds=5)
    erased = [_keep(ledger, vault, store, i, "alice") for i in range(3)]
    survivors = [_keep(ledger, vault, store, 10 + i, "bob") for i in range(2)]
    before = _sqlite_bytes(ledger_url) if ledger_url.startswith("sqlite") else None

    erasure = vault.erase(ledger, "bank-a", subject="alice", requested_by="cli:dpo")
    assert sorted(erasure.records) == sorted(k.item.record_id for k in erased)

    stored = (_sqlite_bytes(ledger_url) if ledger_url.startswith("sqlite")
              else _postgres_bytes(ledger_url, since))
    # The scan is not blind: the erased rows' old ciphertexts are still in these bytes
    # (WAL frames, WAL records), which is exactly what an attacker would try.
    assert any(k.ciphertexts["wrapped_key"] in stored for k in erased)
    if before is not None:
        assert all(k.ciphertexts["wrapped_key"] in before for k in erased)
    keks = _every_kek(keyring)
    assert keks
    for kept in erased:
        assert _open(stored, kept, keks) == [], kept.item.record_id
        for secret in _plaintexts(kept):
            assert secret not in stored, (kept.item.record_id, secret[:20])
    # The survivors still open, through the key store only.
    for kept in survivors:
        assert vault.decrypt(kept.item.record_id)[1].prompt == kept.item.prompt
        answer = store.get("bank-a", f"key-{10 + survivors.index(kept)}")
        assert answer is not None and answer.response is not None
        assert answer.response["body"]["output"] == kept.item.output
    # And every stored answer of an erased record is a 410 naming it.
    for i, kept in enumerate(erased):
        answer = store.get("bank-a", f"key-{i}")
        assert answer is not None and answer.response is not None
        problem = answer.response["problem"]
        assert (problem["status"], problem["record_id"]) == (410, kept.item.record_id)
        assert kept.item.output not in json.dumps(answer.response)
