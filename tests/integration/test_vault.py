"""The content vault on real SQLite and PostgreSQL: audited reads, tampering, erasure by
crypto-shredding (proofs still hold), legal holds, expiry on an injected clock, rotation."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import MetaData, select, text, update

from ledger.anchor.local import LocalAnchor
from ledger.checkpoint import NoteSigner
from ledger.client.database import DatabaseSource
from ledger.client.sources import gather
from ledger.digest import commit_text, new_salt
from ledger.errors import BackendUnavailableError, InvalidInputError
from ledger.leaves.content_leaves import ACCESS_KIND, ERASURE_KIND
from ledger.record import AuditRecord, build_record
from ledger.store.fsck import fsck
from ledger.store.keyring import FileKeyring
from ledger.store.migrate import upgrade
from ledger.store.schema import vault_content
from ledger.store.sql import SqlLedger
from ledger.store.vault import Accessor, ContentVault, RetainItem
from ledger.vault_errors import (
    ContentErasedError,
    ContentIntegrityError,
    ContentNotRetainedError,
    KeyUnavailableError,
    LegalHoldError,
)
from ledger.verify import Disclosure, TrustPolicy, Verdict, verify_record
from tests.integration.conftest import ORIGIN
from tests.live_service import ROOT

AUDITOR = Accessor("key-auditor-1", "auditor", "audit-firm")
CREATED = "2026-06-01T09:00:00.000Z"


@dataclass
class Kept:
    record: AuditRecord
    item: RetainItem


@dataclass
class World:
    ledger: SqlLedger
    vault: ContentVault
    signer: NoteSigner
    keyring_path: Path

    def keep(self, i: int, tenant: str = "bank-a", subject: str | None = None) -> Kept:
        prompt, output = f"prompt {i}: may I see account {1000 + i}?", f"answer {i}: yes"
        input_salt, output_salt = new_salt(), new_salt()
        record = build_record(
            tenant=tenant, model={"name": "tiny"}, hardware={}, software={},
            data={"input_commitment": commit_text(input_salt, prompt),
                  "output_commitment": commit_text(output_salt, output)},
            timings_ms={"forward": 1.0}, created_at=CREATED)
        receipt = self.ledger.append(record)
        item = RetainItem(record.record_id, receipt.leaf_hash, tenant, record.created_at,
                          prompt, output, input_salt, output_salt, subject)
        self.vault.retain([item])
        return Kept(record, item)

    def verify(self, record_id: str, disclosure: Disclosure | None = None) -> Verdict:
        """Seal, anchor locally, then run checks 1-5 from the database's evidence."""
        sealed = self.ledger.seal_checkpoint(self.signer, ORIGIN)
        if sealed is not None:
            LocalAnchor(self.ledger, self.signer.verifier(), ORIGIN).anchor(sealed.note)
        evidence = gather(DatabaseSource(self.ledger), record_id, None)
        # The local anchor is all there is here: accept it explicitly (self-anchored).
        return verify_record(evidence, self.signer.verifier(), ORIGIN, disclosure=disclosure,
                             policy=TrustPolicy(accept_self_anchored=True))


@pytest.fixture()
def world(ledger_url: str, signer: NoteSigner, tmp_path: Path) -> Iterator[World]:
    yield from _world(ledger_url, signer, tmp_path)


@pytest.fixture()
def pg_world(make_pg_database: Callable[[], str], signer: NoteSigner,
             tmp_path: Path) -> Iterator[World]:
    url = make_pg_database()
    upgrade(url)
    yield from _world(url, signer, tmp_path)


def _world(ledger_url: str, signer: NoteSigner, tmp_path: Path) -> Iterator[World]:
    ledger = SqlLedger(ledger_url).start()
    # As a served log has (access and erasure leaves are tagged for its origin).
    ledger.create_log_meta(ORIGIN, signer.verifier().encode())
    keyring_path = tmp_path / "home" / "vault.keyring"
    vault = ContentVault(ledger_url, FileKeyring(keyring_path), minimum_days=183,
                         policy_cache_s=0.0)
    vault.set_policy("bank-a", "content", 183)
    yield World(ledger, vault, signer, keyring_path)
    vault.close()
    ledger.close()


