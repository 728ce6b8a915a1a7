"""The service's tile routes on loopback over one log, with an auditor's and a tenant's
key (bank-a), for tests that read tiles over HTTP."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from aiohttp import web

from inference_wrapper.server.access import access_middleware
from inference_wrapper.server.app import request_context
from inference_wrapper.server.appkeys import KEYS, LEDGER, LIFECYCLE, METRICS
from inference_wrapper.server.metrics import Metrics
from inference_wrapper.server.route_table import ROUTE_ROLES, ROUTES
from inference_wrapper.server.supervisor import Lifecycle
from ledger.store.apikeys import ApiKeyStore
from ledger.store.sql import SqlLedger


@contextmanager
def tiles_service(ledger: SqlLedger) -> Iterator[tuple[str, dict[str, str]]]:
    """Yields the tiles prefix URL and a bearer token per role ("auditor", "client")."""
    keys = ApiKeyStore(ledger.engine)
    tokens = {role: keys.create("bank-a", role)[0] for role in ("auditor", "client")}
    # The service's error shapes and its access rule, with only the tile routes.
    app = web.Application(middlewares=[request_context, access_middleware(ROUTE_ROLES)])
    app[LEDGER], app[KEYS] = ledger, keys
    app[LIFECYCLE], app[METRICS] = Lifecycle(), Metrics()
    app.add_routes([web.route(r.method, r.pattern or r.path, r.handler)
                    for r in ROUTES if r.path.startswith("/tlog/")])
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}/tlog/", tokens
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()
