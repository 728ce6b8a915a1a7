"""Envelope encryption of retained content: each attack on a ciphertext fails, named."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from ledger.content_records import access_body, check_purpose, erasure_body
from ledger.error_map import exit_code_for, http_status_for
from ledger.errors import CanonicalFormError, InvalidInputError
from ledger.merkle import hash_leaf
from ledger.record import AuditRecord, validate_body
from ledger.vault_crypto import (
    FIELDS,
    Content,
    KeyringData,
    SealedContent,
    open_content,
    rewrap,
    seal_content,
    subject_hash,
)
from ledger.vault_errors import (
    ContentErasedError,
    ContentIntegrityError,
    ContentNotRetainedError,
    KeyUnavailableError,
    LegalHoldError,
)

LEAF_A, LEAF_B = hash_leaf(b"record a"), hash_leaf(b"record b")
CONTENT_A = Content("What is my balance?", "It is 12 EUR.", b"\x01" * 32, b"\x02" * 32)
CONTENT_B = Content("Transfer 5 EUR", "Done.", b"\x03" * 32, b"\x04" * 32)


def _sealed(keys: KeyringData) -> tuple[SealedContent, SealedContent]:
    return (seal_content(keys, "bank-a", "rec-a", LEAF_A, CONTENT_A),
            seal_content(keys, "bank-a", "rec-b", LEAF_B, CONTENT_B))


def test_round_trip_and_nothing_in_clear() -> None:
    keys = KeyringData()
    sealed, _ = _sealed(keys)
    assert open_content(keys, "bank-a", "rec-a", LEAF_A, sealed) == CONTENT_A
    for blob in [*sealed.ciphertexts.values(), sealed.wrapped_key]:
        assert b"balance" not in blob and b"\x01" * 32 not in blob
    assert set(sealed.ciphertexts) == set(FIELDS)


def test_flipped_bit_in_ciphertext_names_record_and_field() -> None:
    keys = KeyringData()
    sealed, _ = _sealed(keys)
    blob = bytearray(sealed.ciphertexts["output"])
    blob[-1] ^= 1
    tampered = replace(sealed, ciphertexts={**sealed.ciphertexts, "output": bytes(blob)})
    with pytest.raises(ContentIntegrityError) as caught:
        open_content(keys, "bank-a", "rec-a", LEAF_A, tampered)
    assert (caught.value.record_id, caught.value.field) == ("rec-a", "output")


def test_ciphertext_moved_to_another_record_fails() -> None:
    keys = KeyringData()
    sealed_a, sealed_b = _sealed(keys)
    moved = replace(sealed_b, ciphertexts={**sealed_b.ciphertexts,
                                           "prompt": sealed_a.ciphertexts["prompt"]})
    with pytest.raises(ContentIntegrityError) as caught:
        open_content(keys, "bank-a", "rec-b", LEAF_B, moved)
    assert (caught.value.record_id, caught.value.field) == ("rec-b", "prompt")


def test_whole_sealed_row_swapped_between_records_fails() -> None:
    keys = KeyringData()
    sealed_a, _ = _sealed(keys)
    with pytest.raises(ContentIntegrityError) as caught:
        open_content(keys, "bank-a", "rec-b", LEAF_B, sealed_a)
    assert (caught.value.record_id, caught.value.field) == ("rec-b", "data_key")


def test_prompt_and_output_swapped_within_a_record_fail() -> None:
    keys = KeyringData()
    sealed, _ = _sealed(keys)
    swapped = replace(sealed, ciphertexts={**sealed.ciphertexts,
                                           "prompt": sealed.ciphertexts["output"],
                                           "output": sealed.ciphertexts["prompt"]})
    with pytest.raises(ContentIntegrityError) as caught:
        open_content(keys, "bank-a", "rec-a", LEAF_A, swapped)
    assert caught.value.field == "prompt"


def test_same_record_id_with_another_leaf_hash_fails() -> None:
    keys = KeyringData()
    sealed, _ = _sealed(keys)
    with pytest.raises(ContentIntegrityError) as caught:
        open_content(keys, "bank-a", "rec-a", LEAF_B, sealed)
    assert caught.value.field == "prompt"


def test_other_tenant_key_cannot_open() -> None:
    keys = KeyringData()
    sealed, _ = _sealed(keys)
    keys.current_kek_id("bank-b")
    with pytest.raises(KeyUnavailableError):
        open_content(keys, "bank-b", "rec-a", LEAF_A, sealed)


def test_rotation_rewraps_without_touching_content_and_retires_old_kek() -> None:
    keys = KeyringData()
    sealed, _ = _sealed(keys)
    old = sealed.kek_id
    new = keys.rotate("bank-a")
    kek, wrapped = rewrap(keys, "bank-a", "rec-a", sealed.kek_id, sealed.wrapped_key)
    assert kek == new != old
    assert keys.retire("bank-a") == [old]
    rotated = replace(sealed, kek_id=kek, wrapped_key=wrapped)
    assert open_content(keys, "bank-a", "rec-a", LEAF_A, rotated) == CONTENT_A
    with pytest.raises(KeyUnavailableError) as caught:  # an old backup row no longer opens
        open_content(keys, "bank-a", "rec-a", LEAF_A, sealed)
    assert caught.value.kek_id == old


def test_subject_hash_is_keyed_per_tenant() -> None:
    keys = KeyringData()
    a = subject_hash(keys.subject_key("bank-a"), "user-42")
    assert a == subject_hash(keys.subject_key("bank-a"), "user-42")
    assert a != subject_hash(keys.subject_key("bank-b"), "user-42")
    assert a.startswith("hmac-sha256:") and "user-42" not in a


def test_access_and_erasure_leaves_are_known_kinds() -> None:
    access = AuditRecord.from_body(access_body(
        leaf_id="leaf-1", created_at="2026-11-30T10:00:00.000Z", record_id="rec-a",
        record_tenant="bank-a", key_id="k1", role="auditor", key_tenant="audit-firm",
        purpose="MiFID II review", channel="http"))
    erasure = AuditRecord.from_body(erasure_body(
        leaf_id="leaf-2", created_at="2026-11-30T10:00:00.000Z", tenant="bank-a",
        records=["rec-b", "rec-a"], reason="request", selector="records",
        requested_by="cli:operator"))
    assert AuditRecord.from_canonical(access.canonical).leaf_hash == access.leaf_hash
    assert erasure.body["erasure"]["records"] == ["rec-a", "rec-b"]
    bad = dict(access.body, access={**access.body["access"], "content": "x"})
    with pytest.raises(CanonicalFormError) as caught:
        validate_body(bad)
    assert caught.value.field == "record.access"


@pytest.mark.parametrize("purpose", ["", "  ", "ab", "line\nbreak", "x" * 501, 42])
def test_purpose_is_required_and_checked(purpose: object) -> None:
    with pytest.raises(InvalidInputError) as caught:
        check_purpose(purpose)
    assert caught.value.field == "purpose"


def test_error_map_statuses_and_exit_codes() -> None:
    erased = ContentErasedError("r", "2026-11-30T10:00:00.000Z", "e")
    hold = LegalHoldError("hold-1", "tenant bank-a", "litigation")
    assert [http_status_for(e) for e in (ContentNotRetainedError("r"), erased, hold)] == [
        404, 410, 409]
    assert http_status_for(KeyUnavailableError("t", "k", "gone")) == 503
    assert exit_code_for(hold) == 1 and exit_code_for(erased) == 1
    assert exit_code_for(ContentIntegrityError("r", "prompt", "x")) == 1
    assert "hold-1" in str(hold) and "e" == erased.erasure_record_id


def test_retire_keeps_a_kek_still_in_use() -> None:
    keys = KeyringData()
    first = keys.current_kek_id("bank-a")
    second = keys.rotate("bank-a")
    third = keys.rotate("bank-a")
    assert keys.retire("bank-a", keep={first}) == [second]
    assert set(keys._keks("bank-a")) == {first, third}


def operator_kms() -> KeyringData:
    """Stands for an operator's KMS client in the plug-in test below."""
    return KeyringData()


def test_an_operator_plugs_in_its_own_key_encryption_keys(tmp_path: Path) -> None:
    from ledger.store.keyring import FileKeyring, load_keks

    plugged = load_keks(tmp_path / "unused", "tests.unit.test_vault_crypto:operator_kms")
    assert isinstance(plugged, KeyringData) and not isinstance(plugged, FileKeyring)
    sealed = seal_content(plugged, "bank-a", "rec-a", LEAF_A, CONTENT_A)
    assert open_content(plugged, "bank-a", "rec-a", LEAF_A, sealed) == CONTENT_A
    assert not (tmp_path / "unused").exists()
    assert isinstance(load_keks(tmp_path / "keyring"), FileKeyring)
    with pytest.raises(InvalidInputError) as caught:
        load_keks(tmp_path / "keyring", "no.such.module:factory")
    assert caught.value.field == "kek_provider"