def _passed(verdict: Verdict, *numbers: int) -> bool:
    return all(c.passed is True for c in verdict.checks if c.number in numbers)


def test_auditor_read_is_logged_first_and_opens_the_commitments(world: World) -> None:
    kept = world.keep(1)
    size_before = world.ledger.tree_head()[0]
    result = world.vault.read_audited(world.ledger, kept.record.record_id, AUDITOR,
                                      "MiFID II record-keeping review", "cli")
    assert world.ledger.tree_head()[0] == size_before + 1
    assert result.access_leaf_index == size_before
    assert (result.content.prompt, result.content.output) == (kept.item.prompt,
                                                              kept.item.output)
    # The access leaf is in the log, names who, which, why, and verifies (checks 1-4).
    row = world.ledger.get_record(result.access_record_id)
    assert row is not None and row.leaf_index == result.access_leaf_index
    leaf = json.loads(row.leaf_body)
    assert leaf["schema"] == ACCESS_KIND and leaf["tenant"] == "bank-a"
    assert leaf["access"] == {
        "record_id": kept.record.record_id, "channel": "cli",
        "purpose": "MiFID II record-keeping review",
        "accessor": {"key_id": "key-auditor-1", "role": "auditor", "tenant": "audit-firm"}}
    assert world.verify(result.access_record_id).ok
    # The decrypted content and salts open the record's commitments (check 5).
    opened = world.verify(kept.record.record_id, Disclosure(
        result.content.prompt, result.content.input_salt, result.content.output,
        result.content.output_salt))
    assert opened.ok and _passed(opened, 5)


def test_commitments_only_tenant_keeps_nothing(world: World) -> None:
    kept = world.keep(2, tenant="bank-b")  # bank-b has no policy: the default, commitments
    assert world.vault.policy("bank-b").mode == "commitments"
    assert world.vault.state(kept.record.record_id) is None
    size = world.ledger.tree_head()[0]
    with pytest.raises(ContentNotRetainedError) as caught:
        world.vault.read_audited(world.ledger, kept.record.record_id, AUDITOR, "review", "cli")
    assert caught.value.record_id == kept.record.record_id
    assert world.ledger.tree_head()[0] == size  # nothing to read, nothing logged


def test_may_keep_content_answers_false_only_from_fresh_commitments_policies(
        ledger_url: str, tmp_path: Path) -> None:
    # What the batcher asks on the event loop before handing a batch to retain: memory
    # only, and "no" only when it knows every tenant keeps commitments alone.
    vault = ContentVault(ledger_url, FileKeyring(tmp_path / "vault.keyring"),
                         policy_cache_s=3600.0)
    try:
        vault.set_policy("bank-a", "content", 183)
        assert vault.may_keep_content(["bank-b"]) is True  # not read yet: unknown
        assert vault.policy("bank-b").mode == "commitments"
        assert vault.may_keep_content(["bank-b"]) is False
        assert vault.may_keep_content(["bank-b", "bank-a"]) is True  # bank-a not read yet
        assert vault.policy("bank-a").mode == "content"
        assert vault.may_keep_content(["bank-a"]) is True
        vault.set_policy("bank-b", "content", 183)  # a change here drops the cached entry
        assert vault.may_keep_content(["bank-b"]) is True
        vault.policy_cache_s = 0.0  # every cached entry is stale at once
        vault.set_policy("bank-b", "commitments")
        assert vault.policy("bank-b").mode == "commitments"
        assert vault.may_keep_content(["bank-b"]) is True
    finally:
        vault.close()


def test_a_policy_read_that_raced_a_change_is_answered_but_not_cached(
        ledger_url: str, tmp_path: Path) -> None:
    # set_policy commits after policy() has read the old row but before it caches it:
    # the old answer must not be kept as fresh for a whole cache period.
    vault = ContentVault(ledger_url, FileKeyring(tmp_path / "vault.keyring"),
                         policy_cache_s=3600.0)
    real = vault.engine

    class ChangeAfterRead:
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        @contextmanager
        def connect(self) -> Iterator[Any]:
            with real.connect() as conn:
                yield conn
            vault.engine = real  # once only
            vault.set_policy("bank-u", "content", 183)

    try:
        vault.engine = ChangeAfterRead()  # type: ignore[assignment]
        assert vault.policy("bank-u").mode == "commitments"  # what the read saw
        assert vault.may_keep_content(["bank-u"]) is True  # not cached
        assert vault.policy("bank-u").mode == "content"
    finally:
        vault.engine = real
        vault.close()


