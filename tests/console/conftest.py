"""A real service on loopback (tiny model, SQLite ledger) with records to look at.

The records are one real generate call and synthetic records appended through the same
ledger, spread over two drivers and two tenants so that filters and the fingerprint
timeline have something to find.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from inference_wrapper.server.app import INTEGRATOR, KEYS, LEDGER, SIGNER, create_app
from inference_wrapper.server.settings import Settings
from ledger.checkpoint import Checkpoint
from ledger.cosignature import Cosigner
from ledger.store.migrate import upgrade
from ledger.store.sql import SqlLedger
from tests.records import make_record

MakeClient = Callable[..., Awaitable[Any]]
CSRF_FIELD = re.compile(r'name="csrf" value="([^"]+)"')
CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-gpu",
                 "--disable-background-networking", "--disable-component-update",
                 "--no-first-run", "--disable-sync"]


async def launch_chromium(playwright: Any) -> Any:
    """Debian's Chromium, headless, through Playwright."""
    executable = shutil.which("chromium")
    assert executable, "Debian's chromium is missing: run `make setup` (scripts/setup.sh)"
    return await playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS,
                                            headless=True)


@pytest.fixture()
async def browser() -> AsyncIterator[Any]:
    """A browser of the test's own (test_console_browser.py shares one per module)."""
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        launched = await launch_chromium(playwright)
        yield launched
        await launched.close()


@dataclass
class Console:
    client: Any  # aiohttp TestClient on a real loopback socket
    tokens: dict[str, str]
    verifier_key: str  # the log key an auditor pins (obtained out of band)
    generated_id: str  # a record made by a real generate call
    synthetic_ids: list[str]
    witness_key: str  # a witness that cosigned the latest checkpoint (pinned out of band)
    app: Any

    @property
    def base_url(self) -> str:
        return str(self.client.server.make_url("")).rstrip("/")


def synthetic(i: int) -> Any:
    # Records 0-3 on driver 550, 4-6 on 560: one driver change with 4 and 3 on each side.
    driver = "550.54.15" if i < 4 else "560.35.03"
    tenant = "bank-a" if i % 2 == 0 else "bank-b"
    return make_record(i, tenant=tenant, driver=driver, padding=10,
                       created_at=f"2026-11-30T09:{i:02d}:00.000Z")


@pytest.fixture()
async def console(aiohttp_client: MakeClient, tmp_path: Path, tiny_generator: Any) -> Console:
    return await open_console(aiohttp_client, tmp_path, tiny_generator)


async def open_console(aiohttp_client: MakeClient, tmp_path: Path, tiny_generator: Any
                       ) -> Console:
    """The service of ``console``, its client made by ``aiohttp_client`` (a module whose
    tests share one event loop brings its own)."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    # The past records first, before the service starts and logs its engine's environment
    # (now): the log refuses a leaf dated well before its newest one.
    upgrade(url)
    ids = []
    with SqlLedger(url) as history:
        for i in range(7):
            ids.append(history.append(synthetic(i)).record_id)
    settings = Settings(database_url=url, log_key_path=tmp_path / "log.key", max_wait_ms=5.0,
                        checkpoint_interval_s=0.2, anchor_interval_s=0.2)
    app = create_app(settings, tiny_generator)
    client = await aiohttp_client(app)
    keys = app[KEYS]
    tokens = {"client": keys.create("bank-a", "client")[0],
              "auditor": keys.create("audit-firm", "auditor")[0],
              "admin": keys.create("operator", "admin")[0]}
    answer = await (await client.post("/v1/generate", json={"prompt": "Hello console",
                                                            "max_new_tokens": 4},
                                      headers={"Authorization": f"Bearer {tokens['client']}"}
                                      )).json()
    witness = await asyncio.to_thread(cosign_latest, app)
    return Console(client, tokens, app[SIGNER].verifier().encode(), answer["record_id"], ids,
                   witness, app)


def cosign_latest(app: Any) -> str:
    """Seal what was appended and have a witness cosign it, as a witness service would."""
    app[INTEGRATOR].seal_now()
    latest = app[LEDGER].latest_checkpoint()
    witness = Cosigner("witness.example/w1", Ed25519PrivateKey.generate())
    now = int(time.time())
    line = witness.cosign(Checkpoint.peek(latest.note).body(), now)
    app[LEDGER].cosignatures.store(latest.size, witness.name, line, now)
    return witness.witness_key.encode()


async def sign_in(client: Any, token: str) -> Any:
    """The browser's sign-in: fetch the form (and its CSRF cookie), post the key."""
    form = await (await client.get("/console/login")).text()
    csrf = CSRF_FIELD.search(form)
    assert csrf is not None
    return await client.post("/console/login", data={"api_key": token, "csrf": csrf.group(1)},
                             allow_redirects=False)
