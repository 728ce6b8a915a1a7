"""What an erasure must get right beyond destroying keys, on SQLite and PostgreSQL:
answers stored while it runs, holds placed while it is logged, holds that name nothing,
the bounds of retention periods and expiry times, a legal basis before the minimum
retention, the subject link, and the modes of the files that hold keys and content."""

from __future__ import annotations

import json
import os
import stat
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from ledger.digest import commit_text, new_salt
from ledger.errors import InvalidInputError
from ledger.leaves.content_leaves import ERASURE_KIND
from ledger.record import AuditRecord, build_record
from ledger.store.file_modes import sqlite_path
from ledger.store.keyring import FileKeyring
from ledger.store.receipts import ReceiptStore
from ledger.store.schema import vault_content
from ledger.store.sql import SqlLedger
from ledger.store.vault import MAX_DAYS, ContentVault, RetainItem
from ledger.vault_errors import ContentErasedError, LegalHoldError
from tests.integration.conftest import ORIGIN


def _stamp(moment: datetime) -> str:
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


OLD = _stamp(datetime.now(UTC) - timedelta(days=200))  # outside the 183-day minimum


@dataclass
class Setting:
    ledger: SqlLedger
    vault: ContentVault
    store: ReceiptStore
    keyring: Path

    def keep(self, i: int, subject: str | None = "alice", created: str = OLD,
             tenant: str = "bank-a") -> RetainItem:
        prompt, output = f"prompt {i}", f"answer {i}"
        input_salt, output_salt = new_salt(), new_salt()
        record = build_record(
            tenant=tenant, model={"name": "tiny"}, hardware={}, software={},
            data={"input_commitment": commit_text(input_salt, prompt),
                  "output_commitment": commit_text(output_salt, output)},
            timings_ms={"forward": 1.0}, created_at=created)
        receipt = self.ledger.append(record)
        item = RetainItem(record.record_id, receipt.leaf_hash, tenant, record.created_at,
                          prompt, output, input_salt, output_salt, subject)
        self.vault.retain([item])
        return item

    def answer(self, item: RetainItem, key: str) -> dict[str, Any]:
        return {"body": {"record_id": item.record_id, "output": item.output,
                         "input_salt": item.input_salt.hex()},
                "headers": {"X-Audit-Record-Id": item.record_id}}

    def leaf(self, record_id: str) -> dict[str, Any]:
        row = self.ledger.get_record(record_id)
        assert row is not None
        return dict(json.loads(row.leaf_body))


@pytest.fixture()
def setting(ledger_url: str, tmp_path: Path) -> Iterator[Setting]:
    ledger = SqlLedger(ledger_url).start()
    keyring = tmp_path / "home" / "vault.keyring"
    vault = ContentVault(ledger_url, FileKeyring(keyring), policy_cache_s=0.0, origin=ORIGIN)
    vault.set_policy("bank-a", "content", 183)
    yield Setting(ledger, vault, ReceiptStore(ledger.engine, keks=vault.keks), keyring)
    vault.close()
    ledger.close()


class DuringAppend:
    """The ledger, running ``act`` once after the erasure leaf is committed and before
    the erasure's own transaction (the window in which the issue's races happened)."""

    def __init__(self, setting: Setting, act: Any) -> None:
        self.setting, self.act, self.appended = setting, act, []

    def append(self, record: AuditRecord, timeout: float | None = 60.0) -> Any:
        return self.append_many([record], timeout)[0]

    def append_many(self, records: Sequence[AuditRecord], timeout: float | None = 60.0
                    ) -> list[Any]:
        outcomes = self.setting.ledger.append_many(records, timeout)
        first = not self.appended
        self.appended.extend(record.content for record in records)
        if first and records[0].content["schema"] == ERASURE_KIND:
            self.act()
        return outcomes


def _gone(store: ReceiptStore, key: str, record_id: str) -> None:
    found = store.get("bank-a", key)
    assert found is not None and found.state == "done" and found.response is not None
    problem = found.response["problem"]
    assert (problem["status"], problem["code"], problem["record_id"]) == (
        410, "content_erased", record_id)