def test_policy_below_minimum_is_refused(world: World) -> None:
    with pytest.raises(InvalidInputError) as caught:
        world.vault.set_policy("bank-a", "content", 30)
    assert caught.value.field == "days"
    assert world.vault.policy("bank-a").days == 183


def test_tampered_ciphertext_in_the_database_is_named(world: World) -> None:
    kept = world.keep(3)
    with world.vault.engine.begin() as conn:
        blob = bytearray(conn.execute(select(vault_content.c.output_ct).where(
            vault_content.c.record_id == kept.record.record_id)).scalar_one())
        blob[20] ^= 0x40
        conn.execute(update(vault_content).where(
            vault_content.c.record_id == kept.record.record_id).values(output_ct=bytes(blob)))
    with pytest.raises(ContentIntegrityError) as caught:
        world.vault.read_audited(world.ledger, kept.record.record_id, AUDITOR, "review", "cli")
    assert (caught.value.record_id, caught.value.field) == (kept.record.record_id, "output")


def test_ciphertexts_swapped_between_records_are_named(world: World) -> None:
    first, second = world.keep(4), world.keep(5)
    columns = ("kek_id", "wrapped_key", "prompt_ct", "output_ct", "input_salt_ct",
               "output_salt_ct")
    with world.vault.engine.begin() as conn:
        rows = {r.record_id: r for r in conn.execute(select(vault_content))}
        for mine, theirs in ((first, second), (second, first)):
            source = rows[theirs.record.record_id]
            conn.execute(update(vault_content).where(
                vault_content.c.record_id == mine.record.record_id).values(
                **{c: getattr(source, c) for c in columns}))
    with pytest.raises(ContentIntegrityError) as caught:
        world.vault.decrypt(first.record.record_id)
    assert (caught.value.record_id, caught.value.field) == (first.record.record_id, "data_key")


def _all_stored_bytes(world: World) -> bytes:
    """Every value of every table of the database, and the keyring file, as one blob."""
    blob = bytearray(world.keyring_path.read_bytes())
    metadata = MetaData()
    metadata.reflect(world.vault.engine)
    with world.vault.engine.connect() as conn:
        for table in metadata.sorted_tables:
            for row in conn.execute(select(table)):
                for value in row:
                    if isinstance(value, bytes | bytearray | memoryview):
                        blob += bytes(value)
                    elif value is not None:
                        blob += str(value).encode()
    return bytes(blob)


def test_erasure_by_subject_shreds_keys_and_every_proof_still_holds(world: World) -> None:
    before = world.keep(10)
    erased = [world.keep(11, subject="alice"), world.keep(12, subject="alice")]
    kept_bob = world.keep(13, subject="bob")
    after = world.keep(14)
    for kept in [before, *erased, kept_bob, after]:
        assert world.verify(kept.record.record_id).ok
    size = world.ledger.tree_head()[0]

    erasure = world.vault.erase(world.ledger, "bank-a", subject="alice",
                                requested_by="cli:dpo")
    assert erasure.records == sorted(k.record.record_id for k in erased)
    assert erasure.leaf_index == size and world.ledger.tree_head()[0] == size + 1
    # The erasure leaf is in the log and verifies.
    leaf_row = world.ledger.get_record(str(erasure.erasure_record_id))
    assert leaf_row is not None
    leaf = json.loads(leaf_row.leaf_body)
    assert leaf["schema"] == ERASURE_KIND and leaf["erasure"]["selector"] == "subject"
    assert "alice" not in leaf_row.canonical.decode() + leaf_row.leaf_body.decode()
    assert world.verify(str(erasure.erasure_record_id)).ok
    # Checks 1-4 still pass for the erased records and their neighbours.
    for kept in [before, *erased, kept_bob, after]:
        verdict = world.verify(kept.record.record_id)
        assert verdict.ok and _passed(verdict, 1, 2, 3, 4), verdict.to_dict()
    # Content is gone, and says when and under which erasure record.
    for kept in erased:
        with pytest.raises(ContentErasedError) as caught:
            world.vault.read_audited(world.ledger, kept.record.record_id, AUDITOR, "review",
                                     "cli")
        assert caught.value.erasure_record_id == erasure.erasure_record_id
        row = world.vault.state(kept.record.record_id)
        assert row is not None and row.erased_at is not None
    # Nothing stored can open the commitments: no salt, no text, no key or ciphertext.
    stored = _all_stored_bytes(world)
    for kept in erased:
        for secret in (kept.item.input_salt, kept.item.output_salt,
                       kept.item.input_salt.hex().encode(), kept.item.prompt.encode()):
            assert secret not in stored
    with world.vault.engine.connect() as conn:
        leftovers = conn.execute(select(vault_content).where(
            vault_content.c.erasure_record_id == erasure.erasure_record_id)).all()
    assert len(leftovers) == 2
    assert all(r.wrapped_key is None and r.prompt_ct is None and r.output_salt_ct is None
               for r in leftovers)
    # fsck recomputes every leaf, node, root and checkpoint from the stored bytes.
    report = fsck(world.ledger, world.signer.verifier())
    assert report.ok, report
    # Bob's content is untouched.
    assert world.vault.decrypt(kept_bob.record.record_id)[1].prompt == kept_bob.item.prompt
    # Erasing again finds nothing left and appends nothing.
    again = world.vault.erase(world.ledger, "bank-a", subject="alice", requested_by="cli:dpo")
    assert again.records == [] and world.ledger.tree_head()[0] == size + 1


