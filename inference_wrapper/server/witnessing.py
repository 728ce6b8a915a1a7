"""The service's witness client as an app resource: started after the anchor worker,
woken by it after each anchoring, stopped before it (README "Witnesses")."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from aiohttp import web

from inference_wrapper.server.appkeys import ANCHOR_WORKER, LEDGER, SETTINGS
from ledger.errors import InvalidInputError
from ledger.witness.client import WitnessClient, WitnessWorker, parse_witnesses

WITNESS_WORKER = web.AppKey("witness_worker", WitnessWorker)


async def witness_context(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    try:
        witnesses = parse_witnesses(settings.witnesses)
    except (ValueError, OSError) as exc:
        raise InvalidInputError("AUDIT_LEDGER_WITNESSES", str(exc)) from exc
    if not witnesses:
        yield
        return
    worker = WitnessWorker(WitnessClient(app[LEDGER], witnesses),
                           interval_s=settings.anchor_interval_s).start()
    app[WITNESS_WORKER] = worker
    app[ANCHOR_WORKER].after_anchor = worker.wake
    yield
    app[ANCHOR_WORKER].after_anchor = None
    await asyncio.to_thread(worker.stop)
