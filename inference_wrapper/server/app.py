"""The app factory: composes a generator, a ledger, an integrator and a batcher.

One cleanup context per resource, torn down in reverse: the batcher drains (every
queued request answered and its record committed), the integrator seals a last
checkpoint, the ledger commits what is queued and closes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web

from inference_wrapper.batcher import Batcher
from inference_wrapper.generator import AuditedGenerator
from inference_wrapper.server.metrics import Metrics
from inference_wrapper.server.problems import Problem
from inference_wrapper.server.settings import Settings
from inference_wrapper.server.tracing import PhaseTracer
from ledger.anchor.local import LocalAnchor
from ledger.anchor.worker import AnchorWorker
from ledger.checkpoint import NoteSigner
from ledger.store.apikeys import ApiKeyStore
from ledger.store.integrator import Integrator
from ledger.store.keys import load_or_create_signer
from ledger.store.migrate import upgrade
from ledger.store.sql import SqlLedger

log = logging.getLogger("audit_ledger.http")

SETTINGS = web.AppKey("settings", Settings)
GENERATOR = web.AppKey("generator", AuditedGenerator)
LEDGER = web.AppKey("ledger", SqlLedger)
SIGNER = web.AppKey("signer", NoteSigner)
KEYS = web.AppKey("api_keys", ApiKeyStore)
INTEGRATOR = web.AppKey("integrator", Integrator)
BATCHER = web.AppKey("batcher", Batcher)
METRICS = web.AppKey("metrics", Metrics)
TRACER = web.AppKey("tracer", PhaseTracer)
ANCHOR_WORKER = web.AppKey("anchor_worker", AnchorWorker)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def request_context(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Request id, problem+json for every error, one JSON log line per request."""
    request_id = request.headers.get("X-Request-Id") or uuid.uuid4().hex
    started = time.perf_counter()
    try:
        response = await handler(request)
    except Problem as problem:
        response = problem.response(instance=request.path)
    except web.HTTPException as exc:  # aiohttp's own: 404 route, 405, 413 body too large
        field = "body" if exc.status == 413 else None
        response = Problem(exc.status, exc.reason, exc.text or exc.reason,
                           field=field).response(instance=request.path)
    except Exception:
        log.exception("unhandled error", extra={"request_id": request_id})
        response = Problem(500, "Internal Server Error",
                           "the server failed; see its log for this request id").response()
    response.headers["X-Request-Id"] = request_id
    route = request.match_info.route.resource
    name = route.canonical if route is not None else "unmatched"
    request.app[METRICS].requests.labels(name, str(response.status)).inc()
    log.info(json.dumps({"request_id": request_id, "method": request.method,
                         "path": request.path, "status": response.status,
                         "ms": round((time.perf_counter() - started) * 1000, 2)}))
    return response


async def ledger_context(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    await asyncio.to_thread(upgrade, settings.database_url)
    ledger = SqlLedger(settings.database_url).start()
    app[LEDGER] = ledger
    app[SIGNER] = load_or_create_signer(settings.log_key_path, settings.origin)
    app[KEYS] = ApiKeyStore(ledger.engine)
    yield
    await asyncio.to_thread(ledger.close)


async def integrator_context(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    integrator = Integrator(app[LEDGER], app[SIGNER], settings.origin,
                            interval_s=settings.checkpoint_interval_s).start()
    app[INTEGRATOR] = integrator
    yield
    await asyncio.to_thread(integrator.stop)


def make_anchor(settings: Settings, ledger: SqlLedger, signer: NoteSigner) -> Any:
    """The local anchor, or the Fabric anchor when a gateway endpoint is configured."""
    verifier = signer.verifier()
    if not settings.fabric_gateway_endpoint:
        return LocalAnchor(ledger, verifier, settings.origin)
    from pathlib import Path

    from ledger.anchor.fabric import FabricAnchor, FabricGateway, Identity

    identity = Identity.from_files(settings.fabric_mspid, Path(settings.fabric_cert_path),
                                   Path(settings.fabric_key_path))
    gateway = FabricGateway(settings.fabric_gateway_endpoint, identity,
                            settings.fabric_channel, settings.fabric_chaincode,
                            tls_ca=Path(settings.fabric_tls_ca_path)
                            if settings.fabric_tls_ca_path else None)
    anchor = FabricAnchor(ledger, gateway, verifier, settings.origin)
    anchor.register()  # idempotent: the chaincode accepts the same key again
    return anchor


async def anchor_context(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    anchor = await asyncio.to_thread(make_anchor, settings, app[LEDGER], app[SIGNER])
    worker = AnchorWorker(app[LEDGER], anchor, interval_s=settings.anchor_interval_s,
                          lag_slo_s=settings.anchor_lag_slo_s,
                          policy=settings.anchor_slo_policy).start()
    app[ANCHOR_WORKER] = worker
    metrics = app[METRICS]
    metrics.anchor_lag.set_function(lambda: worker.status().lag_s)
    metrics.anchor_backlog.set_function(lambda: float(worker.status().backlog))
    yield
    await asyncio.to_thread(worker.stop)
    try:  # anchor what the final seal produced, if the anchor is reachable
        await asyncio.to_thread(worker.run_once)
    except Exception:
        log.warning("could not anchor the last checkpoint at shutdown; it stays pending")


async def batcher_context(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    metrics = app[METRICS]
    batcher = Batcher(app[GENERATOR], app[LEDGER], max_batch=settings.max_batch,
                      max_wait_ms=settings.max_wait_ms, queue_limit=settings.queue_limit,
                      observe=metrics.observe)
    batcher.start()
    app[BATCHER] = batcher
    ledger = app[LEDGER]

    def lag() -> float:
        size, _ = ledger.tree_head()
        latest = ledger.latest_checkpoint()
        return float(size - (latest.size if latest else 0))

    metrics.bind(lambda: float(batcher.depth), lag)
    yield
    await batcher.drain()


def create_app(settings: Settings, generator: AuditedGenerator) -> web.Application:
    from inference_wrapper.server.routes import ROUTES

    app = web.Application(client_max_size=settings.max_body_bytes,
                          middlewares=[request_context])
    app[SETTINGS] = settings
    app[GENERATOR] = generator
    app[METRICS] = Metrics()
    app[TRACER] = PhaseTracer(settings.otel_exporter)
    app.cleanup_ctx.extend([ledger_context, integrator_context, anchor_context,
                            batcher_context])
    app.add_routes([web.route(r.method, r.path, r.handler) for r in ROUTES])
    from inference_wrapper.server.console import setup_console
    setup_console(app)  # the auditor's console at /console
    return app