def test_an_answer_stored_while_the_erasure_is_logged_is_stored_as_410(
        setting: Setting) -> None:
    item = setting.keep(1)
    assert setting.store.claim("bank-a", "k1", b"\0" * 32, 600.0, "me") is None
    # The request finishes (and stores its answer) after the erasure began.
    during = DuringAppend(setting, lambda: setting.store.complete(
        "bank-a", "k1", "me", setting.answer(item, "k1")))
    setting.vault.erase(during, "bank-a", subject="alice", requested_by="cli:dpo")
    _gone(setting.store, "k1", item.record_id)
    # And one that finishes after the erasure committed.
    assert setting.store.claim("bank-a", "k2", b"\1" * 32, 600.0, "me") is None
    assert setting.store.complete("bank-a", "k2", "me", setting.answer(item, "k2"))
    _gone(setting.store, "k2", item.record_id)


def test_answers_completed_concurrently_with_an_erasure_never_replay(
        setting: Setting) -> None:
    items = [setting.keep(10 + i) for i in range(4)]
    keys = [f"race-{i}" for i in range(8)]
    for key in keys:
        assert setting.store.claim("bank-a", key, b"\0" * 32, 600.0, "me") is None
    start = threading.Barrier(len(keys) + 1)
    errors: list[BaseException] = []

    def complete(i: int) -> None:
        try:
            start.wait()
            setting.store.complete("bank-a", keys[i], "me",
                                   setting.answer(items[i % 4], keys[i]))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=complete, args=(i,)) for i in range(len(keys))]
    for thread in threads:
        thread.start()
    start.wait()
    setting.vault.erase(setting.ledger, "bank-a", subject="alice", requested_by="cli:dpo")
    for thread in threads:
        thread.join()
    assert errors == []
    for i, key in enumerate(keys):
        _gone(setting.store, key, items[i % 4].record_id)


def test_a_hold_placed_while_the_erasure_is_logged_wins(setting: Setting) -> None:
    item = setting.keep(20)
    holds: list[str] = []
    during = DuringAppend(setting, lambda: holds.append(setting.vault.hold(
        "bank-a", "regulator inquiry 44", record_id=item.record_id).hold_id))
    with pytest.raises(LegalHoldError) as caught:
        setting.vault.erase(during, "bank-a", subject="alice", requested_by="cli:dpo")
    assert caught.value.hold_id == holds[0]
    assert setting.vault.decrypt(item.record_id)[1].output == item.output
    # The log says so: the erasure leaf is followed by one cancelling it.
    first, cancel = during.appended
    assert cancel["erasure"]["reason"] == "cancelled"
    assert cancel["erasure"]["cancels"] == first["record_id"]
    assert cancel["erasure"]["requested_by"] == f"hold:{holds[0]}"


def test_a_hold_must_name_a_record_of_its_tenant_or_a_known_tenant(setting: Setting) -> None:
    mine = setting.keep(30)
    setting.vault.set_policy("bank-b", "content", 183)
    theirs = setting.keep(31, tenant="bank-b")
    for tenant, record_id in (("bank-a", theirs.record_id), ("bank-a", "no-such-record")):
        with pytest.raises(InvalidInputError) as caught:
            setting.vault.hold(tenant, "litigation", record_id=record_id)
        assert caught.value.field == "record_id"
    with pytest.raises(InvalidInputError) as caught:
        setting.vault.hold("bank-zz", "litigation")
    assert caught.value.field == "tenant"
    assert setting.vault.holds() == []
    assert setting.vault.hold("bank-a", "ok", record_id=mine.record_id).record_id == \
        mine.record_id
    assert setting.vault.hold("bank-b", "ok").record_id is None


def test_retention_periods_are_bounded_where_they_are_set_and_where_they_apply(
        setting: Setting, ledger_url: str, tmp_path: Path) -> None:
    for days, reason in ((MAX_DAYS + 1, "beyond"), (10**12, "beyond"), (30, "below"),
                         (True, "whole number")):
        with pytest.raises(InvalidInputError) as caught:
            setting.vault.set_policy("bank-a", "content", days)  # type: ignore[arg-type]
        assert caught.value.field == "days" and reason in caught.value.reason
    assert setting.vault.policy("bank-a").days == 183
    # A tool run with a lower minimum stores a 1-day period; this service keeps its own.
    lax = ContentVault(ledger_url, setting.vault.keks, minimum_days=1, default_days=1,
                       origin=ORIGIN)
    try:
        lax.set_policy("bank-a", "content", 1)
    finally:
        lax.close()
    assert setting.vault.policy("bank-a").days == 183
    item = setting.keep(40, created="2026-06-01T00:00:00.000Z")
    row = setting.vault.state(item.record_id)
    assert row is not None and row.expires_at == datetime(2026, 12, 1)


