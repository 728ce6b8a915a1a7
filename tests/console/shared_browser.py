"""One Chromium per test module (launching it and its driver is most of a browser test's
set-up), for modules whose tests and fixtures all run on one event loop: such a module
sets ``pytestmark = pytest.mark.asyncio(loop_scope="module")``, imports these fixtures
and declares its own async fixtures with ``loop_scope="module"``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from playwright.async_api import Browser, async_playwright

from tests.console.conftest import Console, launch_chromium, open_console


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def chromium() -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        launched = await launch_chromium(playwright)
        yield launched
        await launched.close()


@pytest_asyncio.fixture(loop_scope="module")
async def browser(chromium: Browser) -> AsyncIterator[Browser]:
    """The module's browser, holding nothing of an earlier test: each page a test opens
    has a context of its own (cookies, storage), and every context is closed after it."""
    assert chromium.contexts == []
    yield chromium
    for context in chromium.contexts:
        await context.close()


@pytest_asyncio.fixture(loop_scope="module")
async def console(tmp_path: Path, tiny_generator: Any) -> AsyncIterator[Console]:
    """The console of tests/console/conftest.py, its client on the module's loop."""
    clients: list[TestClient[Any, Any]] = []

    async def make_client(app: web.Application) -> TestClient[Any, Any]:
        client: TestClient[Any, Any] = TestClient(TestServer(app, host="127.0.0.1"))
        await client.start_server()
        clients.append(client)
        return client

    yield await open_console(make_client, tmp_path, tiny_generator)
    for client in clients:
        await client.close()