def test_legal_hold_blocks_erasure_until_released(world: World) -> None:
    kept = world.keep(20, subject="carol")
    other = world.keep(21)
    tenant_hold = world.vault.hold("bank-a", "litigation 2026-17")
    size = world.ledger.tree_head()[0]
    with pytest.raises(LegalHoldError) as caught:
        world.vault.erase(world.ledger, "bank-a", subject="carol", requested_by="cli:dpo")
    assert caught.value.hold_id == tenant_hold.hold_id
    assert "litigation 2026-17" in str(caught.value)
    world.vault.release(tenant_hold.hold_id)
    record_hold = world.vault.hold("bank-a", "regulator inquiry", record_id=kept.record.record_id)
    with pytest.raises(LegalHoldError) as caught:
        world.vault.erase(world.ledger, "bank-a", record_ids=[kept.record.record_id],
                          requested_by="cli:dpo")
    assert caught.value.hold_id == record_hold.hold_id
    assert world.ledger.tree_head()[0] == size  # refused: nothing appended, nothing erased
    assert world.vault.decrypt(kept.record.record_id)[1].prompt == kept.item.prompt
    # A hold on one record does not block erasing another.
    done = world.vault.erase(world.ledger, "bank-a", record_ids=[other.record.record_id],
                             requested_by="cli:dpo")
    assert done.records == [other.record.record_id]
    world.vault.release(record_hold.hold_id)
    assert world.vault.erase(world.ledger, "bank-a", record_ids=[kept.record.record_id],
                             requested_by="cli:dpo").records == [kept.record.record_id]


def test_erasure_of_unknown_or_foreign_record_is_refused(world: World) -> None:
    kept = world.keep(22)
    with pytest.raises(ContentNotRetainedError):
        world.vault.erase(world.ledger, "bank-b", record_ids=[kept.record.record_id],
                          requested_by="cli:dpo")
    with pytest.raises(InvalidInputError) as caught:
        world.vault.erase(world.ledger, "bank-a", requested_by="cli:dpo")
    assert caught.value.field == "selector"


def test_expiry_on_an_injected_clock_erases_only_what_is_due_and_not_held(
        world: World) -> None:
    due, held = world.keep(30), world.keep(31)
    hold = world.vault.hold("bank-a", "audit", record_id=held.record.record_id)
    created = datetime(2026, 6, 1, 9, 0)
    erasures, kept_by = world.vault.expire(world.ledger, now=created + timedelta(days=182))
    assert erasures == [] and world.vault.decrypt(due.record.record_id)
    erasures, kept_by = world.vault.expire(world.ledger, now=created + timedelta(days=183))
    assert [e.records for e in erasures] == [[due.record.record_id]]
    assert [h.hold_id for h in kept_by] == [hold.hold_id]
    with pytest.raises(ContentErasedError):
        world.vault.decrypt(due.record.record_id)
    assert world.vault.decrypt(held.record.record_id)[1].output == held.item.output
    leaf_row = world.ledger.get_record(str(erasures[0].erasure_record_id))
    assert leaf_row is not None
    body = json.loads(leaf_row.leaf_body)
    assert body["erasure"]["reason"] == "expiry"
    assert world.verify(due.record.record_id).ok


