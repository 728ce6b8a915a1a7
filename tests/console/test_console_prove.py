""""Prove this answer complete" in a real browser: a search with a time window offers the
proof on its own page, which reads the window's leaves from the log's tiles and checks
them against the latest signed checkpoint (issue 26 item 4, issue 24)."""

from __future__ import annotations

import re

import pytest
from playwright.async_api import Browser, expect

from inference_wrapper.server import console_prove
from inference_wrapper.server.app import KEYS
from tests.console.conftest import Console
from tests.console.conftest import sign_in as http_sign_in
from tests.console.shared_browser import browser, chromium, console
from tests.console.test_console_browser import new_page, sign_in

pytestmark = pytest.mark.asyncio(loop_scope="module")  # one browser for the module
__all__ = ["browser", "chromium", "console"]  # the fixtures, imported for these tests

# The synthetic records are dated 2026-11-30 09:00-09:06; the service's own leaves, now.
WINDOW = "since=2026-11-30T08:00&until=2026-11-30T10:00"
VOUCHED = (r"; checkpoint size (\d+) vouched for by "
           r"(an anchor \(local:[^)]*\)|only the log key \(neither witnessed nor anchored\))$")


async def test_a_windowed_search_is_proven_complete(console: Console,
                                                    browser: Browser) -> None:
    page = await new_page(browser)
    await sign_in(page, console, console.tokens["auditor"])
    await page.goto(f"{console.base_url}/console?{WINDOW}&driver_version=550.54.15"
                    "&match=whole")
    await expect(page.locator("#total-count")).to_have_text("4")
    await page.click("#prove-complete")
    verdict = page.locator("#proof-verdict")
    await expect(verdict).to_be_visible()
    text = await verdict.inner_text()
    # Records 0-3 are on driver 550; leaves [0, 8) are read: the window and the leaf after.
    assert re.fullmatch(r"complete: every leaf in \[0, 8\) read and checked, 4 matched"
                        + VOUCHED, text), text
    assert "operator-hosted proof" in await page.locator("#operator-hosted").inner_text()
    # A search without both ends of a window is not offered the proof.
    await page.goto(f"{console.base_url}/console?driver_version=550.54.15&match=whole")
    await expect(page.locator("#results")).to_be_visible()
    assert await page.locator("#prove-complete").count() == 0


async def test_a_tenant_session_proves_only_its_own_tenants_answer(
        console: Console, browser: Browser) -> None:
    token, _ = console.app[KEYS].create("bank-a", "admin")
    page = await new_page(browser)
    await sign_in(page, console, token)
    await page.goto(f"{console.base_url}/console?{WINDOW}")
    await expect(page.locator("#total-count")).to_have_text("4")  # records 0, 2, 4, 6
    await page.click("#prove-complete")
    text = await page.locator("#proof-verdict").inner_text()
    assert re.fullmatch(r"complete: every leaf in \[0, 8\) read and checked, 4 matched"
                        + VOUCHED, text), text
    html = await page.content()
    assert not any(record_id in html for record_id in console.synthetic_ids[1::2])
    # Another tenant's answer is refused, naming the field.
    refused = await page.goto(f"{console.base_url}/console/prove?{WINDOW}&tenant=bank-b")
    assert refused is not None and refused.status == 403
    assert await page.locator('[data-field="tenant"]').count() == 1


async def test_a_window_beyond_the_cap_is_refused_before_anything_is_read(
        console: Console, monkeypatch: pytest.MonkeyPatch) -> None:
    # The cap, lowered to below the window's 7 synthetic leaves; the real one is 200,000.
    monkeypatch.setattr(console_prove, "PROVE_MAX_LEAVES", 6)
    read: list[int] = []
    monkeypatch.setattr(console_prove, "prove", lambda *args: read.append(1) or "complete")
    await http_sign_in(console.client, console.tokens["auditor"])
    refused = await console.client.get(f"/console/prove?{WINDOW}")
    assert refused.status == 422
    text = await refused.text()
    assert 'data-field="until"' in text and "holds 7 leaves" in text
    assert "audit-ledger" in text and read == []
    # At the cap the proof runs.
    monkeypatch.setattr(console_prove, "PROVE_MAX_LEAVES", 7)
    assert (await console.client.get(f"/console/prove?{WINDOW}")).status == 200
    assert read == [1]
