"""The stream start record ``audit-stream-start/v1``: written before a streamed answer.

A streamed request leaves two leaves. This one is committed before any token leaves the
server; it names the request (input commitment, fingerprints, parameters) but holds no
output. The request's ordinary ``audit-record/v1`` follows, committed before the final
chunk, and names this one in ``data.stream_start_record_id``. Pure: no I/O.

This module holds the kind's rules only (``ledger.record`` registers them); the builder,
which needs ``ledger.record``'s values, is ``ledger.record.build_stream_start``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ledger.errors import CanonicalFormError

STREAM_START_SCHEMA = "audit-stream-start/v1"
START_SECTIONS = ("model", "hardware", "software", "data")
START_KEYS = frozenset(("schema", "record_id", "created_at", "tenant", *START_SECTIONS))
START_DATA_KEYS = frozenset(("input_commitment", "input_bytes", "generation", "route"))


def validate_stream_start(body: Mapping[str, Any]) -> None:
    """The kind's own rules (``ledger.record.validate_body`` checks the common ones)."""
    keys = set(body)
    if keys != START_KEYS:
        wrong = sorted((START_KEYS - keys) | (keys - START_KEYS))
        raise CanonicalFormError(f"a stream start record has exactly {sorted(START_KEYS)}; "
                                 f"wrong: {wrong}", field="record")
    for section in START_SECTIONS:
        if not isinstance(body[section], Mapping):
            raise CanonicalFormError("must be an object", field=f"record.{section}")
    data = body["data"]
    if set(data) != START_DATA_KEYS:
        raise CanonicalFormError(f"must hold exactly {sorted(START_DATA_KEYS)}",
                                 field="record.data")
    if not isinstance(data["input_commitment"], str) or not data["input_commitment"]:
        raise CanonicalFormError("must be a non-empty string",
                                 field="record.data.input_commitment")
    if not isinstance(data["generation"], Mapping):
        raise CanonicalFormError("must be an object", field="record.data.generation")
