"""An erased prompt is not recoverable from the receipts table, and an erased key is no
oracle (decision 0062).

The attack: a client sends "my PIN is 7236" with an Idempotency-Key; the content is
erased by subject. Whoever holds the database (a dump, a backup) but not the key store
tries the 10,000 PINs against what the receipt row stores; a client retrying the key
with guessed bodies watches for a 410 instead of a 422.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import make_mocked_request
from cryptography.exceptions import InvalidTag
from sqlalchemy import create_engine, insert, select, text

from inference_wrapper.server.idempotency import HEADER, Idempotency, fingerprint
from inference_wrapper.server.problems import CommittedProblem, Problem
from ledger.digest import commit_text, new_salt
from ledger.record import build_record
from ledger.store.keyring import FileKeyring
from ledger.store.migrate import upgrade
from ledger.store.receipts import ReceiptStore
from ledger.store.schema import receipts
from ledger.store.sql import SqlLedger
from ledger.store.vault import ContentVault, RetainItem
from ledger.vault_crypto import open_receipt_key, receipt_fingerprint, receipt_fingerprint_under
from ledger.vault_errors import KeyUnavailableError
from tests.integration.conftest import ORIGIN

ROUTE = "/v1/completions"
# Old enough that no legal basis is needed (outside the 183-day minimum retention).
CREATED = (datetime.now(UTC) - timedelta(days=200)).isoformat(timespec="milliseconds"
                                                              ).replace("+00:00", "Z")


@dataclass
class Setting:
    ledger: SqlLedger
    vault: ContentVault
    store: ReceiptStore

    def keep(self, key: str, prompt: str, subject: str) -> str:
        """A generate answered under ``key``, its content retained for ``subject``, as
        the service stores both; returns its record id."""
        output, input_salt, output_salt = "ok", new_salt(), new_salt()
        record = build_record(
            tenant="bank-a", model={"name": "tiny"}, hardware={}, software={},
            data={"input_commitment": commit_text(input_salt, prompt),
                  "output_commitment": commit_text(output_salt, output)},
            timings_ms={"forward": 1.0}, created_at=CREATED)
        receipt = self.ledger.append(record)
        self.vault.retain([RetainItem(record.record_id, receipt.leaf_hash, "bank-a",
                                      record.created_at, prompt, output, input_salt,
                                      output_salt, subject)])
        mark = fingerprint(ROUTE, {"model": "tiny", "prompt": prompt})
        assert self.store.claim("bank-a", key, mark, 600.0, "owner") is None
        assert self.store.complete("bank-a", key, "owner", {
            "body": {"record_id": record.record_id, "output": output,
                     "input_salt": input_salt.hex()},
            "headers": {"X-Audit-Record-Id": record.record_id}})
        return record.record_id

    def stored_fingerprint(self, key: str) -> bytes | None:
        with self.ledger.engine.connect() as conn:
            value = conn.execute(select(receipts.c.fingerprint).where(
                receipts.c.idempotency_key == key)).scalar_one()
        return None if value is None else bytes(value)


@pytest.fixture()
def setting(ledger_url: str, tmp_path: Path) -> Iterator[Setting]:
    ledger = SqlLedger(ledger_url).start()
    vault = ContentVault(ledger_url, FileKeyring(tmp_path / "home" / "vault.keyring"),
                         policy_cache_s=0.0, origin=ORIGIN)
    vault.set_policy("bank-a", "content", 183)
    yield Setting(ledger, vault, ReceiptStore(ledger.engine, keks=vault.keks))
    vault.close()
    ledger.close()


def _guess_pin(stored: list[bytes | None]) -> str | None:
    """The reviewer's attack: every 4-digit PIN against every stored value."""
    held = {value for value in stored if value is not None}
    for pin in range(10_000):
        prompt = f"my PIN is {pin:04d}"
        if fingerprint(ROUTE, {"model": "tiny", "prompt": prompt}) in held:
            return prompt
    return None


