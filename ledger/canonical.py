"""One canonical byte form for JSON values: RFC 8785 (JSON Canonicalization Scheme).

Hashes are always taken over these bytes; the bytes are stored verbatim and verified as
they are, so a JSON column elsewhere is only a copy for queries.
"""

from __future__ import annotations

import functools
import json
import math
import operator
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import rfc8785

from ledger.errors import CanonicalFormError


def canonical_bytes(value: Any) -> bytes:
    """RFC 8785 bytes of ``value``; refuses NaN, infinities and non-JSON types.

    ``value`` is a JSON value: dicts with string keys, lists, strings, ints, floats,
    booleans and None. Fast path: Python's C JSON encoder, sorted keys, no whitespace,
    UTF-8, already writes RFC 8785 for everything except a few number spellings and the
    key order of astral characters; its output is used only when it holds none of those
    (see ``_SHAPE``), otherwise the reference implementation serializes. Both
    paths are compared on random JSON values in ``tests/unit/test_canonical.py``.
    """
    try:
        data = _FAST_ENCODER.encode(value).encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate
        raise CanonicalFormError("cannot canonicalize: a string is not valid Unicode "
                                 "(lone surrogate)") from exc
    except (TypeError, ValueError, RecursionError) as exc:
        return _reference_bytes(value, exc)
    shape = data.translate(_SHAPE)
    if (b"!" in shape
            or ((b"0.0 " in shape or shape.endswith(b"0.0"))
                and _has_integral_float(data))
            or (b"e+00" in shape and _has_exponent_float(shape))
            or (b"0" * 16 in shape and _has_long_integer(shape))):
        return _reference_bytes(value)
    return data


# The C encoder's output may differ from RFC 8785 only where its "shape" (each byte
# mapped by ``_SHAPE``: digits to 0, ``e``/``E`` to e, other ASCII letters to a, signs to
# +, ``.`` kept, the lead byte of a 4-byte UTF-8 sequence to !, anything else to a space)
# shows:
# - ``0e+00`` or ``0.00e+00`` after neither a letter, a digit nor a point: a float with an
#   exponent (Python ``1e-05``, ``1.5e+16``; ECMAScript ``0.00001``,
#   ``15000000000000000``); Python writes one digit before the point and at least two in
#   the exponent, which spares text such as a UUID's ``7e-8``;
# - ``0.0`` then a space or the end: maybe an integral float (Python ``5.0``, ``-0.0``;
#   ECMAScript ``5``, ``0``), since a number is always followed by ``,``, ``]``, ``}`` (all
#   spaces in the shape) or the end. The bytes themselves then decide (``_has_integral_float``:
#   digits after neither a letter, a digit, a point nor a sign, then ``.0``, then ``,``,
#   ``]``, ``}`` or the end), which spares ``1.5`` and version strings (``"2.13.0"``, in
#   every record's software section). A fixed-point float that is not integral has the
#   same shortest round-trip digits in both;
# - 16 digits in a row after neither a letter, a digit nor a point: an integer that may
#   lie outside RFC 8785's safe range (hex digests, often with such runs, are spared);
# - ``!``: a character outside the Basic Multilingual Plane, where code-point order (the
#   encoder's key sort) and UTF-16 order (RFC 8785's) can differ.
# Such a shape inside a string only costs speed (the reference path is exact), never truth.
_SHAPE = bytes(
    ord("0") if chr(b).isdigit() and b < 128 else ord("e") if b in b"eE"
    else ord("a") if chr(b).isalpha() and b < 128
    else ord("+") if b in b"+-" else ord(".") if b == ord(".")
    else ord("!") if 0xF0 <= b <= 0xF4 else ord(" ")
    for b in range(256)
)
_NOT_BEFORE_A_NUMBER_SHAPE = frozenset(b"0ae.")