def test_expiry_refuses_a_time_beyond_the_clock_skew(setting: Setting) -> None:
    item = setting.keep(50, created=_stamp(datetime.now(UTC)))
    now = setting.vault.clock()
    with pytest.raises(InvalidInputError) as caught:
        setting.vault.expire(setting.ledger, now=datetime(2100, 1, 1))
    assert caught.value.field == "now"
    with pytest.raises(InvalidInputError):
        setting.vault.expire(setting.ledger, now=now + timedelta(minutes=6))
    assert setting.vault.decrypt(item.record_id)[1].prompt == item.prompt
    # A little skew is fine (and nothing is due yet).
    assert setting.vault.expire(setting.ledger, now=now + timedelta(minutes=4)) == ([], [])


def test_erasure_inside_the_minimum_retention_needs_a_legal_basis(setting: Setting) -> None:
    fresh = setting.keep(60, created=_stamp(datetime.now(UTC)))
    size = setting.ledger.tree_head()[0]
    with pytest.raises(InvalidInputError) as caught:
        setting.vault.erase(setting.ledger, "bank-a", record_ids=[fresh.record_id],
                            requested_by="cli:dpo")
    assert caught.value.field == "legal_basis" and fresh.record_id in caught.value.reason
    assert setting.ledger.tree_head()[0] == size  # refused: nothing logged
    for bad in ("", "x", "two\nlines"):
        with pytest.raises(InvalidInputError) as caught:
            setting.vault.erase(setting.ledger, "bank-a", record_ids=[fresh.record_id],
                                requested_by="cli:dpo", legal_basis=bad)
        assert caught.value.field == "legal_basis"
    basis = "GDPR Art. 17(1)(d): processed unlawfully, ticket 8812"
    erasure = setting.vault.erase(setting.ledger, "bank-a", record_ids=[fresh.record_id],
                                  requested_by="cli:dpo", legal_basis=basis)
    assert setting.leaf(str(erasure.erasure_record_id))["erasure"]["legal_basis"] == basis
    # Outside the minimum, no basis is asked for and none is recorded.
    old = setting.keep(61)
    later = setting.vault.erase(setting.ledger, "bank-a", record_ids=[old.record_id],
                                requested_by="cli:dpo")
    assert "legal_basis" not in setting.leaf(str(later.erasure_record_id))["erasure"]


def test_erased_rows_keep_no_subject_link_and_the_subject_key_rotates(
        setting: Setting) -> None:
    erased, kept = setting.keep(70, subject="erin"), setting.keep(71, subject="frank")
    setting.vault.erase(setting.ledger, "bank-a", record_ids=[erased.record_id],
                        requested_by="cli:dpo")
    with setting.vault.engine.connect() as conn:
        rows = {r.record_id: r for r in conn.execute(select(vault_content))}
    assert rows[erased.record_id].subject_hash is None
    assert rows[erased.record_id].subject_ct is None
    assert setting.vault.rows("bank-a", "erin") == []
    old_hash = rows[kept.record_id].subject_hash
    old_key = setting.vault.keks.subject_key("bank-a")
    assert setting.vault.rotate_subject_key("bank-a") == 0
    assert setting.vault.keks.subject_keys("bank-a") == [setting.vault.keks.subject_key(
        "bank-a")]  # the old subject key is destroyed
    assert old_key not in setting.vault.keks.subject_keys("bank-a")
    assert old_key not in setting.keyring.read_bytes()
    row = setting.vault.state(kept.record_id)
    assert row is not None and row.subject_hash not in (None, old_hash)
    assert [r.record_id for r in setting.vault.rows("bank-a", "frank")] == [kept.record_id]
    with pytest.raises(ContentErasedError):
        setting.vault.decrypt(erased.record_id)


def test_files_holding_keys_and_content_are_owner_only(setting: Setting,
                                                       ledger_url: str) -> None:
    setting.keep(80)
    setting.vault.erase(setting.ledger, "bank-a", subject="alice", requested_by="cli:dpo")
    assert stat.S_IMODE(os.stat(setting.keyring).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(setting.keyring.parent).st_mode) == 0o700
    # Written by rename from a private temporary file: no copy of the keys is left.
    assert sorted(p.name for p in setting.keyring.parent.iterdir()) == [
        "vault.keyring", "vault.keyring.lock"]
    database = sqlite_path(ledger_url)
    if database is not None:
        for suffix in ("", "-wal", "-shm"):
            path = Path(f"{database}{suffix}")
            assert path.exists() and stat.S_IMODE(path.stat().st_mode) == 0o600, path