def test_erased_pin_is_not_guessable_from_the_receipts_table(setting: Setting) -> None:
    setting.keep("k1", "my PIN is 7236", subject="alice")
    live = setting.stored_fingerprint("k1")
    setting.vault.erase(setting.ledger, "bank-a", subject="alice", requested_by="cli:dpo")
    erased = setting.stored_fingerprint("k1")
    # Neither the live row (a backup taken before the erasure) nor the erased one holds
    # anything the 10,000 guesses can be tested against without the key store.
    assert _guess_pin([live, erased]) is None
    assert live is not None and len(live) == 33  # under the receipt's own key (0068)
    assert erased is None


def _backup_row(setting: Setting, key: str) -> dict[str, Any]:
    with setting.ledger.engine.connect() as conn:
        row = conn.execute(select(receipts).where(
            receipts.c.idempotency_key == key)).one()
    return dict(row._mapping)


def _guess_pin_with_the_key_store(setting: Setting, row: dict[str, Any]) -> str | None:
    """The attack with a backup of the row from before the erasure AND today's key store:
    every MAC key the store can still give (each subject key, as 0062 keyed them; the
    receipt's own key, if its wrapped key still opens) against the 10,000 PINs."""
    keks, tenant, key = setting.vault.keks, "bank-a", row["idempotency_key"]
    stored = bytes(row["fingerprint"])
    macs: list[Callable[[bytes], bytes]] = [
        lambda digest, subject_key=subject_key: receipt_fingerprint(
            subject_key, tenant, key, digest) for subject_key in keks.subject_keys(tenant)]
    try:
        receipt_key = open_receipt_key(keks, tenant, key, str(row["kek_id"]),
                                       bytes(row["wrapped_key"]))
        macs.append(lambda digest: receipt_fingerprint_under(receipt_key, tenant, key,
                                                             digest))
    except (InvalidTag, KeyUnavailableError):
        pass  # its KEK is gone
    for pin in range(10_000):
        prompt = f"my PIN is {pin:04d}"
        digest = fingerprint(ROUTE, {"model": "tiny", "prompt": prompt})
        if any(hmac.compare_digest(mac(digest), stored) for mac in macs):
            return prompt
    return None


def test_a_backup_and_the_key_store_together_cannot_guess_an_erased_pin(
        setting: Setting) -> None:
    """0062 keyed the fingerprint with the tenant's subject key, which an erasure keeps:
    a backup from before the erasure plus today's key store found the PIN. The MAC is now
    under the receipt's own key, whose KEK the erasure destroys."""
    setting.keep("k1", "my PIN is 7236", subject="alice")
    bob = setting.keep("k2", "my PIN is 1111", subject="bob")  # shares k1's KEK
    backup = _backup_row(setting, "k1")
    assert _guess_pin_with_the_key_store(setting, backup) == "my PIN is 7236"  # before
    setting.vault.erase(setting.ledger, "bank-a", subject="alice", requested_by="cli:dpo")
    assert _guess_pin_with_the_key_store(setting, backup) is None
    # bob's receipt was re-wrapped under the new KEK: it still replays, and compares
    _replays_and_refuses(setting, "k2", bob, "my PIN is 1111", "my PIN is 2222")


def _answer(idempotency: Idempotency, key: str, body: dict[str, Any]) -> Any:
    request = make_mocked_request("POST", ROUTE, headers={HEADER: key})

    async def work() -> tuple[dict[str, Any], dict[str, str]]:
        raise AssertionError("a retry of a kept key must not generate")

    return asyncio.run(idempotency.answer(request, "bank-a", key, body, work))


