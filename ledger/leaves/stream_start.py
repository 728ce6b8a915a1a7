"""The ``audit-stream-start/v2`` body: a streamed request's leaf, durable before its
first token leaves the server (decision records 0017, 0043).

It names the request without repeating the environment: ``environment`` is the
``environment/v1`` leaf (index and leaf hash) of the engine the request was admitted
under, as an ``audit-record/v2`` names its own. Content only as labelled HMAC
commitments under the caller's salts (the same salts, labels and values as the completed
record's, so each opens as the other does); no byte count, no unsalted digest. The
completed ``audit-record/v2`` names this leaf in ``stream.start_record_id``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ledger.canonical import canonical_bytes, json_number
from ledger.errors import CanonicalFormError
from ledger.leaf_base import new_record_id, utc_timestamp
from ledger.leaves import fields
from ledger.leaves.commitments import INPUT, STOP, USER, validate_commitments
from ledger.leaves.envelope import Leaf, seal, tenant_tag
from ledger.leaves.record_v2 import EnvironmentRef, validate_environment_ref

STREAM_START_KIND = "audit-stream-start/v2"
START_KEYS = frozenset(("schema", "record_id", "created_at", "tenant", "engine",
                        "environment", "commitments", "data"))
START_DATA_KEYS = frozenset(("generation", "route"))
# A route of the server's own table (e.g. /v1/chat/completions): never caller text.
ROUTE = re.compile(r"/[a-z0-9/_.-]{1,63}\Z")


def build_stream_start_v2(*, origin: str, tenant: str, engine: str,
                          environment: EnvironmentRef, commitments: Mapping[str, str],
                          generation: Mapping[str, Any], route: str,
                          record_id: str | None = None,
                          created_at: str | None = None) -> Leaf:
    """A streamed request's start leaf, tagged for ``tenant`` in the log ``origin``.
    ``commitments``: ``input`` and, when the request had them, ``stop`` and ``user``
    (``ledger.leaves.commitments.commit`` under the caller's salts)."""
    content: dict[str, Any] = {
        "schema": STREAM_START_KIND,
        "record_id": record_id or new_record_id(),
        "created_at": created_at or utc_timestamp(),
        "tenant": tenant,
        "engine": engine,
        "environment": environment.to_json(),
        "commitments": dict(commitments),
        "data": {"generation": {k: json_number(v) if isinstance(v, float) else v
                                for k, v in generation.items()},
                 "route": route},
    }
    validate_stream_start_v2(content)
    return seal(STREAM_START_KIND, content, canonical_bytes(content),
                tenant_tag(origin, tenant))


def validate_stream_start_v2(body: Mapping[str, Any]) -> None:
    """An ``audit-stream-start/v2`` body's rules: exact members, each of its kind."""
    where = "stream_start"
    fields.exact_members(body, START_KEYS, where)
    fields.common_members(body, STREAM_START_KIND, where)
    fields.engine(body["engine"], f"{where}.engine")
    validate_environment_ref(body["environment"])
    validate_commitments(body["commitments"], f"{where}.commitments",
                         required=frozenset((INPUT,)), optional=frozenset((STOP, USER)))
    data = fields.exact_members(body["data"], START_DATA_KEYS, f"{where}.data")
    fields.generation(data["generation"], f"{where}.data.generation")
    if not isinstance(data["route"], str) or not ROUTE.match(data["route"]):
        raise CanonicalFormError("must be a route path such as /v1/completions",
                                 field=f"{where}.data.route")
