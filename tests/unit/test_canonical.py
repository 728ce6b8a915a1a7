import math
import os

import pytest

from ledger.canonical import canonical_bytes, json_number, parse_canonical, parse_strict
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


def test_splicing_survives_a_value_that_spells_a_placeholder() -> None:
    from ledger import canonical
    from ledger.canonical import Canonical, canonical_object

    section = Canonical.of({"gpu": "H200"})
    clash = canonical._PLACEHOLDER + "hardware"  # what no caller can guess, given anyway
    members = {"hardware": section, "data": {"stop": [clash]}, "tenant": "a"}
    plain = {"hardware": {"gpu": "H200"}, "data": {"stop": [clash]}, "tenant": "a"}
    assert canonical_object(members) == canonical_bytes(plain)
    assert canonical_object({"b": Canonical.of([1]), "a": 2}) == b'{"a":2,"b":[1]}'


# --- the fast path (C JSON encoder) against the reference implementation ------------------

import rfc8785  # noqa: E402
from hypothesis import assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_SAFE = 2**53 - 1
json_scalars = (st.none() | st.booleans() | st.integers(-_SAFE, _SAFE)
                | st.integers(-(2**60), 2**60)
                | st.floats(allow_nan=False, allow_infinity=False)
                | st.sampled_from([0.0, -0.0, 5.0, 1e16, 1e21, 1e-7, 1e-6, 5e-324, 0.1,
                                   123.456, 1e15 + 0.5, 2.0**53, 1e-4, -1e-4, 1.0001e-4,
                                   9.999e-5, 4503599627370495.5, 0.047, 127.46])
                | st.text() | st.sampled_from(["1.0", "v1e+16", "2.13.0", "x-0.0"])
                | st.text(alphabet=st.sampled_from(
                    ["a", "\u00e9", "\uff61", "\U0001f600", "\x00", "\x1f", "\x7f", '"',
                     "\\", "\n", "\u2028", "1", "."])))
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(
        st.text(alphabet=st.sampled_from(["a", "b", "\u00e9", "\uff61", "\U0001f600",
                                          "\U0001f601", "Z"]), max_size=3) | st.text(),
        inner, max_size=5),
    max_leaves=30)


def _reference(value: object) -> bytes | None:
    try:
        return rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, ValueError, TypeError):
        return None


@settings(max_examples=int(os.environ.get("CANONICAL_EXAMPLES", "3000")), deadline=None)
@given(json_values)
def test_fast_path_equals_the_reference_implementation(value: object) -> None:
    expected = _reference(value)
    if expected is None:  # the reference refuses it (e.g. an unsafe integer): so do we
        with pytest.raises(CanonicalFormError):
            canonical_bytes(value)
    else:
        assert canonical_bytes(value) == expected


@pytest.mark.parametrize("value, expected", [
    ({"t": 12.0}, b'{"t":12}'), ({"t": -0.0}, b'{"t":0}'), ([1e-05], b"[0.00001]"),
    (5.0, b"5"), ([-5.0, "2.13.0", 10.0], b'[-5,"2.13.0",10]'), ({"v": "1.0", "n": -120.0},
                                                                b'{"n":-120,"v":"1.0"}'),
    ([1e16], b"[10000000000000000]"), ([0.5, 10.25], b"[0.5,10.25]"),
    ({"v": "2.13.0", "d": "sha256:1e+16"}, b'{"d":"sha256:1e+16","v":"2.13.0"}'),
    ({"\U0001f600": 1, "\uff61": 2}, '{"\U0001f600":1,"\uff61":2}'.encode()),
    ([1234567890123456, -1234567890123456], b"[1234567890123456,-1234567890123456]"),
    ({"d": "sha256:ab12345678901234567890"}, b'{"d":"sha256:ab12345678901234567890"}'),
    ({"id": "0190a3b2-127e-7abc-8e-1"}, b'{"id":"0190a3b2-127e-7abc-8e-1"}'),
    ([1.5e16, -2.5e-07, 1e100, 5e-324],
     b"[15000000000000000,-2.5e-7,1e+100,5e-324]"),
])
def test_spellings_the_fast_path_hands_to_the_reference(value: object, expected: bytes) -> None:
    assert canonical_bytes(value) == expected


@pytest.mark.parametrize("bad, message", [
    ({"n": 2**53}, "exceeds safe integer domain"),
    ({"s": "\ud800"}, "lone surrogate"),
    ({"x": object()}, "cannot canonicalize"),
])
def test_fast_path_refusals_are_canonical_form_errors(bad: object, message: str) -> None:
    with pytest.raises(CanonicalFormError, match=message):
        canonical_bytes(bad)