def test_erased_key_answers_410_to_the_right_and_a_wrong_body_alike(
        setting: Setting) -> None:
    record_id = setting.keep("k1", "my PIN is 7236", subject="alice")
    setting.vault.erase(setting.ledger, "bank-a", subject="alice", requested_by="cli:dpo")
    idempotency = Idempotency(setting.store, timeout_s=5)
    for prompt in ("my PIN is 7236", "my PIN is 0000"):
        with pytest.raises(CommittedProblem) as gone:
            _answer(idempotency, "k1", {"model": "tiny", "prompt": prompt})
        assert (gone.value.status, gone.value.code, gone.value.record_id) == (
            410, "content_erased", record_id)


def _replays_and_refuses(setting: Setting, key: str, record_id: str, prompt: str,
                         other: str) -> None:
    """A retry of ``key`` with its own prompt replays its answer; with ``other``, 422."""
    idempotency = Idempotency(setting.store, timeout_s=5)
    again = _answer(idempotency, key, {"prompt": prompt, "model": "tiny"})
    assert again.status == 200 and again.headers["X-Audit-Record-Id"] == record_id
    with pytest.raises(Problem) as refused:
        _answer(idempotency, key, {"model": "tiny", "prompt": other})
    assert (refused.value.status, refused.value.field) == (422, HEADER)
    assert "different request body" in refused.value.detail


def test_a_live_key_replays_its_body_and_refuses_another_with_422(
        setting: Setting) -> None:
    record_id = setting.keep("k1", "my PIN is 7236", subject="alice")
    _replays_and_refuses(setting, "k1", record_id, "my PIN is 7236", "my PIN is 0000")
    # The same body under another key, or another tenant, stores another MAC: a reader
    # of the table cannot even tell that two requests were the same.
    setting.keep("k2", "my PIN is 7236", subject="bob")
    assert setting.stored_fingerprint("k1") != setting.stored_fingerprint("k2")


def test_after_a_subject_key_rotation_a_live_key_still_tells_bodies_apart(
        setting: Setting) -> None:
    """Its fingerprint is under the receipt's own key, not the rotated subject key: the
    same body replays its answer, another gets the 422 (0062 removed the fingerprint,
    and both got 422)."""
    record_id = setting.keep("k1", "transfer 10 EUR to Alice", subject="alice")
    setting.vault.rotate_subject_key("bank-a")
    assert setting.stored_fingerprint("k1") is not None
    _replays_and_refuses(setting, "k1", record_id, "transfer 10 EUR to Alice",
                         "transfer 9999 EUR to Mallory")


def test_after_a_subject_key_rotation_a_key_claimed_before_0068_replays_to_no_body(
        setting: Setting) -> None:
    """A fingerprint keyed by the subject key (claimed before 0068): its key is destroyed
    by the rotation, so no body can be compared, and its answer is never given to an
    unknown request ("transfer 9999 EUR to Mallory" once got k1's record)."""
    setting.keep("k1", "transfer 10 EUR to Alice", subject="alice")
    mark = fingerprint(ROUTE, {"model": "tiny", "prompt": "transfer 10 EUR to Alice"})
    with setting.ledger.engine.begin() as conn:  # as a claim before 0068 stored it
        conn.execute(receipts.update().where(receipts.c.idempotency_key == "k1").values(
            fingerprint=receipt_fingerprint(setting.vault.keks.subject_key("bank-a"),
                                            "bank-a", "k1", mark)))
    setting.vault.rotate_subject_key("bank-a")
    assert setting.stored_fingerprint("k1") is None
    idempotency = Idempotency(setting.store, timeout_s=5)
    for prompt in ("transfer 10 EUR to Alice", "transfer 9999 EUR to Mallory"):
        with pytest.raises(Problem) as refused:
            _answer(idempotency, "k1", {"model": "tiny", "prompt": prompt})
        assert (refused.value.status, refused.value.field) == (422, HEADER)
        assert "can no longer be compared" in refused.value.detail


