"""Field rules the v2 kinds beside ``audit-record/v2`` share: exact members, the common
identity members, short disclosed texts, an engine name, generation parameters.

Every check raises ``CanonicalFormError`` naming the field (``<where>.<member>``), so a
body refused by the writer or the verifier says exactly which member is wrong.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ledger.errors import CanonicalFormError, InvalidInputError
from ledger.leaves.envelope import is_timestamp
from ledger.report_record import REPORT_TENANT

ENGINE_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}\Z")


def exact_members(value: Any, required: frozenset[str], where: str,
                  optional: frozenset[str] = frozenset()) -> Mapping[str, Any]:
    """``value`` as an object holding every ``required`` member and no member but
    ``optional`` ones besides: nothing can be added to a body by mistake."""
    if not isinstance(value, Mapping):
        raise CanonicalFormError("must be an object", field=where)
    keys = set(value)
    if not required <= keys or not keys <= required | optional:
        wrong = sorted((required - keys) | (keys - required - optional))
        raise CanonicalFormError(f"must hold exactly {sorted(required)}"
                                 + (f" (and optionally {sorted(optional)})" if optional else "")
                                 + f"; wrong: {wrong}", field=where)
    return value


def common_members(body: Mapping[str, Any], kind: str, where: str) -> None:
    """``schema`` is ``kind``; ``record_id`` and ``tenant`` are non-empty strings;
    ``created_at`` is RFC 3339 UTC with milliseconds (as the envelope's)."""
    if body["schema"] != kind:
        raise CanonicalFormError(f"must be {kind!r}", field=f"{where}.schema")
    text(body["record_id"], f"{where}.record_id", 64)
    text(body["tenant"], f"{where}.tenant", 128)
    if not is_timestamp(body["created_at"]):
        raise CanonicalFormError("must be RFC 3339 UTC with milliseconds",
                                 field=f"{where}.created_at")


def text(value: Any, where: str, limit: int = 256) -> None:
    """A disclosed text: 1 to ``limit`` printable characters."""
    if not isinstance(value, str) or not value or len(value) > limit \
            or not value.isprintable():
        raise CanonicalFormError(f"must be 1 to {limit} printable characters", field=where)


MAX_TENANT_CHARS = 128
# The tenant names the service writes its own leaves under (reports may span tenants):
# no key may name one, or its holder would read those leaves. Exactly these names, not
# a pattern, so no tenant already holding records is ever locked out of a new key.
RESERVED_TENANTS = frozenset({REPORT_TENANT})


def check_tenant_name(value: Any, *, new_key: bool = False) -> str:
    """A tenant, checked against the rule every leaf applies to its ``tenant`` (``text``)
    where a key is created (``new_key``: ``RESERVED_TENANTS`` refused too) and before a vault
    operation, so a tenant that can hold a key can also stream, be erased and expire.
    ``InvalidInputError`` naming ``tenant``."""
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_TENANT_CHARS \
            or not value.isprintable():
        raise InvalidInputError("tenant", f"must be 1 to {MAX_TENANT_CHARS} printable "
                                "characters (letters, digits, punctuation, spaces)")
    if new_key and value in RESERVED_TENANTS:
        raise InvalidInputError("tenant", f"{value!r} is kept for the service's own leaves")
    return value


def engine(value: Any, where: str) -> None:
    if not isinstance(value, str) or not ENGINE_NAME.match(value):
        raise CanonicalFormError("must be 1-64 letters, digits, '.', '_' or '-'", field=where)


def generation(value: Any, where: str) -> None:
    """Generation parameters: names to numbers, booleans or null, never text (a text
    member could carry content)."""
    if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and (v is None or type(v) in (bool, int, float))
            for k, v in value.items()):
        raise CanonicalFormError("must map parameter names to numbers, booleans or null",
                                 field=where)