def test_kek_rotation_keeps_content_readable_and_ciphertexts_untouched(world: World) -> None:
    kept = [world.keep(40 + i) for i in range(3)]
    with world.vault.engine.connect() as conn:
        before = {r.record_id: r for r in conn.execute(select(vault_content))}
    old_kek = world.vault.keks.current_kek_id("bank-a")
    new_kek, count, retired = world.vault.rotate("bank-a", batch=2)
    assert count == 3 and retired == [old_kek] and new_kek != old_kek
    with world.vault.engine.connect() as conn:
        after = {r.record_id: r for r in conn.execute(select(vault_content))}
    for record_id, row in after.items():
        assert row.kek_id == new_kek and row.wrapped_key != before[record_id].wrapped_key
        assert row.prompt_ct == before[record_id].prompt_ct
        assert row.output_salt_ct == before[record_id].output_salt_ct
    for item in kept:
        assert world.vault.decrypt(item.record.record_id)[1].prompt == item.item.prompt
    # Another process's keyring (a fresh load of the file) sees the new KEK only.
    fresh = FileKeyring(world.keyring_path)
    assert fresh.current_kek_id("bank-a") == new_kek
    with pytest.raises(KeyUnavailableError):
        fresh.unwrap("bank-a", old_kek, before[kept[0].record.record_id].wrapped_key, b"")


def test_keyring_file_is_private(world: World) -> None:
    world.keep(50)
    mode = stat.S_IMODE(os.stat(world.keyring_path).st_mode)
    assert mode == 0o600
    assert b"prompt 50" not in world.keyring_path.read_bytes()


def test_vault_tables_never_reach_the_mirror(world: World) -> None:
    kept = world.keep(60, subject="dave")
    row = world.ledger.get_record(kept.record.record_id)
    assert row is not None
    assert kept.item.prompt.encode() not in row.canonical
    with world.vault.engine.connect() as conn:
        names = {r[0] for r in conn.execute(text(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'records'"
            if world.ledger.is_postgres else "SELECT name FROM pragma_table_info('records')"))}
    assert not {"prompt", "subject_hash", "prompt_ct"} & names


def test_access_leaf_is_durable_before_any_decryption(world: World) -> None:
    kept = world.keep(70)
    events: list[str] = []
    decrypt = world.vault.decrypt

    class Journal:
        def append(self, record: AuditRecord, timeout: float | None = 60.0) -> object:
            receipt = world.ledger.append(record, timeout)
            # Committed: a fresh connection sees the leaf before anything is decrypted.
            assert world.ledger.get_record(record.record_id) is not None
            events.append("append committed")
            return receipt

    def spying_decrypt(record_id: str) -> object:
        events.append("decrypt")
        return decrypt(record_id)

    world.vault.decrypt = spying_decrypt  # type: ignore[method-assign,assignment]
    world.vault.read_audited(Journal(), kept.record.record_id, AUDITOR, "ordering", "http")
    assert events == ["append committed", "decrypt"]


def test_no_content_when_the_access_leaf_cannot_be_committed(world: World) -> None:
    kept = world.keep(71)
    world.ledger.close()  # appends now fail: the log cannot take the access leaf
    decrypted: list[str] = []
    world.vault.decrypt = lambda record_id: decrypted.append(record_id)  # type: ignore[method-assign,assignment,func-returns-value]
    with pytest.raises(BackendUnavailableError):
        world.vault.read_audited(world.ledger, kept.record.record_id, AUDITOR, "outage", "cli")
    assert decrypted == []


def _cli(world: World, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "audit_cli.main", *args], cwd=ROOT, capture_output=True,
        text=True, timeout=300)


