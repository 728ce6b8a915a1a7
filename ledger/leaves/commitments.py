"""Labelled HMAC commitments: the only form a v2 body gives content in.

``"hmac-sha256:" + hex(HMAC-SHA256(key=salt, msg=label || 0x00 || value))``. The label
separates the fields committed under one salt (a prompt's text, its token ids and its
stop strings share the caller's input salt), so no commitment opens as another field.
Without the salt nothing about the value can be tested: there is no unsalted digest of
content to guess against (the attack decision record 0026 describes).
"""

from __future__ import annotations

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
    if len(salt) != SALT_BYTES:
        raise InvalidInputError("salt", f"a salt has {SALT_BYTES} bytes, got {len(salt)}")
    if label not in LABELS:
        raise InvalidInputError("label", f"unknown commitment label {label!r}")
    return PREFIX + hmac.digest(salt, label.encode("ascii") + b"\x00" + value,
                                "sha256").hex()


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
    result = {
        INPUT: commit(input_salt, INPUT, prompt.encode("utf-8")),
        INPUT_IDS: commit(input_salt, INPUT_IDS, token_ids_bytes(input_ids)),
        OUTPUT: commit(output_salt, OUTPUT, output.encode("utf-8")),
        OUTPUT_IDS: commit(output_salt, OUTPUT_IDS, token_ids_bytes(output_ids)),
    }
    if stop:
        result[STOP] = commit(input_salt, STOP, stop_bytes(stop))
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
