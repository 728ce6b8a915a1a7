"""This replica's part in a shared log: who holds the sealing lease, how old the last
seal is (for /readyz and /metrics)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from inference_wrapper.server.appkeys import INTEGRATOR, LEDGER, SETTINGS
from ledger.store.fencing import FencingReach
from ledger.store.log_api import LogReader


def last_seal(ledger: LogReader) -> tuple[float | None, str | None]:
    """(seconds since the latest checkpoint was sealed, which replica sealed it)."""
    latest = ledger.latest_checkpoint()
    if latest is None:
        return None, None
    age = (datetime.now(UTC).replace(tzinfo=None) - latest.sealed_at).total_seconds()
    return max(0.0, age), latest.sealed_by


def replica_status(app: web.Application) -> dict[str, Any]:
    """This replica's part in a shared log, for /readyz (informational, not a check)."""
    integrator = app[INTEGRATOR]
    age, sealed_by = last_seal(app[LEDGER])
    return {"id": integrator.replica_id, "holds_lease": integrator.holds_lease,
            "last_seal_age_s": None if age is None else round(age, 3),
            "latest_sealed_by": sealed_by, "origin": app[SETTINGS].origin,
            "fenced_writer_sessions": integrator.fenced_sessions,
            **fencing_status(integrator.fencing_reach)}


def fencing_status(reach: FencingReach | None) -> dict[str, Any]:
    """Whose stuck writers this replica can end (PostgreSQL, once known): a role that
    lacks pg_read_all_stats or pg_signal_backend fences only replicas of its own role."""
    if reach is None:
        return {}
    return {"fencing": {"other_roles": reach.other_roles, "role": reach.role,
                        "missing": list(reach.missing)}}
