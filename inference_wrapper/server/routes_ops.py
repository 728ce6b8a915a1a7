"""The operations routes: liveness, readiness and metrics (no key)."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from inference_wrapper.server.appkeys import (
    ANCHOR_WORKER,
    GENERATOR,
    JOURNAL,
    LEDGER,
    LIFECYCLE,
    METRICS,
    SUPERVISOR,
)
from inference_wrapper.server.replica import replica_status


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readiness_checks(app: web.Application) -> dict[str, bool]:
    """The named readiness checks (/readyz, and the SLO sampler's availability history)."""
    checks = {"engine_serving": any(e.alive() for e in app[GENERATOR].engines)}
    status = app[ANCHOR_WORKER].current()
    checks["anchoring_within_slo"] = (not status.slo_breached
                                      or app[ANCHOR_WORKER].policy == "keep-serving")
    try:
        await asyncio.to_thread(app[LEDGER].tree_head)
        checks["ledger_reachable"] = True
    except Exception:  # any failure to read the tree head means not ready
        checks["ledger_reachable"] = False
    # Reading is not enough: a full disk or a read-only file fails every append.
    checks["ledger_appending"] = JOURNAL not in app or app[JOURNAL].appending()
    # A misconfigured anchor (unknown channel or chaincode) is named here, not only logged.
    checks["anchor_configured"] = app[ANCHOR_WORKER].config_error is None
    checks.update(app[SUPERVISOR].status())
    return checks


async def readyz(request: web.Request) -> web.Response:
    checks = await readiness_checks(request.app)
    worker = request.app[ANCHOR_WORKER]
    # A misconfiguration, or an anchor holding another history than this log's: both
    # stop anchoring until an operator acts, so both are named here.
    anchor_error = worker.config_error or worker.conflict
    # Not one of the checks: a planned stop is not downtime in the SLO history.
    shutting_down = request.app[LIFECYCLE].shutting_down
    ready = all(checks.values()) and not shutting_down
    body: dict[str, Any] = {"ready": ready, "checks": checks}
    if shutting_down:
        body["shutting_down"] = True
    if anchor_error is not None:
        body["anchor_error"] = anchor_error
    if checks["ledger_reachable"]:
        body["replica"] = await asyncio.to_thread(replica_status, request.app)
    return web.json_response(body, status=200 if ready else 503)


async def metrics(request: web.Request) -> web.Response:
    payload = await asyncio.to_thread(generate_latest, request.app[METRICS].registry)
    return web.Response(body=payload, headers={"Content-Type": CONTENT_TYPE_LATEST})