def _has_exponent_float(shape: bytes) -> bool:
    """Whether ``shape`` holds ``0e+00`` or ``0.0…0e+00`` after neither a letter, a digit
    nor a point (see ``_SHAPE``). ``bytes.find`` and a look back at each hit: a regular
    expression with a lookbehind tried at every byte cost more than the encoding (UUIDs
    put ``e-`` then digits in most records)."""
    at = shape.find(b"e+00")
    while at >= 0:
        end = at - 1  # the digit before "e"
        start = end
        while start >= 0 and shape[start] == 48:  # "0"
            start -= 1
        if start < end and start > 0 and shape[start] == 46 \
                and shape[start - 1] == 48 and (
                    start == 1 or shape[start - 2] not in _NOT_BEFORE_A_NUMBER_SHAPE):
            return True  # 0.0…0e+00
        if end >= 0 and shape[end] == 48 and (
                end == 0 or shape[end - 1] not in _NOT_BEFORE_A_NUMBER_SHAPE):
            return True  # 0e+00
        at = shape.find(b"e+00", at + 1)
    return False


def _has_long_integer(shape: bytes) -> bool:
    """Whether ``shape`` holds 16 digits in a row after neither a letter, a digit nor a
    point (see ``_SHAPE``): each run of 16 is looked at from where its digits begin."""
    run = b"0" * 16
    at = shape.find(run)
    while at >= 0:
        while at > 0 and shape[at - 1] == 48:  # back to the first digit of the run
            at -= 1
        if at == 0 or shape[at - 1] not in _NOT_BEFORE_A_NUMBER_SHAPE:
            return True
        end = at
        while end < len(shape) and shape[end] == 48:
            end += 1
        at = shape.find(run, end)
    return False
_FAST_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, sort_keys=True,
                                 separators=(",", ":"))
_NOT_BEFORE_A_NUMBER = frozenset(
    b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz.+-")


def _has_integral_float(data: bytes) -> bool:
    """Whether ``data`` may hold a float written as ``<digits>.0`` (see ``_SHAPE``).

    Each ``.0`` followed by ``,``, ``]``, ``}`` or the end is looked at (``bytes.find``,
    far quicker than a regular expression with a lookbehind): the digits before it, an
    optional ``-``, and before them neither a letter, a digit, a point nor a sign.
    """
    ends = [len(data) - 2] if data.endswith(b".0") else []
    for tail in (b".0,", b".0]", b".0}"):
        at = data.find(tail)
        while at >= 0:
            ends.append(at)
            at = data.find(tail, at + 1)
    for dot in ends:
        start = dot
        while start > 0 and 48 <= data[start - 1] <= 57:  # ASCII digits
            start -= 1
        if start == dot:
            continue
        if start > 0 and data[start - 1] == 45:  # "-"
            start -= 1
        if start == 0 or data[start - 1] not in _NOT_BEFORE_A_NUMBER:
            return True
    return False


def json_number(value: float) -> int | float:
    """The same number as RFC 8785 writes it: an int when integral (``5.0`` and ``5`` are
    both ``5`` there). Values built this way stay on ``canonical_bytes``'s fast path.

    An integral float from 2**53 up to 1e21 is refused (``CanonicalFormError``): RFC 8785
    writes it as bare digits (``15000000000000000``), which read back as an integer
    beyond the safe range that no reader accepts, so a leaf holding it could never be
    opened again."""
    if value.is_integer():
        if abs(value) < 2**53:
            return int(value)
        if abs(value) < 1e21:
            raise CanonicalFormError(f"number {value!r} would be written as an integer "
                                     f"beyond 2**53, which no reader accepts")
    return value


def _reference_bytes(value: Any, fast_error: BaseException | None = None) -> bytes:
    _reject_non_finite(value)
    try:
        return rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, TypeError, ValueError, RecursionError) as exc:
        raise CanonicalFormError(f"cannot canonicalize: {exc}") from (fast_error or exc)