def test_operator_commands_read_expire_and_rotate(world: World) -> None:
    kept = world.keep(85)
    vault = ("--db", world.ledger.url, "--keyring", str(world.keyring_path))
    read = _cli(world, "content", kept.record.record_id, "--purpose", "complaint 4411", *vault)
    assert read.returncode == 0, read.stderr
    assert kept.item.prompt in read.stdout
    assert "[PASS] 5. prompt and output open their commitments" in read.stdout
    leaf_id = read.stdout.split("access record ")[1].split()[0]
    row = world.ledger.get_record(leaf_id)
    assert row is not None
    accessor = json.loads(row.leaf_body)["access"]["accessor"]
    assert accessor["role"] == "operator" and accessor["key_id"].startswith("local:")

    rotated = _cli(world, "retention", *vault, "--json", "rotate-key", "--tenant", "bank-a")
    assert rotated.returncode == 0, rotated.stderr
    assert json.loads(rotated.stdout)["rewrapped"] == 1
    assert world.vault.decrypt(kept.record.record_id)[1].output == kept.item.output

    future = _cli(world, "retention", *vault, "--json", "expire", "--now",
                  "2100-01-01T00:00:00Z")
    assert future.returncode == 2 and '"field": "now"' in future.stdout
    assert "later than this clock" in future.stdout
    assert world.vault.decrypt(kept.record.record_id)[1].output == kept.item.output
    early = _cli(world, "retention", *vault, "--json", "expire", "--now",
                 "2026-11-30T00:00:00Z")
    assert early.returncode == 0 and json.loads(early.stdout)["erasures"] == []
    late = _cli(world, "retention", *vault, "--json", "expire", "--now",
                "2026-12-01T09:00:00Z")
    assert late.returncode == 0, late.stderr
    assert json.loads(late.stdout)["erasures"][0]["records"] == [kept.record.record_id]
    gone = _cli(world, "content", kept.record.record_id, "--purpose", "again", *vault)
    assert gone.returncode == 1 and "was erased" in gone.stderr
    bad = _cli(world, "retention", *vault, "set", "--tenant", "bank-a", "--mode", "content",
               "--days", "10")
    assert bad.returncode == 2 and "days" in bad.stderr


def test_subject_report_lists_records_reads_and_erasures(world: World) -> None:
    mine = [world.keep(80, subject="erin"), world.keep(81, subject="erin")]
    other = world.keep(82, subject="frank")
    world.vault.read_audited(world.ledger, mine[0].record.record_id, AUDITOR, "complaint", "http")
    world.vault.read_audited(world.ledger, other.record.record_id, AUDITOR, "other", "http")
    erasure = world.vault.erase(world.ledger, "bank-a", record_ids=[mine[1].record.record_id],
                                requested_by="cli:dpo")
    done = _cli(world, "retention", "--db", world.ledger.url, "--keyring",
                str(world.keyring_path), "--json", "report", "--tenant", "bank-a",
                "--subject", "erin")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    # The erased record is no longer linked to its subject (its subject hash is gone).
    assert [r["record_id"] for r in report["records"]] == [mine[0].record.record_id]
    assert mine[1].record.record_id not in done.stdout
    assert erasure.erasure_record_id not in done.stdout
    assert [(r["record_id"], r["purpose"]) for r in report["reads"]] == [
        (mine[0].record.record_id, "complaint")]
    assert report["erasures"] == []


def test_one_replica_expires_at_a_time_on_postgresql(pg_world: World) -> None:
    from sqlalchemy import create_engine

    from ledger.store.vault import EXPIRY_LOCK_KEY

    due = pg_world.keep(90)
    later = datetime(2026, 6, 1, 9, 0) + timedelta(days=183)  # not in the future
    other = create_engine(pg_world.ledger.url)  # another replica, expiring right now
    with other.connect() as conn:
        conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": EXPIRY_LOCK_KEY})
        assert pg_world.vault.expire(pg_world.ledger, now=later) == ([], [])
        assert pg_world.vault.decrypt(due.record.record_id)[1].prompt == due.item.prompt
        conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": EXPIRY_LOCK_KEY})
    other.dispose()
    erasures, _ = pg_world.vault.expire(pg_world.ledger, now=later)
    assert [e.records for e in erasures] == [[due.record.record_id]]
