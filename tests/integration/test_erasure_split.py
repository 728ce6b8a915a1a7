"""Large erasures on SQLite and PostgreSQL (decision 0061): an erasure naming more records
than one leaf's body can carry in a tile bundle is logged in several leaves, the tiles
publish, and verify, audit and fsck still pass; one tenant whose expiry fails does not
stop the others."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert

from ledger.anchor.local import LocalAnchor
from ledger.checkpoint import NoteSigner
from ledger.client.database import DatabaseSource
from ledger.client.sources import gather
from ledger.digest import commit_text, new_salt
from ledger.leaves.content_leaves import ERASURE_KIND, RECORDS_PER_ERASURE_LEAF
from ledger.publish.directory import DirectorySink
from ledger.publish.publisher import publish
from ledger.record import build_record
from ledger.store.keyring import FileKeyring
from ledger.store.receipts import ReceiptStore
from ledger.store.schema import retention_policies
from ledger.store.sql import SqlLedger
from ledger.store.vault import ContentVault, RetainItem
from ledger.tiles import CHECKPOINT_PATH, MAX_ENTRY_BYTES
from ledger.verify import TrustPolicy, verify_record
from tests.cli_runs import cli_json
from tests.integration.conftest import ORIGIN

# One busy tenant's day of records: in one leaf, a body of 66,540 bytes, which no tile
# bundle entry (16-bit length) can carry; the old vault logged it and publishing stopped.
BUSY = 1_700
OLD = (datetime.now(UTC) - timedelta(days=200)).isoformat(
    timespec="milliseconds").replace("+00:00", "Z")  # past the 183-day retention


@dataclass
class Log:
    ledger: SqlLedger
    vault: ContentVault
    signer: NoteSigner
    url: str

    def keep(self, tenant: str, count: int, subject: str | None = None) -> list[str]:
        """``count`` records of ``tenant`` appended together, their content retained."""
        salts = [(new_salt(), new_salt()) for _ in range(count)]
        records = [build_record(
            tenant=tenant, model={"name": "tiny"}, hardware={}, software={},
            data={"input_commitment": commit_text(i_salt, f"prompt {i}"),
                  "output_commitment": commit_text(o_salt, "answer")},
            timings_ms={"forward": 1.0}, created_at=OLD)
            for i, (i_salt, o_salt) in enumerate(salts)]
        receipts = asyncio.run(self.ledger.append_many_async(records))
        items = []
        for i, (record, receipt, (i_salt, o_salt)) in enumerate(
                zip(records, receipts, salts, strict=True)):
            assert not isinstance(receipt, BaseException)
            items.append(RetainItem(record.record_id, receipt.leaf_hash, tenant,
                                    record.created_at, f"prompt {i}", "answer", i_salt,
                                    o_salt, subject))
        self.vault.retain(items)
        return [r.record_id for r in records]

    def body(self, record_id: str) -> bytes:
        row = self.ledger.get_record(record_id)
        assert row is not None and row.leaf_body is not None
        return bytes(row.leaf_body)


@pytest.fixture()
def log(ledger_url: str, signer: NoteSigner, tmp_path: Path) -> Iterator[Log]:
    ledger = SqlLedger(ledger_url).start()
    ledger.create_log_meta(ORIGIN, signer.verifier().encode())
    vault = ContentVault(ledger_url, FileKeyring(tmp_path / "home" / "vault.keyring"),
                         policy_cache_s=0.0)
    for tenant in ("bank-a", "bank-b"):
        vault.set_policy(tenant, "content", 183)
    yield Log(ledger, vault, signer, ledger_url)
    vault.close()
    ledger.close()


def _publish_verify_audit_fsck(log: Log, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                               erasure_ids: tuple[str, ...]) -> None:
    """The whole log's tiles publish (checkpoint last), every erasure leaf verifies, and
    audit and fsck recompute every row and node."""
    sealed = log.ledger.seal_checkpoint(log.signer, ORIGIN)
    assert sealed is not None
    LocalAnchor(log.ledger, log.signer.verifier(), ORIGIN).anchor(sealed.note)
    sink = tmp_path / "tiles"
    published = publish(log.ledger.tiles, sealed.note, DirectorySink(sink))
    assert published.size == log.ledger.tree_head()[0]
    assert (sink / CHECKPOINT_PATH).read_bytes() == sealed.note
    for erasure_id in erasure_ids:
        verdict = verify_record(gather(DatabaseSource(log.ledger), erasure_id, None),
                                log.signer.verifier(), ORIGIN,
                                policy=TrustPolicy(accept_self_anchored=True))
        assert verdict.ok, verdict.to_dict()
    key = log.signer.verifier().encode()
    code, out = cli_json(capsys, "audit", "--db", log.url, "--from", "2000-01-01T00:00:00Z",
                         "--to", "2100-01-01T00:00:00Z", "--log-key", key, "--no-state")
    assert code == 0 and out["complete"], out
    code, out = cli_json(capsys, "log", "fsck", "--db", log.url, "--log-key", key)
    assert code == 0 and out["ok"], out


def _named(log: Log, erasure_ids: tuple[str, ...]) -> list[list[str]]:
    """The records each erasure leaf names, in the order the vault logged them."""
    parts = []
    for erasure_id in erasure_ids:
        body = log.body(erasure_id)
        assert len(body) <= MAX_ENTRY_BYTES
        content: dict[str, Any] = json.loads(body)
        assert content["schema"] == ERASURE_KIND
        parts.append(content["erasure"]["records"])
    return parts


def test_a_busy_tenants_expiry_is_logged_in_leaves_its_tiles_can_publish(
        log: Log, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    busy, other = log.keep("bank-a", BUSY), log.keep("bank-b", 2)
    size = log.ledger.tree_head()[0]
    erasures, held = log.vault.expire(log.ledger)
    assert held == [] and log.vault.expiry_failures == {}
    (erasure,) = [e for e in erasures if e.tenant == "bank-a"]
    assert erasure.records == sorted(busy)
    leaves = -(-BUSY // RECORDS_PER_ERASURE_LEAF)
    assert len(erasure.erasure_record_ids) == leaves == 9
    assert erasure.erasure_record_id == erasure.erasure_record_ids[0]
    assert erasure.leaf_index == erasure.leaf_indexes[0]
    parts = _named(log, erasure.erasure_record_ids)
    assert sum(parts, []) == sorted(busy)  # each record in exactly one leaf, in order
    assert all(len(p) <= RECORDS_PER_ERASURE_LEAF for p in parts)
    for erasure_id, index in zip(erasure.erasure_record_ids, erasure.leaf_indexes,
                                 strict=True):
        row = log.ledger.get_record(erasure_id)
        assert row is not None and row.leaf_index == index and index >= size
    # Each erased row names the leaf that names it.
    for erasure_id, part in zip(erasure.erasure_record_ids, parts, strict=True):
        for record_id in part[:3] + part[-3:]:
            row = log.vault.state(record_id)
            assert row is not None and row.erased_at is not None
            assert row.erasure_record_id == erasure_id
    (small,) = [e for e in erasures if e.tenant == "bank-b"]
    assert small.records == sorted(other) and len(small.erasure_record_ids) == 1
    _publish_verify_audit_fsck(log, tmp_path, capsys, erasure.erasure_record_ids)


def test_erasing_a_heavy_subject_is_logged_in_leaves_its_tiles_can_publish(
        log: Log, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    heavy, kept = log.keep("bank-a", BUSY, subject="heavy-user"), log.keep("bank-a", 1)
    erasure = log.vault.erase(log.ledger, "bank-a", subject="heavy-user",
                              requested_by="cli:dpo")
    assert erasure.records == sorted(heavy) and len(erasure.leaf_indexes) == 9
    assert sum(_named(log, erasure.erasure_record_ids), []) == sorted(heavy)
    assert log.vault.decrypt(kept[0])[1].output == "answer"
    _publish_verify_audit_fsck(log, tmp_path, capsys, erasure.erasure_record_ids)


def test_a_large_erasures_leaves_are_committed_in_one_transaction(log: Log) -> None:
    """All of an erasure's leaves or none: appended one by one, a crash between two
    commits logged part of it, and an expiry of 100,000 records took 500 commits."""
    heavy = log.keep("bank-a", 2 * RECORDS_PER_ERASURE_LEAF + 1, subject="heavy-user")
    before = log.ledger.groups_committed
    erasure = log.vault.erase(log.ledger, "bank-a", subject="heavy-user",
                              requested_by="cli:dpo")
    assert erasure.records == sorted(heavy) and len(erasure.leaf_indexes) == 3
    assert log.ledger.groups_committed - before == 1
    assert list(erasure.leaf_indexes) == list(range(erasure.leaf_indexes[0],
                                                    erasure.leaf_indexes[0] + 3))


def _legacy_tenant(log: Log) -> str:
    """A tenant whose content was kept before tenant names followed the leaf rule
    (decision 0063): its policy row is as an older release wrote it. Its erasure leaf
    is refused (CanonicalFormError), before anything is logged."""
    refused = "Acme\u00a0Bank"  # a no-break space: not printable
    with log.vault.engine.begin() as conn:
        conn.execute(insert(retention_policies).values(
            tenant=refused, mode="content", days=183, updated_at=datetime(2026, 1, 1)))
    return refused


def test_a_tenant_whose_expiry_fails_does_not_stop_the_others(
        log: Log, caplog: pytest.LogCaptureFixture) -> None:
    refused = _legacy_tenant(log)
    stuck, due = log.keep(refused, 2), log.keep("bank-b", 2)
    size = log.ledger.tree_head()[0]
    with caplog.at_level(logging.ERROR, logger="audit_ledger.vault"):
        erasures, _ = log.vault.expire(log.ledger)
    assert [(e.tenant, e.records) for e in erasures] == [("bank-b", sorted(due))]
    assert all(log.vault.state(r).erased_at is not None for r in due)  # type: ignore[union-attr]
    assert all(log.vault.state(r).erased_at is None for r in stuck)  # type: ignore[union-attr]
    assert log.ledger.tree_head()[0] == size + 1  # bank-b's one leaf, nothing of the other
    # The failure surfaces (status), and the log line holds the class, not the content.
    assert log.vault.expiry_failures == {refused: "CanonicalFormError"}
    (line,) = [r.getMessage() for r in caplog.records]
    assert "CanonicalFormError" in line and refused not in line and stuck[0] not in line
    # The next run tries it again (and says so again).
    log.vault.expire(log.ledger)
    assert log.vault.expiry_failures == {refused: "CanonicalFormError"}


def test_the_expire_command_names_a_failed_tenant_and_exits_1(
        log: Log, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    refused = _legacy_tenant(log)
    log.keep(refused, 1)
    due = log.keep("bank-b", 1)
    code, out = cli_json(capsys, "retention", "--db", log.url, "--keyring",
                         str(tmp_path / "home" / "vault.keyring"), "expire")
    assert code == 1, out
    assert out["failed"] == [{"tenant": refused, "error": "CanonicalFormError"}]
    assert [e["records"] for e in out["erasures"]] == [due]


def test_a_hold_during_a_large_erasure_cancels_every_leaf(log: Log) -> None:
    from ledger.vault_errors import LegalHoldError

    heavy = log.keep("bank-a", RECORDS_PER_ERASURE_LEAF + 1, subject="heavy-user")
    appended: list[dict[str, Any]] = []
    holds: list[str] = []

    class HoldAfterTheLeaves:
        """The ledger, placing a hold once the erasure's leaves are committed."""

        def append(self, leaf: Any, timeout: float | None = 60.0) -> Any:
            return self.append_many([leaf], timeout)[0]

        def append_many(self, leaves: Any, timeout: float | None = 60.0) -> list[Any]:
            outcomes = log.ledger.append_many(leaves, timeout)
            appended.extend(dict(leaf.content) for leaf in leaves)
            if len(appended) == 2:
                holds.append(log.vault.hold("bank-a", "regulator inquiry 45").hold_id)
            return outcomes

    with pytest.raises(LegalHoldError):
        log.vault.erase(HoldAfterTheLeaves(), "bank-a", subject="heavy-user",
                        requested_by="cli:dpo")
    first, second, *cancels = appended
    assert [c["erasure"]["cancels"] for c in cancels] == [first["record_id"],
                                                            second["record_id"]]
    assert [c["erasure"]["records"] for c in cancels] == [first["erasure"]["records"],
                                                           second["erasure"]["records"]]
    assert all(c["erasure"]["requested_by"] == f"hold:{holds[0]}" for c in cancels)
    assert all(log.vault.state(r).erased_at is None for r in heavy)  # type: ignore[union-attr]


def test_a_large_erasure_turns_every_stored_answer_into_a_410(log: Log) -> None:
    heavy = log.keep("bank-a", RECORDS_PER_ERASURE_LEAF + 1, subject="heavy-user")
    store = ReceiptStore(log.ledger.engine, keks=log.vault.keks)
    last = max(heavy)  # named by the erasure's second leaf (ids are sorted)
    assert store.claim("bank-a", "k-last", b"\0" * 32, 600.0, "me") is None
    assert store.complete("bank-a", "k-last", "me", {
        "body": {"record_id": last, "output": "answer"},
        "headers": {"X-Audit-Record-Id": last}})
    erasure = log.vault.erase(log.ledger, "bank-a", subject="heavy-user",
                              requested_by="cli:dpo")
    found = store.get("bank-a", "k-last")
    assert found is not None and found.state == "done" and found.response is not None
    problem = found.response["problem"]
    assert (problem["status"], problem["code"], problem["record_id"]) == (
        410, "content_erased", last)
    assert erasure.erasure_record_ids[1] in json.dumps(problem)
