import math

import pytest

from ledger.canonical import canonical_bytes, parse_canonical
from ledger.errors import CanonicalFormError


def test_known_answer_key_order_and_numbers() -> None:
    # RFC 8785: keys sorted by UTF-16 code units, no whitespace, ES6 number form.
    value = {"b": [1.0, 1e21, 0.5], "a": "\u20ac", "\u00e9": True}
    assert canonical_bytes(value) == '{"a":"€","b":[1,1e+21,0.5],"é":true}'.encode()


def test_round_trip() -> None:
    value = {"schema": "x/v1", "n": 3, "nested": {"z": None, "a": [1, "two"]}}
    data = canonical_bytes(value)
    assert parse_canonical(data) == value
    assert canonical_bytes(parse_canonical(data)) == data


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_numbers_rejected(bad: float) -> None:
    with pytest.raises(CanonicalFormError, match="non-finite"):
        canonical_bytes({"x": [bad]})


def test_nan_literal_rejected_on_parse() -> None:
    with pytest.raises(CanonicalFormError, match="NaN is not JSON"):
        parse_canonical(b'{"x":NaN}')


def test_duplicate_keys_rejected() -> None:
    with pytest.raises(CanonicalFormError, match="duplicate key 'a'"):
        parse_canonical(b'{"a":1,"a":2}')


@pytest.mark.parametrize("spelling", [b'{"b":1,"a":2}', b'{"a": 2}', b'{"a":2.0}', b"[1 ]"])
def test_non_canonical_spelling_rejected(spelling: bytes) -> None:
    with pytest.raises(CanonicalFormError, match="not in RFC 8785 canonical form"):
        parse_canonical(spelling)


def test_invalid_utf8_rejected() -> None:
    with pytest.raises(CanonicalFormError, match="not UTF-8"):
        parse_canonical(b'{"a":"\xff"}')


def test_spliced_sections_equal_whole_canonicalization() -> None:
    from ledger.canonical import Canonical, canonical_object

    section = {"z": 1, "\u00e9": [2.5, None], "a": {"k": "v"}}
    members = {"b": Canonical.of(section), "a": 1, "\U0001f600": "x", "\uff61": Canonical.of([])}
    plain = {k: v.value if isinstance(v, Canonical) else v for k, v in members.items()}
    assert canonical_object(members) == canonical_bytes(plain)
