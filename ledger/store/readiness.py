"""Reading the readiness history (``readiness_history``) for reports: no serving stack."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Engine

from ledger import slo
from ledger.store.schema import readiness_history


def spans_between(engine: Engine, since: datetime, until: datetime) -> list[slo.ReadinessSpan]:
    """Every replica's spans overlapping ``[since, until)`` (the report reads these)."""
    with engine.connect() as conn:
        rows: list[Any] = list(conn.execute(
            select(readiness_history).where(readiness_history.c.ended_at >= since,
                                            readiness_history.c.started_at < until)
            .order_by(readiness_history.c.started_at)))
    return [slo.ReadinessSpan(r.replica, bool(r.ready), r.started_at, r.ended_at,
                              bool(r.clean_stop)) for r in rows]