def test_migration_removes_every_unkeyed_fingerprint(empty_url: str) -> None:
    """Rows written before 0014 hold a plain SHA-256 of route and body: erased and live
    ones alike lose it (they cannot be re-keyed without their bodies)."""
    upgrade(empty_url, "0013")
    engine = create_engine(empty_url)
    now = datetime.now(UTC).replace(tzinfo=None)
    with engine.begin() as conn:
        for key, state in (("erased", "done"), ("live", "done"), ("running", "pending")):
            conn.execute(insert(receipts).values(
                tenant="bank-a", idempotency_key=key, state=state, response=None,
                fingerprint=fingerprint(ROUTE, {"model": "tiny", "prompt": "my PIN is 7236"}),
                created_at=now, expires_at=now + timedelta(hours=1), owner="o"))
    upgrade(empty_url)
    with engine.connect() as conn:
        left = conn.execute(text("SELECT idempotency_key, fingerprint FROM receipts")).all()
    engine.dispose()
    assert sorted(left) == [("erased", None), ("live", None), ("running", None)]


def test_a_receipt_pending_while_its_record_is_erased_cannot_be_guessed_from_a_backup(
        setting: Setting) -> None:
    """Found by review: the erasure found receipts by the record ids they name, which a
    pending one does not yet name; with a KEK epoch between the claim and the content,
    the receipt's KEK survived, and a backup plus the key store found the PIN."""
    prompt = "my PIN is 7236"
    mark = fingerprint(ROUTE, {"model": "tiny", "prompt": prompt})
    assert setting.store.claim("bank-a", "k1", mark, 600.0, "owner") is None
    backup = _backup_row(setting, "k1")
    setting.vault.keks.rotate("bank-a")  # a new KEK epoch begins while it runs
    record_id = setting.keep("k2", prompt, subject="alice")  # the content, under it
    setting.vault.erase(setting.ledger, "bank-a", subject="alice", requested_by="cli:dpo")
    assert setting.store.complete("bank-a", "k1", "owner", {
        "body": {"record_id": record_id}, "headers": {"X-Audit-Record-Id": record_id}})
    assert _guess_pin_with_the_key_store(setting, backup) is None
    assert setting.stored_fingerprint("k1") is None  # its 410 answers any body


def test_a_same_body_retry_survives_a_rewrap_between_its_read_and_its_compare(
        setting: Setting) -> None:
    """Found by review: an erasure of another record re-wrapped the receipt's key and
    destroyed the KEK after the retry read the row; comparing with the stale row said
    "different body" (422) to the same body."""
    setting.keep("k0", "other", subject="bob")
    setting.keep("k1", "my PIN is 7236", subject="alice")
    mark = fingerprint(ROUTE, {"model": "tiny", "prompt": "my PIN is 7236"})
    held = setting.store.claim("bank-a", "k1", mark, 600.0, "second")
    assert held is not None
    setting.vault.erase(setting.ledger, "bank-a", subject="bob", requested_by="cli:dpo")
    assert setting.store.same_request("bank-a", "k1", held, mark)
    other = fingerprint(ROUTE, {"model": "tiny", "prompt": "my PIN is 0000"})
    assert not setting.store.same_request("bank-a", "k1", held, other)


def test_a_0062_fingerprint_starting_with_byte_2_still_matches_its_body(
        setting: Setting) -> None:
    """Found by review: the new form was told by its first byte alone, so one in 256 of
    the fingerprints claimed before 0068 refused their own body."""
    mark = fingerprint(ROUTE, {"model": "tiny", "prompt": "hello"})
    subject_key = setting.vault.keks.subject_key("bank-a")
    key, old = next((k, mac) for k in (f"key-{i}" for i in range(100_000))
                    if (mac := receipt_fingerprint(subject_key, "bank-a", k, mark))[:1]
                    == b"\x02")
    assert setting.store.claim("bank-a", key, mark, 600.0, "owner") is None
    with setting.ledger.engine.begin() as conn:  # as the code before 0068 stored it
        conn.execute(receipts.update().where(receipts.c.idempotency_key == key).values(
            fingerprint=old, kek_id=None, wrapped_key=None))
    held = setting.store.get("bank-a", key)
    assert held is not None and setting.store.same_request("bank-a", key, held, mark)
    assert setting.store.complete("bank-a", key, "owner", {"body": {"x": 1}, "headers": {}})
    held = setting.store.get("bank-a", key)
    assert held is not None and setting.store.same_request("bank-a", key, held, mark)


