import pytest

from ledger.digest import commit_text, commitment_matches, new_salt, parse_sha256_digest
from ledger.errors import InvalidInputError


def test_one_changed_character_changes_the_commitment() -> None:
    salt = new_salt()
    assert commit_text(salt, "transfer 100 EUR") != commit_text(salt, "transfer 900 EUR")


def test_same_prompt_two_salts_two_commitments() -> None:
    assert commit_text(new_salt(), "yes") != commit_text(new_salt(), "yes")


def test_commitment_matches_only_its_salt_and_text() -> None:
    salt = new_salt()
    commitment = commit_text(salt, "hello")
    assert commitment.startswith("sha256:") and len(parse_sha256_digest(commitment)) == 32
    assert commitment_matches(commitment, salt, "hello")
    assert not commitment_matches(commitment, salt, "hello ")
    assert not commitment_matches(commitment, new_salt(), "hello")


def test_short_salt_refused() -> None:
    with pytest.raises(InvalidInputError) as info:
        commit_text(b"short", "x")
    assert info.value.field == "salt"
