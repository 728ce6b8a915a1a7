"""Searching in a real browser: pick-lists, a part of a name, previous and next pages,
sorting by time, and control characters that a filter can find (issue 26).

Each test runs on both consoles: the operator's (signed in) and the auditor's own
(``audit-ledger console``), which asks the operator's API the same search (decision
0047), so both must find the same records."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from playwright.async_api import Browser, Page, expect

from inference_wrapper.server.app import KEYS, LEDGER
from ledger.record import AuditRecord, build_record
from tests.console.conftest import Console
from tests.console.shared_browser import browser, chromium, console
from tests.console.test_console_browser import SHOTS, new_page, sign_in
from tests.console.test_local_console import start_local

pytestmark = pytest.mark.asyncio(loop_scope="module")  # one browser for the module
__all__ = ["browser", "chromium", "console"]  # the fixtures, imported for these tests

RLO = "\u202e"


@pytest_asyncio.fixture(params=["operator", "local"], loop_scope="module")
async def open_console(request: pytest.FixtureRequest, console: Console, browser: Browser
                       ) -> AsyncIterator[Callable[[str], object]]:
    """Opens the search page with a key: signed in to the operator's console, or on an
    auditor's own console started with that key."""
    stops: list[Callable[[], None]] = []

    async def open_with(token: str) -> Page:
        page = await new_page(browser)
        if request.param == "operator":
            await sign_in(page, console, token)
        else:
            local, stop = await start_local(console.base_url, token)
            stops.append(stop)
            await page.goto(local.url)
        await expect(page.locator("#results")).to_be_visible()
        return page

    yield open_with
    for stop in stops:
        await asyncio.to_thread(stop)


def named(i: int, tenant: str, name: str, driver: str, moment: datetime) -> AuditRecord:
    return build_record(
        tenant=tenant, model={"name": name, "digest": f"sha256:{i:064x}", "pinned": True},
        hardware={"accelerator": "cuda", "accelerator_model": "NVIDIA H200",
                  "driver_version": driver},
        software={"torch": {"version": "2.6.0", "git_version": "c" * 40},
                  "service": {"git_revision": "d" * 40, "dirty": False}},
        data={"input_commitment": f"sha256:{i:064x}",
              "output_commitment": f"sha256:{i + 1:064x}"},
        timings_ms={"forward": 1.0}, created_at=moment.isoformat(timespec="milliseconds")
        .replace("+00:00", "Z"))


async def add_named(console: Console) -> None:
    """Three more bank-a records, dated now: names whose '_' must not be a wildcard, and a
    driver with a right-to-left override that displays as 550.54.15."""
    now = datetime.now(UTC)
    rows = [named(900, "bank-a", "Llama_3 8B", "550.54.15", now),
            named(901, "bank-a", "LlamaX3 8B", "550.54.15", now + timedelta(seconds=1)),
            named(902, "bank-a", "Mistral 7B", f"{RLO}51.45.055", now + timedelta(seconds=2))]
    for row in rows:
        await asyncio.to_thread(console.app[LEDGER].append, row)


async def options(page: Page, name: str) -> list[str]:
    return await page.locator(f"#known-{name} option").evaluate_all(
        "nodes => nodes.map(n => n.value)")


async def cells(page: Page, column: int) -> list[str]:
    return await page.locator(f"#results tbody tr td:nth-child({column})").all_inner_texts()


async def search(page: Page, **fields: str) -> None:
    for name, value in fields.items():
        if name in ("sort", "match"):
            await page.select_option(f"#{name}", value)
        else:
            await page.fill(f"[name={name}]", value)
    await page.click("#search")
    await expect(page.locator("#results")).to_be_visible()


async def test_pick_lists_and_a_part_of_a_name_with_literal_wildcards(
        console: Console, open_console: Any) -> None:
    await add_named(console)
    page = await open_console(console.tokens["auditor"])
    assert {"Llama_3 8B", "LlamaX3 8B", "Mistral 7B", "tiny"} <= set(
        await options(page, "model_name"))
    assert {"550.54.15", "560.35.03", "<U+202E>51.45.055"} <= set(
        await options(page, "driver_version"))
    assert "NVIDIA H200" in await options(page, "accelerator_model")
    # "lama_3" is a part of Llama_3 only: "_" is no wildcard (LlamaX3 would match one).
    await search(page, model_name="lama_3")
    await expect(page.locator("#total-count")).to_have_text("1")
    assert await cells(page, 5) == ["Llama_3 8B"]
    # Any case; the whole name when asked.
    await search(page, model_name="LLAMAX3")
    await expect(page.locator("#total-count")).to_have_text("1")
    assert await cells(page, 5) == ["LlamaX3 8B"]
    await search(page, model_name="Llama", match="whole")
    await expect(page.locator("#total-count")).to_have_text("0")
    await search(page, model_name="Llama_3 8B", match="whole")
    await expect(page.locator("#total-count")).to_have_text("1")
    # The override shows as <U+202E>; what the list shows is what finds the record.
    await search(page, model_name="", driver_version="<U+202E>51.45.055", match="part")
    await expect(page.locator("#total-count")).to_have_text("1")
    assert await cells(page, 8) == ["<U+202E>51.45.055"]
    await search(page, driver_version="550.54.15")
    assert "Mistral 7B" not in await cells(page, 5)  # 550.54.15 is not what it holds
    if SHOTS and page.url.startswith(console.base_url):
        await search(page, driver_version="", sort="-time")
        await page.screenshot(path=str(Path(SHOTS) / "console-search.png"), full_page=True)


async def test_a_tenant_scoped_session_lists_only_its_tenants_values(
        console: Console, open_console: Any) -> None:
    await add_named(console)
    token, _ = console.app[KEYS].create("bank-b", "admin")
    page = await open_console(token)
    assert await options(page, "driver_version") == ["550.54.15", "560.35.03"]
    assert await options(page, "model_name") == ["tiny"]  # bank-a's names are not shown


async def test_newest_and_oldest_first_with_next_and_previous_pages(
        console: Console, open_console: Any) -> None:
    await add_named(console)
    page = await open_console(console.tokens["auditor"])
    # Every record, newest first, a page of 3 at a time, to the end and back again.
    await search(page, sort="-time", limit="3")
    await expect(page.locator("#total-count")).to_have_text("12")  # with the environment leaf
    pages = [await cells(page, 2)]
    times = await cells(page, 3)
    await expect(page.locator("#previous-page")).to_have_count(0)
    while await page.locator("#next-page").count():
        await page.click("#next-page")
        await expect(page.locator("#previous-page")).to_be_visible()
        pages.append(await cells(page, 2))
        times += await cells(page, 3)
    assert [len(p) for p in pages] == [3, 3, 3, 3]
    assert times == sorted(times, reverse=True)
    ids = [i for p in pages for i in p]
    assert len(set(ids)) == 12
    for expected in reversed(pages[:-1]):  # previous gives back each page as it was
        await page.click("#previous-page")
        await expect(page.locator("#results tbody tr")).to_have_count(3)
        assert await cells(page, 2) == expected
    await expect(page.locator("#previous-page")).to_have_count(0)
    # Oldest first is the same records the other way round.
    await search(page, sort="time", limit="20")
    assert await cells(page, 2) == ids[::-1]