@settings(max_examples=500, deadline=None)
@given(st.dictionaries(st.text(max_size=4), st.tuples(st.booleans(), json_values), max_size=6))
def test_spliced_objects_equal_whole_canonicalization(members: dict) -> None:  # type: ignore[type-arg]
    from ledger.canonical import Canonical, canonical_object

    plain = {key: value for key, (_, value) in members.items()}
    expected = _reference(plain)
    assume(expected is not None)  # refusals are the fast-path test's business
    wrapped = {key: Canonical.of(value) if wrap else value
               for key, (wrap, value) in members.items()}
    assert canonical_object(wrapped) == expected


@settings(max_examples=int(os.environ.get("CANONICAL_EXAMPLES", "3000")), deadline=None)
@given(json_scalars)
def test_leaf_shortcuts_equal_the_reference(value: object) -> None:
    from ledger.canonical import encode_leaf

    expected = _reference(value)
    if expected is None:
        with pytest.raises(CanonicalFormError):
            encode_leaf(value)
    else:
        assert encode_leaf(value) == expected


_path_keys = st.text(alphabet=st.sampled_from(["a", "b", "z", "_"]), min_size=1, max_size=3)


@settings(max_examples=1000, deadline=None)
@given(st.data())
def test_layout_fill_equals_whole_canonicalization(data: st.DataObject) -> None:
    """A family of objects: a template, some leaves (by path) varying; every member's
    filled (and joined) bytes equal RFC 8785's bytes of that member."""
    from ledger.canonical import Canonical, Layout, encode_leaf

    inner = data.draw(st.dictionaries(_path_keys, json_scalars, min_size=1, max_size=4))
    template = data.draw(st.dictionaries(st.text(max_size=3), json_values, max_size=4))
    if data.draw(st.booleans()):
        template["%b%"] = data.draw(json_values)  # a member name the template must escape
    template["s"] = inner
    template["c"] = data.draw(json_values)
    varying = ["s." + key for key in data.draw(st.lists(st.sampled_from(sorted(inner)),
                                                        unique=True, min_size=1))]
    if data.draw(st.booleans()):
        template["top"] = data.draw(json_scalars)
        varying.append("top")
    assume(_reference(template) is not None)
    layout = Layout({**template, "c": Canonical.of(template["c"])}, varying)
    for _ in range(3):
        member = dict(template, s=dict(inner))
        for path in varying:
            value = data.draw(json_values)
            if path == "top":
                member["top"] = value
            else:
                member["s"][path[2:]] = value
        expected = _reference(member)
        if expected is None:  # a value the reference refuses: the layout refuses it too
            with pytest.raises(CanonicalFormError):
                layout.fill(member)
        else:
            assert layout.fill(member) == expected
            # join: the same leaves, encoded by the caller, in the order they were named
            # (not the bytes' order); member names may hold "%" (the template escapes it).
            leaves = [encode_leaf(member["top"] if path == "top" else member["s"][path[2:]])
                      for path in varying]
            assert layout.join(leaves) == expected


@pytest.mark.parametrize("members, varying, message", [
    ({"a": 1}, ["b"], "no leaf at 'b'"),
    ({"a": 1}, ["a.b"], "no leaf at 'a.b'"),
    ({"a": {"b": 1}}, ["a-b"], "paths are ASCII letters"),
    ({"a": {"b": 1}}, ["a.b", "a.b"], "listed twice"),
    ({"a": "xy"}, ["a.b"], "'a' is not an object"),
    ({"a": [["b", 1]]}, ["a.b"], "'a' is not an object"),
])
def test_layout_refuses_what_it_cannot_lay_out(members: dict, varying: list[str],  # type: ignore[type-arg]
                                               message: str) -> None:
    from ledger.canonical import Layout, LayoutError

    with pytest.raises(LayoutError, match=message):
        Layout(members, varying)


def test_layout_refuses_a_template_that_spells_its_placeholder() -> None:
    from ledger import canonical
    from ledger.canonical import Layout, LayoutError

    clash = canonical._slot_placeholder("a.b")  # what no caller can guess, given anyway
    with pytest.raises(LayoutError, match="'a.b' did not occur exactly once"):
        Layout({"a": {"b": 1}, "c": clash}, ["a.b"])


def test_layout_join_wants_every_varying_leaf() -> None:
    from ledger.canonical import Layout, LayoutError

    layout = Layout({"a": {"b": 1, "c": 2}, "d": 3}, ["d", "a.c"])
    assert layout.join([b"4", b"5"]) == b'{"a":{"b":1,"c":5},"d":4}'
    with pytest.raises(LayoutError, match="2 leaves vary, 1 were given"):
        layout.join([b"4"])