def test_a_pending_receipt_whose_key_opens_no_more_does_not_block_erasures(
        setting: Setting) -> None:
    """Found by review: erasures re-wrap pending receipts' keys, and one whose key no
    longer opened (a row restored from a backup taken before an erasure) made every
    erasure of the tenant fail with KeyUnavailableError, each after logging its leaf."""
    bob = setting.keep("k0", "other", subject="bob")
    mark = fingerprint(ROUTE, {"model": "tiny", "prompt": "pending"})
    assert setting.store.claim("bank-a", "p1", mark, 600.0, "owner") is None
    restored = _backup_row(setting, "p1")
    setting.keep("k2", "gone", subject="carol")
    setting.vault.erase(setting.ledger, "bank-a", subject="carol", requested_by="cli:dpo")
    with setting.ledger.engine.begin() as conn:  # the row as the old backup had it
        conn.execute(receipts.update().where(receipts.c.idempotency_key == "p1").values(
            kek_id=restored["kek_id"], wrapped_key=restored["wrapped_key"]))
    erasure = setting.vault.erase(setting.ledger, "bank-a", subject="bob",
                                  requested_by="cli:dpo")
    assert erasure.records == [bob]
    assert setting.stored_fingerprint("p1") is None  # nothing left to compare with


def test_a_retry_whose_record_is_erased_between_its_read_and_compare_gets_410(
        setting: Setting) -> None:
    """Found by review: the row was read, the record erased, and the compare with the
    stale row said "different body" (422) where the key now answers 410."""
    record_id = setting.keep("k1", "my PIN is 7236", subject="alice")
    idempotency = Idempotency(setting.store, timeout_s=5)
    read = setting.store.claim

    def claim_then_erase(*args: Any) -> Any:
        held = read(*args)
        setting.vault.erase(setting.ledger, "bank-a", subject="alice",
                            requested_by="cli:dpo")
        return held

    setting.store.claim = claim_then_erase  # type: ignore[method-assign]
    with pytest.raises(CommittedProblem) as gone:
        _answer(idempotency, "k1", {"model": "tiny", "prompt": "my PIN is 7236"})
    assert (gone.value.status, gone.value.record_id) == (410, record_id)


def test_the_kek_of_an_answer_stored_as_410_is_doomed(setting: Setting) -> None:
    """Found by review: a request running while its record was erased had its key
    re-wrapped under a KEK that lived on, so a backup taken before its answer was stored
    still gave the prompt; that KEK is now marked for the next erasure or rotation."""
    mark = fingerprint(ROUTE, {"model": "tiny", "prompt": "my PIN is 7236"})
    assert setting.store.claim("bank-a", "k1", mark, 600.0, "owner") is None
    record_id = setting.keep("k2", "my PIN is 7236", subject="alice")
    setting.keep("k3", "other", subject="bob")
    setting.vault.erase(setting.ledger, "bank-a", subject="alice", requested_by="cli:dpo")
    backup = _backup_row(setting, "k1")
    assert setting.store.complete("bank-a", "k1", "owner", {
        "body": {"record_id": record_id}, "headers": {"X-Audit-Record-Id": record_id}})
    assert str(backup["kek_id"]) in setting.vault.keks.doomed("bank-a")
    setting.vault.rotate("bank-a")  # the next rotation (or erasure) destroys it
    assert _guess_pin_with_the_key_store(setting, backup) is None
