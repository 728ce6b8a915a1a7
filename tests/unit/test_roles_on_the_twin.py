"""Floors above the store take a role, not the SQL ledger (decision 0042): the same code
runs on the in-memory twin. The cases here are the ones the SQL suites also run."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from inference_wrapper.server.journal import WatchedJournal
from inference_wrapper.server.replica import last_seal
from ledger.errors import DuplicateRecordError, LogIdentityError
from ledger.record import AuditRecord
from ledger.store.keys import KEY_PATH_SETTING, load_or_create_signer, open_log_identity
from ledger.store.memory import MemoryLog
from tests.records import make_record


def test_a_foreign_key_is_refused_by_the_identity_check_on_the_twin(tmp_path: Path) -> None:
    log = MemoryLog()
    foreign = tmp_path / "foreign.key"
    load_or_create_signer(foreign, "someone.else/log")
    identity = open_log_identity(log, key_path=tmp_path / "log.key",
                                 log_name="acme.example/log")
    stored = log.log_meta()
    assert identity.created and stored is not None and stored.origin == identity.origin
    log.append(make_record(0))
    log.seal_checkpoint(identity.signer, identity.origin, sealed_by="r1")
    with pytest.raises(LogIdentityError) as refused:
        open_log_identity(log, key_path=foreign)
    assert refused.value.field == KEY_PATH_SETTING and "does not sign" in str(refused.value)
    age, sealed_by = last_seal(log)
    assert sealed_by == "r1" and age is not None and age >= 0


def test_the_watched_journal_marks_a_failed_batch_on_the_twin() -> None:
    log = MemoryLog()
    journal = WatchedJournal(log, clock=lambda: 100.0)
    first = make_record(1)
    impostor = AuditRecord.from_body({**make_record(2, tenant="bank-b").body,
                                      "record_id": first.record_id})
    outcomes = asyncio.run(journal.append_many_async([first]))
    assert journal.appending() and not isinstance(outcomes[0], BaseException)
    outcomes = asyncio.run(journal.append_many_async([impostor]))
    assert isinstance(outcomes[0], DuplicateRecordError)
    assert not journal.appending() and journal.failures == 1