def test_version_strings_stay_on_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every record's software section holds versions such as "2.13.0"; they look like
    an integral float only to a careless check, and must not cost the reference path."""
    from ledger import canonical

    def refuse(*_: object) -> bytes:
        raise AssertionError("the reference path was taken")

    monkeypatch.setattr(canonical, "_reference_bytes", refuse)
    value = {"torch": {"version": "2.13.0"}, "driver": "550.54.0", "tag": "v1.0", "n": 1.5}
    assert canonical_bytes(value) == (b'{"driver":"550.54.0","n":1.5,"tag":"v1.0",'
                                      b'"torch":{"version":"2.13.0"}}')


@pytest.mark.parametrize("data, found", [
    (b"5.0", True), (b"[-5.0]", True), (b'{"a":10.0}', True), (b"[1,2.0,3]", True),
    (b'"2.13.0"', False), (b"[1.5]", False), (b"[1.05]", False), (b'["v1.0"]', False),
    (b'["550.54.0"]', False), (b"[.0]", False), (b'["a-1.0"]', False),
])
def test_integral_float_check_reads_the_bytes(data: bytes, found: bool) -> None:
    from ledger.canonical import _has_integral_float

    assert _has_integral_float(data) is found


@settings(max_examples=int(os.environ.get("CANONICAL_EXAMPLES", "3000")), deadline=None)
@given(json_values)
def test_quick_reading_of_canonical_bytes_equals_the_hooked_parser(value: object) -> None:
    # parse_strict and parse_canonical read canonical bytes with the plain C parser:
    # the value must be exactly the one the per-object and per-number hooks build.
    from ledger import canonical

    data = _reference(value)
    if data is None:
        return
    hooked = canonical.parse_strict(data.decode("utf-8"))  # text never takes the quick path
    quick = canonical._read_canonical(data, canonical.MAX_JSON_DEPTH)
    assert quick is canonical._UNREAD or (quick == hooked and type(quick) is type(hooked))
    assert canonical.parse_strict(data) == hooked


@pytest.mark.parametrize("data, message", [
    (b'{"a":1,"a":1}', "duplicate key 'a'"),  # the C parser keeps one of them
    (b'{"a":Infinity}', "Infinity is not JSON"),
    (b'["\\ud800"]', "lone surrogate"),
    (b"[" * 65 + b"]" * 65, "nested deeper than 64"),
    (b'{"a":' + b"1" * 41 + b"}", "a number of 41 digits"),
])
def test_quick_reading_refuses_what_the_strict_parser_refuses(data: bytes, message: str
                                                              ) -> None:
    from ledger.canonical import parse_strict

    for parse in (parse_strict, parse_canonical):
        with pytest.raises(CanonicalFormError, match=message):
            parse(data)


@pytest.mark.parametrize("shape, exponent, long", [
    (b"0e+00", True, False), (b"a0e+00", False, False), (b" 0.000e+00", True, False),
    (b"00.0e+00", False, False), (b".0e+00", False, False), (b"0." + b"0" * 16, False, False),
    (b" " + b"0" * 16, False, True), (b"a" + b"0" * 20 + b" " + b"0" * 16, False, True),
    (b"a" + b"0" * 20, False, False), (b"0" * 16, False, True),
])
def test_shape_scans(shape: bytes, exponent: bool, long: bool) -> None:
    from ledger.canonical import _has_exponent_float, _has_long_integer

    assert _has_exponent_float(shape) is exponent
    assert _has_long_integer(shape) is long


@pytest.mark.parametrize("value, expected", [
    (5.0, 5), (-0.0, 0), (2.0**53 - 1, 2**53 - 1), (0.25, 0.25), (1e21, 1e21), (-1e300, -1e300),
])
def test_json_number_keeps_what_reads_back(value: float, expected: float) -> None:
    assert json_number(value) == expected
    assert type(json_number(value)) is type(expected)
    assert parse_strict(canonical_bytes([json_number(value)])) == [expected]


@pytest.mark.parametrize("value", [2.0**53, 1.5e16, -1.5e16, 9.99e20])
def test_json_number_refuses_what_would_read_back_as_an_unsafe_integer(value: float) -> None:
    # RFC 8785 spells these as bare digits: they read back as an integer beyond 2**53,
    # which has no canonical bytes, so a leaf holding one could never be opened again.
    with pytest.raises(CanonicalFormError, match="integer beyond 2\\*\\*53"):
        json_number(value)
    with pytest.raises(CanonicalFormError, match="exceeds safe integer domain"):
        canonical_bytes(parse_strict(canonical_bytes([value])))
