"""The app factory: composes a generator, a ledger, an integrator and a batcher.

One cleanup context per resource, torn down in reverse: the batcher drains (every
queued request answered and its record committed), the integrator seals a last
checkpoint, the ledger commits what is queued and closes.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from aiohttp import web
from prometheus_client import Gauge

from inference_wrapper.audit.batcher import Batcher
from inference_wrapper.audit.generator import AuditedGenerator, LogBinding
from inference_wrapper.engine.supervised import SupervisedEngine
from inference_wrapper.server import logging_setup
from inference_wrapper.server.access import access_middleware
from inference_wrapper.server.appkeys import (
    ANCHOR_WORKER,
    BATCHER,
    GENERATOR,
    IDEMPOTENCY,
    INTEGRATOR,
    JOURNAL,
    KEYS,
    LEDGER,
    LIFECYCLE,
    METRICS,
    SETTINGS,
    SIGNER,
    SUPERVISOR,
    TRACER,
    VAULT,
)
from inference_wrapper.server.console import setup_console
from inference_wrapper.server.content import vault_context
from inference_wrapper.server.generate_service import GENERATE, GenerateService
from inference_wrapper.server.idempotency import Idempotency
from inference_wrapper.server.journal import WatchedJournal
from inference_wrapper.server.metrics import Metrics
from inference_wrapper.server.problems import Problem, internal_error, problem_for
from inference_wrapper.server.replica import last_seal
from inference_wrapper.server.route_table import OPENAI_PATHS, ROUTE_ROLES, ROUTES, UNGATED_PATHS
from inference_wrapper.server.settings import Settings
from inference_wrapper.server.slo import check_settings, slo_context
from inference_wrapper.server.supervisor import Lifecycle, Supervisor
from inference_wrapper.server.tracing import PhaseTracer
from inference_wrapper.server.witnessing import witness_context
from ledger.anchor.local import LocalAnchor
from ledger.anchor.worker import AnchorWorker
from ledger.checkpoint import NoteSigner
from ledger.errors import LedgerError, WorkerDiedError
from ledger.store.apikeys import ApiKeyStore
from ledger.store.integrator import Integrator
from ledger.store.keys import LogIdentity, open_log_identity
from ledger.store.migrate import upgrade
from ledger.store.receipts import ReceiptStore
from ledger.store.sql import SqlLedger

log = logging.getLogger("audit_ledger.http")

# Re-exported: callers that imported the keys from here keep working.
__all__ = ["ANCHOR_WORKER", "BATCHER", "GENERATOR", "INTEGRATOR", "KEYS", "LEDGER",
           "METRICS", "SETTINGS", "SIGNER", "TRACER", "VAULT", "LIFECYCLE",
           "SUPERVISOR", "IDEMPOTENCY", "create_app"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# A caller's request id is echoed in headers, bodies and logs: only a short, plain token.
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def _request_id(request: web.Request) -> str:
    given = request.headers.get("X-Request-Id", "")
    return given if _REQUEST_ID.fullmatch(given) else uuid.uuid4().hex


def _from_http_exception(exc: web.HTTPException) -> Problem:
    """aiohttp's own errors (404 route, 405, 413 body too large) as problems."""
    field = "body" if exc.status == 413 else None
    headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else {}
    if exc.status == 405:
        allowed = headers.get("Allow", "")
        return Problem(405, "Method Not Allowed",
                       f"this route does not answer this method; allowed: {allowed}",
                       headers=headers)
    if exc.status == 413:
        return Problem(413, "Payload Too Large", "the request body is larger than this "
                       "server accepts", field=field)
    return Problem(exc.status, exc.reason, exc.reason, field=field, headers=headers)


