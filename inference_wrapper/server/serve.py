"""Run the app on a TCP port until SIGTERM/SIGINT, then drain with the listener still open.

``web.run_app`` closes the listening socket the moment the signal arrives, so a caller
that opens a new connection during the drain is refused, not told why. Here the first
signal only sets the lifecycle's shutting-down flag: new requests get 503 "the service is
shutting down" (with ``Retry-After`` and ``Connection: close``) and ``/readyz`` turns 503,
while requests already in flight finish. Once none is left (or the drain window, the
request timeout, has passed) the listener closes and the app's cleanup contexts run as
before: the queue drains, the last checkpoint is sealed, the workers stop.

A second signal ends the drain window at once (requests still in flight are cut off after
a short grace; the seal and close still run). The handlers are then removed, so a third
signal has its default effect and stops the process outright.
"""

from __future__ import annotations

import asyncio
import logging
import signal

from aiohttp import web

from inference_wrapper.server.appkeys import LIFECYCLE, SETTINGS

log = logging.getLogger("audit_ledger.serve")

# After the drain, what is still running is a response being written out or a 503 just
# answered: aiohttp waits this long for each before cancelling it.
STRAGGLER_GRACE_S = 5.0
# A request line long enough for the longest search the API document allows: six
# filters of 256 characters, each percent-encoded at up to 12 bytes a character, with
# the cursor and times (aiohttp's default, 8190, answers a longer one with a plain-text
# 400 that the document cannot describe).
MAX_REQUEST_LINE = 32_768
SIGNALS = (signal.SIGTERM, signal.SIGINT)


def make_runner(app: web.Application) -> web.AppRunner:
    # aiohttp's keep-alive timer also runs from the moment a connection opens and closes
    # it while no whole request head has arrived: the header read timeout.
    return web.AppRunner(app, access_log=None, shutdown_timeout=STRAGGLER_GRACE_S,
                         keepalive_timeout=app[SETTINGS].header_read_timeout_s,
                         max_line_size=MAX_REQUEST_LINE)


async def serve(app: web.Application, host: str, port: int, *, drain_timeout_s: float) -> None:
    """Serve ``app`` until signalled, drain, clean up (see the module's docstring)."""
    loop = asyncio.get_running_loop()
    lifecycle = app[LIFECYCLE]
    stop, hurry = asyncio.Event(), asyncio.Event()

    def on_signal(signum: signal.Signals) -> None:
        if not stop.is_set():
            lifecycle.shutting_down = True  # at once, before any other callback runs
            stop.set()
            return
        log.warning("%s again: ending the drain now", signum.name)
        hurry.set()
        for sig in SIGNALS:  # a further signal gets the default action
            loop.remove_signal_handler(sig)

    for sig in SIGNALS:
        loop.add_signal_handler(sig, on_signal, sig)
    runner = make_runner(app)
    try:
        await runner.setup()  # the cleanup contexts start here (a signal meanwhile waits)
        try:
            if not stop.is_set():
                await web.TCPSite(runner, host, port).start()
                await stop.wait()
            log.info("shutting down: new requests get 503; waiting up to %gs for %d in "
                     "flight", drain_timeout_s, lifecycle.in_flight)
            waits = [asyncio.ensure_future(lifecycle.drained()),
                     asyncio.ensure_future(hurry.wait())]
            await asyncio.wait(waits, timeout=drain_timeout_s,
                               return_when=asyncio.FIRST_COMPLETED)
            for waiting in waits:
                waiting.cancel()
            if lifecycle.in_flight:
                log.warning("drain window ended with %d requests in flight",
                            lifecycle.in_flight)
        finally:
            await runner.cleanup()  # closes the listener, then the cleanup contexts
    finally:
        for sig in SIGNALS:
            loop.remove_signal_handler(sig)


def run(app: web.Application, host: str, port: int, *, drain_timeout_s: float) -> None:
    """``serve`` on a fresh event loop, closed as ``web.run_app`` closes its own: tasks
    left are cancelled, and executor threads are not waited for (one stuck in a database
    call must not hold the exit)."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(serve(app, host, port, drain_timeout_s=drain_timeout_s))
    finally:
        try:
            left = asyncio.all_tasks(loop)
            for task in left:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()
