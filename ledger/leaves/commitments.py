"""Labelled HMAC commitments: the only form a v2 body gives content in.

``"hmac-sha256:" + hex(HMAC-SHA256(key=salt, msg=label || 0x00 || value))``. The label
separates the fields committed under one salt (a prompt's text, its token ids and its
stop strings share the caller's input salt), so no commitment opens as another field.
Without the salt nothing about the value can be tested: there is no unsalted digest of
content to guess against (the attack decision record 0026 describes).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import struct
from collections.abc import Iterable, Mapping, Sequence

from ledger.canonical import canonical_bytes
from ledger.digest import SALT_BYTES
from ledger.errors import CanonicalFormError, InvalidInputError

PREFIX = "hmac-sha256:"
INPUT, INPUT_IDS, STOP, OUTPUT, OUTPUT_IDS, USER = (
    "input", "input_ids", "stop", "output", "output_ids", "user")
# Which salt each label is committed under (the caller receives every one of them).
SALT_OF_LABEL = {INPUT: "input_salt", INPUT_IDS: "input_salt", STOP: "input_salt",
                 OUTPUT: "output_salt", OUTPUT_IDS: "output_salt", USER: "user_salt"}
REQUIRED_LABELS = frozenset((INPUT, INPUT_IDS, OUTPUT, OUTPUT_IDS))
LABELS = frozenset(SALT_OF_LABEL)
_COMMITMENT = re.compile(r"hmac-sha256:[0-9a-f]{64}\Z")


def commit(salt: bytes, label: str, value: bytes) -> str:
    """The commitment to ``value`` as field ``label`` under ``salt``."""
    return SaltKey(salt).commit(label, value)


# RFC 2104's pads: a key of at most one SHA-256 block (64 bytes), zero-filled, XORed
# with 0x36 (inner) and 0x5c (outer), as byte translation tables.
_BLOCK = 64
_INNER_PAD = bytes(b ^ 0x36 for b in range(256))
_OUTER_PAD = bytes(b ^ 0x5C for b in range(256))
_LABEL_PREFIX = {label: label.encode("ascii") + b"\x00" for label in LABELS}


class SaltKey:
    """HMAC-SHA256 under one salt, for the several commitments one salt makes (a row's
    prompt, token ids and stop strings share its input salt).

    RFC 2104 spelt out: the two padded keys are hashed once, and each commitment copies
    those states. The bytes are ``hmac.digest``'s (``tests/unit/test_commitments.py``
    compares them); the library call costs several times as much (OpenSSL 3 sets up a
    MAC context on every call), and a batch makes four or more per row.
    """

    __slots__ = ("_inner", "_outer")

    def __init__(self, salt: bytes) -> None:
        if len(salt) != SALT_BYTES:
            raise InvalidInputError("salt", f"a salt has {SALT_BYTES} bytes, got {len(salt)}")
        key = bytes(salt).ljust(_BLOCK, b"\x00")  # SALT_BYTES < _BLOCK: never hashed first
        self._inner = hashlib.sha256(key.translate(_INNER_PAD))
        self._outer = hashlib.sha256(key.translate(_OUTER_PAD))

    def commit(self, label: str, value: bytes) -> str:
        """The commitment to ``value`` as field ``label`` under this salt."""
        prefix = _LABEL_PREFIX.get(label)
        if prefix is None:
            raise InvalidInputError("label", f"unknown commitment label {label!r}")
        inner = self._inner.copy()
        inner.update(prefix)
        inner.update(value)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return PREFIX + outer.hexdigest()


def token_ids_bytes(ids: Iterable[int]) -> bytes:
    """Token ids as committed: little-endian signed 64-bit integers (torch's int64)."""
    values = list(ids)
    return struct.pack(f"<{len(values)}q", *values)


def stop_bytes(stops: Sequence[str]) -> bytes:
    """Stop strings as committed: their canonical JSON array (order kept)."""
    return canonical_bytes(list(stops))


def opens(commitment: str, salt: bytes, label: str, value: bytes) -> bool:
    """Constant-time: do ``salt`` and ``value`` open ``commitment`` as ``label``?"""
    return hmac.compare_digest(commit(salt, label, value), commitment)


def row_commitments(*, input_salt: bytes, output_salt: bytes, prompt: str,
                    input_ids: Sequence[int], output: str, output_ids: Sequence[int],
                    stop: Sequence[str] = (), user: str | None = None,
                    user_salt: bytes | None = None) -> dict[str, str]:
    """Every commitment of one generate call. ``input_ids``: the row's real tokens (no
    padding); ``stop`` and ``user`` only when the request had them."""
    inputs, outputs = SaltKey(input_salt), SaltKey(output_salt)
    result = {
        INPUT: inputs.commit(INPUT, prompt.encode("utf-8")),
        INPUT_IDS: inputs.commit(INPUT_IDS, token_ids_bytes(input_ids)),
        OUTPUT: outputs.commit(OUTPUT, output.encode("utf-8")),
        OUTPUT_IDS: outputs.commit(OUTPUT_IDS, token_ids_bytes(output_ids)),
    }
    if stop:
        result[STOP] = inputs.commit(STOP, stop_bytes(stop))
    if user is not None:
        if user_salt is None:
            raise InvalidInputError("user_salt", "a user commitment needs its salt")
        result[USER] = commit(user_salt, USER, user.encode("utf-8"))
    return result


def validate_commitments(value: object, field: str = "record.commitments", *,
                         required: frozenset[str] = REQUIRED_LABELS,
                         optional: frozenset[str] = frozenset((STOP, USER))) -> None:
    """A body's ``commitments``: the ``required`` labels, else only ``optional`` ones,
    each well formed (an ``audit-record/v2`` by default)."""
    if not isinstance(value, Mapping):
        raise CanonicalFormError("must be an object", field=field)
    keys = set(value)
    if not required <= keys or not keys <= required | optional:
        raise CanonicalFormError(
            f"must hold {sorted(required)} and optionally {', '.join(sorted(optional))}; "
            f"got {sorted(keys)}", field=field)
    for label, commitment in value.items():
        if not isinstance(commitment, str) or not _COMMITMENT.match(commitment):
            raise CanonicalFormError("must be 'hmac-sha256:<64 hex>'",
                                     field=f"{field}.{label}")