@web.middleware
async def request_context(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Request id, one error shape per audience, latency per route, one log line."""
    request_id = _request_id(request)
    started = time.perf_counter()
    problem: Problem | None = None
    lifecycle = request.app[LIFECYCLE]
    try:
        if request.path in UNGATED_PATHS:
            response = await handler(request)
        else:
            if lifecycle.shutting_down:
                raise Problem(503, "Service Unavailable", "the service is shutting down",
                              headers={"Retry-After": "5", "Connection": "close"})
            with lifecycle.serving():  # the shutdown drain waits for these
                response = await handler(request)
    except Problem as exc:
        problem = exc
    except web.HTTPException as exc:
        problem = _from_http_exception(exc)
    except LedgerError as exc:  # the one error map decides the status
        problem = problem_for(exc)
    except Exception:
        log.exception("unhandled error", extra={"request_id": request_id})
        problem = internal_error(request_id)
    if problem is not None:
        if problem.status >= 500 and problem.request_id is None:
            problem.request_id = request_id
        response = (problem.openai_response() if request.path in OPENAI_PATHS
                    else problem.response(instance=request.path))
    response.headers["X-Request-Id"] = request_id
    if lifecycle.shutting_down:  # no keep-alive while draining: callers reconnect elsewhere
        response.force_close()
    elapsed = time.perf_counter() - started
    route = request.match_info.route.resource
    name = route.canonical if route is not None else "unmatched"
    # Methods are the caller's to choose: bound the label set, or memory grows with them.
    method = request.method if request.method in _METHODS else "other"
    request.app[METRICS].observe_http(name, method, response.status, elapsed)
    log.info(json.dumps({"request_id": request_id, "method": request.method,
                         "path": request.path, "status": response.status,
                         "ms": round(elapsed * 1000, 2)}))
    return response


async def mark_shutting_down(app: web.Application) -> None:
    """From here on new requests get 503; the cleanup contexts then drain the queue."""
    app[LIFECYCLE].shutting_down = True


def open_identity(settings: Settings, ledger: SqlLedger) -> LogIdentity:
    """The log's origin and signer; raises LogIdentityError when they are not this log's."""
    return open_log_identity(ledger, key_path=settings.log_key_path,
                             key_text=settings.log_signing_key, origin=settings.origin,
                             log_name=settings.log_name)


async def ledger_context(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    await asyncio.to_thread(upgrade, settings.database_url)
    from datetime import timedelta

    # The lag rule (docs/decisions/0037): what makes a time window a provable leaf range.
    ledger = SqlLedger(settings.database_url, pg=settings.pg_session(),
                       max_created_lag=timedelta(seconds=settings.max_created_lag_s)).start()
    app[LEDGER] = ledger
    try:
        identity = await asyncio.to_thread(open_identity, settings, ledger)
    except BaseException:
        await asyncio.to_thread(ledger.close)
        raise
    app[SIGNER] = identity.signer
    # From here on settings.origin is the log's origin, whatever was configured.
    app[SETTINGS] = replace(settings, origin=identity.origin)
    keys = ApiKeyStore(ledger.engine, cache_ttl_s=settings.api_key_cache_ttl_s)
    await asyncio.to_thread(keys.start_refresh)  # requests authenticate from memory
    app[KEYS] = keys
    yield
    await asyncio.to_thread(keys.stop_refresh)
    await asyncio.to_thread(ledger.close)


async def receipts_context(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    # Answers are stored encrypted under the tenant's KEK: an erasure kills them too.
    store = ReceiptStore(app[LEDGER].engine, ttl_s=settings.idempotency_ttl_s,
                         keks=app[VAULT].keks)
    idempotency = Idempotency(store, settings.request_timeout_s,
                              settle_timeout_s=settings.shutdown_grace_s)
    app[IDEMPOTENCY] = idempotency
    try:
        await idempotency.recover()  # claims of this host's dead processes are freed
    except Exception:  # the database is away: such claims go stale as before
        log.warning("could not look for idempotency claims of dead processes")

    async def purge() -> None:
        while True:
            try:
                purged = await asyncio.to_thread(store.purge)
                if purged:
                    log.info("purged %d expired idempotency receipts", purged)
            except Exception:  # the database is away; try again next time
                log.warning("could not purge expired idempotency receipts")
            await asyncio.sleep(settings.idempotency_purge_interval_s)

    purger = asyncio.get_running_loop().create_task(purge(), name="receipts-purge")
    yield
    purger.cancel()
    await idempotency.settle()  # answers still being stored are stored before closing


async def integrator_context(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    integrator = Integrator(app[LEDGER], app[SIGNER], settings.origin,
                            interval_s=settings.checkpoint_interval_s,
                            replica_id=settings.replica_id or None).start()
    app[INTEGRATOR] = integrator
    publisher = None
    if settings.tiles_publish_to:
        from ledger.publish.worker import PublishWorker, open_sink

        publisher = PublishWorker(app[LEDGER], open_sink(settings.tiles_publish_to,
                                                         settings.tiles_retention_days),
                                  settings.tiles_publish_interval_s).start()
        integrator.subscribe(publisher.wake)
    app[METRICS].bind_replica(integrator.replica_id, lambda: integrator.holds_lease,
                              lambda: last_seal(app[LEDGER]),
                              lambda: integrator.fenced_sessions,
                              lambda: None if integrator.fencing_reach is None
                              else integrator.fencing_reach.other_roles)
    yield
    await asyncio.to_thread(integrator.stop)
    if publisher is not None:
        await asyncio.to_thread(publisher.stop)


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
    # Registration (InitLog) happens in the anchoring worker, with backoff: start-up
    # never waits for the peer.
    return FabricAnchor(ledger, gateway, verifier, settings.origin)


async def anchor_context(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    anchor = await asyncio.to_thread(make_anchor, settings, app[LEDGER], app[SIGNER])
    integrator = app[INTEGRATOR]
    # One anchorer: the lease holder (checked live, so a replica that froze and lost its
    # lease does not anchor on waking up).
    worker = AnchorWorker(app[LEDGER], anchor, interval_s=settings.anchor_interval_s,
                          lag_slo_s=settings.anchor_lag_slo_s,
                          policy=settings.anchor_slo_policy,
                          leader=integrator.lease.try_acquire).start()
    app[INTEGRATOR].subscribe(worker.wake)  # anchor each checkpoint as soon as it is sealed
    app[ANCHOR_WORKER] = worker
    metrics = app[METRICS]
    # In-memory state, refreshed by the worker's own thread: scraping never queries.
    metrics.anchor_lag.set_function(lambda: worker.current().lag_s)
    metrics.anchor_backlog.set_function(lambda: float(worker.current().backlog))
    metrics.anchor_failures.set_function(lambda: float(worker.failures))
    metrics.anchor_conflict.set_function(lambda: float(worker.conflict is not None))
    yield
    await asyncio.to_thread(worker.stop)
    try:  # anchor what the final seal produced, if the anchor is reachable and we lead
        if await asyncio.to_thread(integrator.lease.try_acquire):
            await asyncio.to_thread(worker.run_once)
    except Exception:
        log.warning("could not anchor the last checkpoint at shutdown; it stays pending")


async def engine_context(app: web.Application) -> AsyncIterator[None]:
    """Start the engine processes (each loads and verifies its model) before serving;
    close them once the batcher has drained. In-process engines need neither."""
    generator = app[GENERATOR]
    supervised = [e for e in generator.engines if isinstance(e, SupervisedEngine)]
    try:
        for engine in supervised:
            engine.on_environment = functools.partial(_engine_environment, generator)
        # Side by side: each loads its own model; the slowest one sets the start-up time.
        await asyncio.gather(*(e.start() for e in supervised if not e.alive()))
        yield
    finally:
        for engine in supervised:
            await engine.close()


def _engine_environment(generator: AuditedGenerator, environment: Mapping[str, Any]) -> None:
    """An engine (re)started: refuse another model or contract; its records name the
    environment it reports from now on."""
    generator.check_environment(environment)
    log.info("engine %s environment: %s on %s", environment["engine"],
             environment["model"]["name"], environment["hardware"].get("accelerator_model")
             or environment["hardware"].get("cpu_model"))


async def batcher_context(app: web.Application) -> AsyncIterator[None]:
    from inference_wrapper.server.content import retain_hook

    settings = app[SETTINGS]
    metrics = app[METRICS]
    journal = app[JOURNAL] = WatchedJournal(app[LEDGER])
    batcher = Batcher(app[GENERATOR], journal, max_batch=settings.max_batch,
                      max_wait_ms=settings.max_wait_ms, queue_limit=settings.queue_limit,
                      observe=metrics.observe, retain=retain_hook(app[VAULT]),
                      retain_needed=app[VAULT].may_keep_content)
    # Records are audit-record/v2 leaves naming their engine's environment leaf (decision
    # 0026): each running engine's goes into the log now, before any record; an engine
    # that starts, restarts or changes later gets its leaf before its first batch's records.
    batcher.log = LogBinding(settings.origin)
    for engine in app[GENERATOR].engines:
        if engine.alive():
            await batcher.log_environment(engine.environment())
    batcher.start()
    app[BATCHER] = batcher
    app[GENERATE] = GenerateService(app[GENERATOR], batcher, app[IDEMPOTENCY], app[TRACER],
                                    metrics, app[ANCHOR_WORKER], settings.request_timeout_s)
    ledger = app[LEDGER]

    def lag() -> float:
        size, _ = ledger.tree_head()
        latest = ledger.latest_checkpoint()
        return float(size - (latest.size if latest else 0))

    def checkpoint_age() -> float:
        latest = ledger.latest_checkpoint()
        if latest is None:
            return float("nan")  # nothing sealed yet: no age to report
        return max(0.0, (datetime.now(UTC).replace(tzinfo=None) - latest.sealed_at)
                   .total_seconds())

    metrics.bind(lambda: float(batcher.depth), lag)
    metrics.bind_service(in_model=lambda: float(batcher.in_model),
                         checkpoint_age=checkpoint_age)
    Gauge("audit_outstanding_requests", "requests waiting, generating, being recorded or "
          "queued for the ledger (the one bound: queue_limit)",
          registry=metrics.registry).set_function(lambda: float(batcher.outstanding))
    Gauge("audit_requests_dropped_before_generate", "queued requests dropped because their "
          "caller had gone", registry=metrics.registry).set_function(
              lambda: float(batcher.dropped))
    Gauge("audit_log_records_dropped", "log lines dropped because the log output stalled",
          registry=metrics.registry).set_function(
              lambda: float(logging_setup.ACTIVE.dropped if logging_setup.ACTIVE else 0))
    yield
    await batcher.drain(timeout_s=settings.shutdown_grace_s)


async def supervisor_context(app: web.Application) -> AsyncIterator[None]:
    ledger, batcher = app[LEDGER], app[BATCHER]
    integrator, anchor_worker = app[INTEGRATOR], app[ANCHOR_WORKER]
    lifecycle = app[LIFECYCLE]
    # Waiters of the ledger queue are failed by the dying writer itself; the batcher's
    # waiters are failed here, whichever worker died.
    lifecycle.on_fatal.insert(0, lambda name: batcher.fail_all(WorkerDiedError(name)))
    supervisor = Supervisor({
        "ledger-writer": lambda: ledger.writer_alive,
        "batcher": lambda: batcher.alive,
        "integrator": lambda: integrator.alive,
        "anchor-worker": lambda: anchor_worker.alive,
    }, lifecycle)
    app[SUPERVISOR] = supervisor
    supervisor.start()
    yield
    await supervisor.stop()


def create_app(settings: Settings, generator: AuditedGenerator, *,
               on_fatal: Callable[[str], None] | None = None) -> web.Application:
    """``on_fatal(worker)`` runs once if a worker dies (the CLI stops the process)."""
    check_settings(settings)  # a bad SLO setting is refused before anything starts
    app = web.Application(client_max_size=settings.max_body_bytes,
                          middlewares=[request_context, access_middleware(ROUTE_ROLES)])
    app[SETTINGS] = settings
    app[GENERATOR] = generator
    app[METRICS] = Metrics()
    app[TRACER] = PhaseTracer(settings.otel_exporter)
    lifecycle = app[LIFECYCLE] = Lifecycle(on_fatal=[on_fatal] if on_fatal else [])
    app[METRICS].in_flight.set_function(lambda: float(lifecycle.in_flight))
    app.on_shutdown.append(mark_shutting_down)
    app.cleanup_ctx.extend([ledger_context, vault_context, receipts_context, integrator_context,
                            anchor_context, witness_context, engine_context, batcher_context,
                            supervisor_context, slo_context])
    app.add_routes([web.route(r.method, r.pattern or r.path, r.handler) for r in ROUTES])
    setup_console(app)  # the auditor's console at /console
    return app
