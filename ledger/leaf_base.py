"""What leaves of every kind and format share: record ids, timestamps, the common
members. Pure, and importing nothing of ``ledger`` but errors, so that any kind's module
can use it without import cycles."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from ledger.errors import CanonicalFormError


def new_record_id(now_ms: int | None = None) -> str:
    """A UUIDv7 string (RFC 9562): time-ordered, 74 random bits, no coordination."""
    return new_record_ids(1, now_ms)[0]


_RAND_A, _RAND_B = (1 << 12) - 1, (1 << 62) - 1
_VERSION_AND_VARIANT = 0x7 << 76 | 0b10 << 62


def new_record_ids(count: int, now_ms: int | None = None) -> list[str]:
    """``count`` UUIDv7 strings of one moment (a batch's records): one clock reading and
    one draw of randomness for all of them."""
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    stamp = (ms & ((1 << 48) - 1)) << 80 | _VERSION_AND_VARIANT
    randomness = os.urandom(10 * count)
    ids = []
    for start in range(0, 10 * count, 10):
        rand = int.from_bytes(randomness[start:start + 10], "big")
        # rand_a: its top 12 bits; rand_b: its low 62 bits.
        hexed = f"{stamp | (rand >> 68 & _RAND_A) << 64 | rand & _RAND_B:032x}"
        ids.append(f"{hexed[:8]}-{hexed[8:12]}-{hexed[12:16]}-{hexed[16:20]}-{hexed[20:]}")
    return ids


def utc_timestamp(moment: datetime | None = None) -> str:
    """RFC 3339 UTC with milliseconds, e.g. ``2026-11-29T18:40:00.123Z``."""
    moment = moment or datetime.now(UTC)
    moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def validate_common(body: Mapping[str, Any], keys: tuple[str, ...] = (
        "record_id", "created_at", "tenant")) -> None:
    """The members every tenant-scoped leaf has: non-empty strings."""
    for key in keys:
        if not isinstance(body.get(key), str) or not body[key]:
            raise CanonicalFormError("must be a non-empty string", field=f"record.{key}")
