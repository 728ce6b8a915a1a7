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
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76  # version
    value |= ((rand >> 68) & 0xFFF) << 64  # rand_a, 12 bits
    value |= 0b10 << 62  # variant
    value |= rand & ((1 << 62) - 1)  # rand_b, 62 bits
    hexed = f"{value:032x}"  # uuid.UUID's own formatting, without building one
    return f"{hexed[:8]}-{hexed[8:12]}-{hexed[12:16]}-{hexed[16:20]}-{hexed[20:]}"


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
