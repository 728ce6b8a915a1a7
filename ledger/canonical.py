"""One canonical byte form for JSON values: RFC 8785 (JSON Canonicalization Scheme).

Hashes are always taken over these bytes; the bytes are stored verbatim and verified as
they are, so a JSON column elsewhere is only a copy for queries.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import rfc8785

from ledger.errors import CanonicalFormError


def canonical_bytes(value: Any) -> bytes:
    """RFC 8785 bytes of ``value``; refuses NaN, infinities and non-JSON types."""
    _reject_non_finite(value)
    try:
        return rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, TypeError, ValueError) as exc:
        raise CanonicalFormError(f"cannot canonicalize: {exc}") from exc


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


def parse_strict(data: bytes) -> Any:
    """Parse JSON that has exactly one meaning: UTF-8, no duplicate keys, no NaN.

    Cheaper than ``parse_canonical`` (no re-serialization); enough to rule out bytes
    that different parsers would read differently.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CanonicalFormError(f"not UTF-8: {exc}") from exc
    try:
        return json.loads(text, object_pairs_hook=_no_duplicate_keys,
                          parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise CanonicalFormError(f"not JSON: {exc}") from exc


def parse_canonical(data: bytes) -> Any:
    """Parse bytes that must already be canonical; anything else is refused.

    Duplicate keys, NaN/Infinity, invalid UTF-8 and any non-canonical spelling
    (whitespace, key order, number form) raise ``CanonicalFormError``.
    """
    value = parse_strict(data)
    if canonical_bytes(value) != data:
        raise CanonicalFormError("bytes are JSON but not in RFC 8785 canonical form")
    return value


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
    """Canonical bytes of an object whose member values may be ``Canonical``."""
    parts = []
    for key, value in sorted(members.items(), key=_utf16_key):
        encoded = value.data if isinstance(value, Canonical) else canonical_bytes(value)
        parts.append(canonical_bytes(key) + b":" + encoded)
    return b"{" + b",".join(parts) + b"}"