def _reject_non_finite(value: Any) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise CanonicalFormError(f"non-finite number {value!r} has no JSON form")
    if isinstance(value, dict):
        for item in value.values():
            _reject_non_finite(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _reject_non_finite(item)


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise CanonicalFormError(f"duplicate key {key!r}")
        result[key] = value
    return result


def _no_constant(name: str) -> Any:
    raise CanonicalFormError(f"{name} is not JSON")


# Bounds for JSON read from evidence (records, bundles, server answers): deeper nesting
# or longer numbers than any genuine document has are refused as malformed, before they
# can exhaust the stack or the integer parser (each would otherwise be an internal error).
MAX_JSON_DEPTH = 64
MAX_NUMBER_CHARS = 40


def _bounded_int(text: str) -> int:
    if len(text) > MAX_NUMBER_CHARS:
        raise CanonicalFormError(f"a number of {len(text)} digits (at most "
                                 f"{MAX_NUMBER_CHARS})")
    return int(text)


def _bounded_float(text: str) -> float:
    if len(text) > MAX_NUMBER_CHARS:
        raise CanonicalFormError(f"a number of {len(text)} characters (at most "
                                 f"{MAX_NUMBER_CHARS})")
    value = float(text)
    if not math.isfinite(value):
        raise CanonicalFormError(f"number {text[:20]} is out of range")
    return value


def _depth_within(value: Any, limit: int) -> bool:
    """Whether ``value`` nests at most ``limit`` arrays/objects deep (iterative)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return False
        stack.extend((child, depth + 1) for child in children
                     if isinstance(child, (dict, list)))
    return True


# A \uD800-\uDFFF escape: JSON may spell a lone surrogate, which no UTF-8 text holds.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def parse_strict(data: bytes | str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Parse JSON that has exactly one meaning: UTF-8, no duplicate keys, no NaN, numbers
    of at most ``MAX_NUMBER_CHARS`` characters, at most ``max_depth`` levels of nesting.

    Enough to rule out bytes that different parsers would read differently. Anything
    else raises ``CanonicalFormError``, never another error. Stored leaves are
    canonical bytes: those take ``_read_canonical``'s fast path (same reading).
    """
    if type(data) is bytes:
        quick = _read_canonical(data, max_depth)
        if quick is not _UNREAD:
            return quick
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError as exc:
        raise CanonicalFormError(f"not UTF-8: {exc}") from exc
    try:
        value = json.loads(text, object_pairs_hook=_no_duplicate_keys,
                           parse_constant=_no_constant, parse_int=_bounded_int,
                           parse_float=_bounded_float)
    except CanonicalFormError:
        raise
    except json.JSONDecodeError as exc:
        raise CanonicalFormError(f"not JSON: {exc}") from exc
    except RecursionError as exc:
        raise CanonicalFormError(f"JSON nested deeper than {max_depth} levels") from exc
    except ValueError as exc:  # the number hooks' own errors are CanonicalFormError
        raise CanonicalFormError(f"not JSON: {exc}") from exc
    if not _depth_within(value, max_depth):
        raise CanonicalFormError(f"JSON nested deeper than {max_depth} levels")
    if _SURROGATE_ESCAPE.search(text):  # rare: only then look for a lone one
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as exc:
            raise CanonicalFormError("a string is not valid Unicode (lone surrogate)"
                                     ) from exc
    return value


def _read_canonical(data: bytes, max_depth: int) -> Any:
    """``data``'s value if ``data`` is canonical bytes, else ``_UNREAD``: the C parser
    without ``parse_strict``'s per-object and per-number hooks, then the re-encoding.
    Bytes that re-encode to themselves have exactly ``parse_strict``'s reading: a
    repeated key would be dropped by the parser and be missing from the re-encoding,
    NaN and lone surrogates have no canonical bytes, canonical numbers are far shorter
    than ``MAX_NUMBER_CHARS``, and with at most ``max_depth`` opening brackets in all
    nothing nests deeper. About four times quicker than the hooks on a record body."""
    if data.count(b"{") + data.count(b"[") > max_depth:
        return _UNREAD
    try:
        quick = _PLAIN_DECODER.decode(data.decode("utf-8"))
        if canonical_bytes(quick) == data:
            return quick
    except (ValueError, RecursionError):  # CanonicalFormError is a ValueError too
        pass
    return _UNREAD


def strict_int(value: Any, name: str) -> int:
    """An integer field of evidence: a JSON integer, never a float, string or bool
    (``5.9`` read as 5 would point at another leaf than the one named). TypeError."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, not {value!r:.40}")
    return value


def parse_canonical(data: bytes) -> Any:
    """Parse bytes that must already be canonical; anything else is refused.

    Duplicate keys, NaN/Infinity, invalid UTF-8 and any non-canonical spelling
    (whitespace, key order, number form) raise ``CanonicalFormError``.

    Canonical bytes take ``_read_canonical``'s fast path; anything else the strict
    path, which says what is wrong.
    """
    quick = _read_canonical(data, MAX_JSON_DEPTH)
    if quick is not _UNREAD:
        return quick
    value = parse_strict(data)
    if canonical_bytes(value) != data:
        raise CanonicalFormError("bytes are JSON but not in RFC 8785 canonical form")
    return value


_PLAIN_DECODER = json.JSONDecoder()
_UNREAD = object()


@dataclass(frozen=True)
class Canonical:
    """A JSON value whose canonical bytes were computed once, for reuse in many objects.

    The hardware and software sections are the same in every record of a process;
    splicing their bytes into each record is exact because RFC 8785 serializes an
    object member by member in key order.
    """

    value: Any
    data: bytes

    @classmethod
    def of(cls, value: Any) -> Canonical:
        return cls(value, canonical_bytes(value))


def _utf16_key(item: tuple[str, Any]) -> bytes:
    return item[0].encode("utf-16-be")  # RFC 8785 3.2.3: sort by UTF-16 code units


def canonical_object(members: dict[str, Any]) -> bytes:
    """Canonical bytes of an object whose member values may be ``Canonical``.

    One encoding of the whole object, with each ``Canonical`` member standing in as a
    placeholder string that is then replaced by its bytes. A placeholder holds 128 random
    bits drawn per process, so no caller's string can spell it by chance; should one
    appear anyway (it must occur exactly once), the object is built member by member.
    """
    spliced = {key: value for key, value in members.items() if isinstance(value, Canonical)}
    if not spliced:
        return canonical_bytes(members)
    stand_ins = {key: _PLACEHOLDER + key for key in spliced}
    if all(key.isascii() and key.isidentifier() for key in stand_ins):
        data = canonical_bytes({key: stand_ins.get(key, value)
                                for key, value in members.items()})
        for key, value in spliced.items():
            quoted = b'"' + stand_ins[key].encode("ascii") + b'"'
            if data.count(quoted) != 1:
                break
            data = data.replace(quoted, value.data)
        else:
            return data
    return _object_by_members(members)


# Placeholders of ``canonical_object``: letters only, so they never need escaping and never
# look like a number to ``canonical_bytes``'s fast path.
_PLACEHOLDER = "canonical-splice-{}-".format(
    secrets.token_hex(16).translate(str.maketrans("0123456789", "ghijklmnop")))


def _object_by_members(members: dict[str, Any]) -> bytes:
    parts = []
    for key, value in sorted(members.items(), key=_utf16_key):
        encoded = value.data if isinstance(value, Canonical) else canonical_bytes(value)
        parts.append(_member_name(key) + encoded)
    return b"{" + b",".join(parts) + b"}"


@functools.lru_cache(maxsize=256)
def _member_name(key: str) -> bytes:
    """``"key":`` (records use a handful of member names, over and over)."""
    return canonical_bytes(key) + b":"


class LayoutError(ValueError):
    """A layout could not be compiled (a path is missing, or a placeholder did not
    occur exactly once)."""


class Layout:
    """Canonical bytes of many objects that share every key and differ in a few leaves.

    A batch's records have the same members; only some leaves (record id, tenant,
    commitments, digests, counts) change from row to row. The object is encoded once,
    with each varying leaf (named by its path, ``"data.input_commitment"``) standing in
    as a placeholder string, and the bytes are cut at the placeholders. ``fill(body)``
    joins the pieces with each varying leaf of ``body`` encoded alone: exact because
    RFC 8785 writes a value without regard to its siblings once the (fixed) keys are
    ordered. Every other leaf of ``body`` must equal the template's; the caller builds
    its bodies from the same constants. ``tests/unit/test_canonical.py`` compares
    ``fill`` with ``canonical_bytes`` on random values.
    """

    def __init__(self, members: dict[str, Any], varying: Sequence[str]) -> None:
        """``members``: one object of the family (top-level values may be ``Canonical``);
        ``varying``: the paths of the leaves that change from object to object."""
        if len(set(varying)) != len(varying):
            raise LayoutError(f"a path is listed twice in {varying}")
        stand_in = dict(members)
        for path in varying:
            *parents, last = path.split(".")
            if not path.replace("_", "").replace(".", "").isalpha() or not path.isascii():
                raise LayoutError(f"paths are ASCII letters, '_' and '.', not {path!r}")
            holder = stand_in
            for key in parents:
                if type(holder.get(key)) is not dict:
                    raise LayoutError(f"no leaf at {path!r}: {key!r} is not an object")
                holder[key] = dict(holder[key])  # copied: the caller's stays intact
                holder = holder[key]
            if last not in holder:
                raise LayoutError(f"no leaf at {path!r}")
            holder[last] = _slot_placeholder(path)
        data = canonical_object(stand_in)
        cuts = []
        for path in varying:
            quoted = b'"' + _slot_placeholder(path).encode("ascii") + b'"'
            at = data.find(quoted)
            if at < 0 or data.find(quoted, at + 1) >= 0:
                raise LayoutError(f"the placeholder of {path!r} did not occur exactly once")
            cuts.append((at, at + len(quoted), tuple(path.split("."))))
        cuts.sort()
        pieces, start = [], 0
        for at, end, _ in cuts:
            pieces.append(data[start:at])
            start = end
        pieces.append(data[start:])
        self._first = pieces[0]
        self._rest = tuple((keys, piece) for (_, _, keys), piece
                           in zip(cuts, pieces[1:], strict=True))
        # ``join``: the pieces as one bytes template (``%`` escaped), and the varying
        # leaves' order in the bytes, as given in ``varying``.
        self._template = b"%b".join(piece.replace(b"%", b"%%") for piece in pieces)
        place_of = {tuple(path.split(".")): place for place, path in enumerate(varying)}
        order = [place_of[keys] for _, _, keys in cuts]
        self._in_byte_order = order == list(range(len(order)))
        self._pick: Any = operator.itemgetter(*order) if len(order) > 1 else None

    def fill(self, body: Any) -> bytes:
        """The canonical bytes of ``body``, a member of this layout's family."""
        parts = [self._first]
        for keys, piece in self._rest:
            value = body
            for key in keys:
                value = value[key]
            parts.append(encode_leaf(value))
            parts.append(piece)
        return b"".join(parts)

    def join(self, leaves: Sequence[bytes]) -> bytes:
        """The canonical bytes of the family member whose varying leaves, in the order
        ``varying`` named them, encode to ``leaves`` (each ``encode_leaf`` of its value,
        or bytes known equal to it). ``fill`` without walking the member: a caller that
        holds the leaves already (a batch's rows) encodes them as cheaply as it can."""
        if len(leaves) != len(self._rest):
            raise LayoutError(f"{len(self._rest)} leaves vary, {len(leaves)} were given")
        if self._in_byte_order:
            return self._template % tuple(leaves)
        picked: tuple[bytes, ...] = self._pick(leaves)  # two or more leaves, reordered
        return self._template % picked


def _slot_placeholder(path: str) -> str:
    return _PLACEHOLDER + "slot-" + path.replace(".", "-")


_SAFE_INT = 2**53


def encode_leaf(value: Any) -> bytes:
    """``canonical_bytes(value)``, with shortcuts for the leaves records are made of.

    A string of printable ASCII without ``"`` or ``\\`` is its own JSON text between
    quotes; an int in the safe range is its decimal digits; a float that is not
    integral, between 1e-4 and 1e16 in size, is Python's shortest round-trip spelling,
    as ECMAScript writes it there (no exponent in either); anything else (other text,
    other floats, lists) takes the full encoder.
    """
    kind = type(value)
    if kind is str:
        if value.isascii() and value.isprintable() and '"' not in value and "\\" not in value:
            text: bytes = value.encode("ascii")
            return b'"' + text + b'"'
    elif kind is int:
        if -_SAFE_INT < value < _SAFE_INT:
            return str(value).encode("ascii")
    elif kind is float:
        if 1e-4 <= abs(value) < 1e16 and not value.is_integer():  # NaN fails the first
            return repr(value).encode("ascii")
    elif value is True:
        return b"true"
    elif value is False:
        return b"false"
    return canonical_bytes(value)
