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


def test_v2_commitments_are_the_standard_library_hmac() -> None:
    """``SaltKey`` spells HMAC-SHA256 out (RFC 2104) for speed: every label, values of
    every length around the hash's 64-byte block, each the library's own answer."""
    import hashlib
    import hmac
    import random

    from ledger.leaves.commitments import LABELS, PREFIX, SaltKey, commit

    chance = random.Random(20)
    for _ in range(200):
        salt = chance.randbytes(32)
        key = SaltKey(salt)
        for label in sorted(LABELS):
            value = chance.randbytes(chance.choice((0, 1, 54, 55, 56, 63, 64, 65, 119, 128,
                                                    1000)))
            expected = PREFIX + hmac.new(salt, label.encode() + b"\x00" + value,
                                         hashlib.sha256).hexdigest()
            assert key.commit(label, value) == expected
            assert commit(salt, label, value) == expected
    assert key.commit("input", b"a") == key.commit("input", b"a")  # the pads are not used up


def test_v2_commitment_refuses_a_short_salt_and_an_unknown_label() -> None:
    from ledger.leaves.commitments import SaltKey, commit

    with pytest.raises(InvalidInputError) as info:
        commit(b"short", "input", b"x")
    assert info.value.field == "salt"
    with pytest.raises(InvalidInputError) as info:
        SaltKey(new_salt()).commit("prompt", b"x")
    assert info.value.field == "label"
