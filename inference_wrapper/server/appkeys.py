"""Typed keys for what the app factory puts on the application.

In their own module so routes and the app factory both import them without importing
each other (the app imports the route table; the routes need only these keys).
"""

from __future__ import annotations

from aiohttp import web

from inference_wrapper.audit.batcher import Batcher
from inference_wrapper.audit.generator import AuditedGenerator
from inference_wrapper.server.idempotency import Idempotency
from inference_wrapper.server.journal import WatchedJournal
from inference_wrapper.server.metrics import Metrics
from inference_wrapper.server.settings import Settings
from inference_wrapper.server.supervisor import Lifecycle, Supervisor
from inference_wrapper.server.tracing import PhaseTracer
from ledger.anchor.worker import AnchorWorker
from ledger.checkpoint import NoteSigner
from ledger.store.apikeys import ApiKeyStore
from ledger.store.integrator import Integrator
from ledger.store.sql import SqlLedger
from ledger.store.vault import ContentVault

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
VAULT = web.AppKey("vault", ContentVault)
LIFECYCLE = web.AppKey("lifecycle", Lifecycle)
SUPERVISOR = web.AppKey("supervisor", Supervisor)
IDEMPOTENCY = web.AppKey("idempotency", Idempotency)
JOURNAL = web.AppKey("journal", WatchedJournal)

__all__ = ["ANCHOR_WORKER", "BATCHER", "GENERATOR", "INTEGRATOR", "KEYS", "LEDGER",
           "METRICS", "SETTINGS", "SIGNER", "TRACER", "VAULT",
           "LIFECYCLE", "SUPERVISOR", "IDEMPOTENCY", "JOURNAL"]
