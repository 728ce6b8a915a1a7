"""The console in a real browser: Debian's Chromium driven by Playwright.

The page verifies records itself, so a lying server must be caught by the page. The
liar is a small aiohttp proxy on loopback in front of the real service that rewrites
the record page's evidence: altered record bytes (check 1 fails), a checkpoint signed
by another key (check 3 fails), a forged signature under the right key hash (check 3),
a tampered proof (check 2).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from playwright.async_api import Browser, Page, expect

from inference_wrapper.server.console_pages import verification_code_digest
from ledger.checkpoint import NoteSigner, NoteVerifier, SignedNote
from tests.console.conftest import Console, cosign_latest
from tests.console.shared_browser import browser, chromium, console

EVIDENCE = re.compile(r'(<script type="application/json" id="evidence">)(.*?)(</script>)', re.S)
TIMEOUT_MS = 60_000  # generous: a shared 2-core machine; nothing waits on a fixed delay
expect.set_options(timeout=TIMEOUT_MS)
# Set to a folder to keep the screenshots (the README's come from here).
SHOTS = os.environ.get("AUDIT_LEDGER_SCREENSHOTS")


# One browser for the module, so the module's tests and fixtures share one event loop.
pytestmark = pytest.mark.asyncio(loop_scope="module")
__all__ = ["browser", "chromium", "console"]  # the fixtures, imported for these tests


async def new_page(browser: Browser) -> Page:
    page = await browser.new_page(viewport={"width": 1200, "height": 900})
    page.set_default_timeout(TIMEOUT_MS)
    page.on("console", lambda message: print("browser console:", message.text))
    page.on("pageerror", lambda error: print("browser error:", error))
    return page


async def sign_in(page: Page, console: Console, token: str) -> None:
    await page.goto(f"{console.base_url}/console/login")
    await page.fill("#api-key", token)
    await page.click("#sign-in")


async def pin_and_verify(page: Page, url: str, key: str, witnesses: str = "") -> None:
    await page.goto(url)
    await page.fill("#pin-key", key)
    await page.fill("#pin-witnesses", witnesses)
    await page.click("#pin-button")
    await expect(page.locator("#verdict")).not_to_have_attribute("data-status", "pending")
    await expect(page.locator("#verdict")).not_to_have_attribute("data-status", "incomplete")


async def statuses(page: Page) -> dict[int, str]:
    return {n: str(await page.get_attribute(f"#check-{n}", "data-status")) for n in (1, 2, 3, 4)}


# --- the lying proxy -------------------------------------------------------------------


Lie = Callable[[dict[str, Any]], None]


def altered_bytes(evidence: dict[str, Any]) -> None:
    canonical = base64.b64decode(evidence["canonical_base64"])
    evidence["canonical_base64"] = base64.b64encode(
        canonical.replace(b'"tenant":"bank-a"', b'"tenant":"bank-z"')).decode()


def signed_by_another_key(evidence: dict[str, Any]) -> None:
    note = SignedNote.parse(evidence["checkpoint"].encode())
    origin = note.body.decode().split("\n", 1)[0]
    impostor = NoteSigner(origin, Ed25519PrivateKey.generate())
    evidence["checkpoint"] = impostor.sign(note.body).decode()


def forged_signature(evidence: dict[str, Any]) -> None:
    note = SignedNote.parse(evidence["checkpoint"].encode())
    name, key_hash, signature = note.signatures[0]
    forged = bytes([signature[0] ^ 1]) + signature[1:]
    evidence["checkpoint"] = SignedNote(note.body, ((name, key_hash, forged),)).serialize().decode()


def padding_bits_in_the_signature(evidence: dict[str, Any]) -> None:
    # The same signature bytes, spelled with non-zero base64 padding bits.
    note = evidence["checkpoint"]
    at = note.rindex("\n\n") + 2
    line, rest = note[at:].split("\n", 1)
    head, blob = line.rsplit(" ", 1)
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    last = len(blob.rstrip("=")) - 1  # the character holding the padding bits
    respelled = blob[:last] + alphabet[alphabet.index(blob[last]) | 1] + blob[last + 1:]
    assert respelled != blob and base64.b64decode(respelled) == base64.b64decode(blob)
    evidence["checkpoint"] = note[:at] + f"{head} {respelled}\n" + rest


def corrupted_copy_of_the_signature(evidence: dict[str, Any]) -> None:
    note = SignedNote.parse(evidence["checkpoint"].encode())
    name, key_hash, signature = note.signatures[0]
    copy = (name, key_hash, bytes([signature[0] ^ 1]) + signature[1:])
    evidence["checkpoint"] = SignedNote(note.body, (copy, *note.signatures)).serialize().decode()


def tampered_proof(evidence: dict[str, Any]) -> None:
    first = bytearray(bytes.fromhex(evidence["inclusion_proof"][0]))
    first[0] ^= 1
    evidence["inclusion_proof"][0] = first.hex()


async def lying_proxy(upstream: str, lie: Lie) -> TestServer:
    """Forwards everything to the real service, rewriting record pages' evidence."""
    async def forward(request: web.Request) -> web.Response:
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("cookie",)}
        async with aiohttp.ClientSession() as session, session.request(
                request.method, upstream + request.path_qs, headers=headers,
                data=await request.read(), allow_redirects=False) as answer:
            body = await answer.read()
            if request.path.startswith("/console/records/"):
                def rewrite(match: re.Match[str]) -> str:
                    evidence = json.loads(match.group(2))
                    lie(evidence)
                    return match.group(1) + json.dumps(evidence).replace("<", "\\u003c") + \
                        match.group(3)
                body = EVIDENCE.sub(rewrite, body.decode()).encode()
            keep = ("Content-Type", "Location", "Content-Security-Policy")
            return web.Response(status=answer.status, body=body,
                                headers={k: answer.headers[k] for k in keep
                                         if k in answer.headers})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server


# --- the tests -------------------------------------------------------------------------


async def test_sign_in_search_open_record_and_every_browser_check_passes(
        console: Console, browser: Browser) -> None:
    page = await new_page(browser)
    await sign_in(page, console, console.tokens["auditor"])
    await expect(page.locator("#results")).to_be_visible()
    assert console.tokens["auditor"] not in page.url
    await page.fill("input[name=tenant]", "bank-a")
    await page.click("#search")
    await expect(page.locator("#result-count")).to_have_text("5")  # generated + 4 synthetic
    await page.click(f"a[href^='/console/records/{console.generated_id}?leaf=']")
    await page.fill("#pin-key", console.verifier_key)
    await page.fill("#pin-witnesses", console.witness_key)
    await page.click("#pin-button")
    await expect(page.locator("#verdict")).to_have_attribute("data-status", "pass")
    assert await statuses(page) == {1: "pass", 2: "pass", 3: "pass", 4: "pass"}
    # A v2 record: its hardware and software are in the environment leaf it names.
    await expect(page.locator("table[data-section=environment-leaf]")).to_contain_text(
        "hardware.")
    # The operator's page says whose code checks it, and shows that code's digest.
    await expect(page.locator("#hosting")).to_have_attribute("data-hosted-by", "operator")
    await expect(page.locator("#code-digest")).to_have_text(verification_code_digest())
    if SHOTS:
        await page.screenshot(path=str(Path(SHOTS) / "console-record.png"))
        await page.goto(f"{console.base_url}/console/plots?since=2026-11-30T08:00")
        await page.locator("#changes").wait_for()
        await page.screenshot(path=str(Path(SHOTS) / "console-plots.png"), full_page=True)


async def test_a_stream_start_leaf_is_checked_with_its_environment_in_the_browser(
        console: Console, browser: Browser) -> None:
    # A streamed request leaves an audit-stream-start/v2 leaf naming the environment
    # leaf (decision 0043): the page opens and proves both, as for a record.
    response = await console.client.post(
        "/v1/completions", json={"model": "tiny-llama", "prompt": "Hello stream",
                                 "max_tokens": 3, "stream": True},
        headers={"Authorization": f"Bearer {console.tokens['client']}"})
    assert response.status == 200
    lines = [line for line in (await response.text()).splitlines()
             if line.startswith("data: {")]
    audit = json.loads(lines[-1][len("data: "):])["audit"]
    witness = await asyncio.to_thread(cosign_latest, console.app)
    page = await new_page(browser)
    await sign_in(page, console, console.tokens["auditor"])
    await pin_and_verify(page, f"{console.base_url}/console/records/"
                         f"{audit['stream_start_record_id']}"
                         f"?leaf={audit['stream_start_leaf_index']}",
                         console.verifier_key, witness)
    assert await statuses(page) == {1: "pass", 2: "pass", 3: "pass", 4: "pass"}
    await expect(page.locator("#check-2 .reason")).to_contain_text("environment")
    await expect(page.locator("table[data-section=environment-leaf]")).to_contain_text(
        "hardware.")
    # The completed record names that start leaf (decision 0050): the page carries it
    # and proves it in the same tree, as `audit-ledger verify` does.
    await pin_and_verify(page, f"{console.base_url}/console/records/{audit['record_id']}"
                         f"?leaf={audit['leaf_index']}", console.verifier_key, witness)
    assert await statuses(page) == {1: "pass", 2: "pass", 3: "pass", 4: "pass"}
    await expect(page.locator("#check-2 .reason")).to_contain_text(
        f"stream start leaf {audit['stream_start_leaf_index']}")


async def test_without_a_pinned_key_nothing_is_called_verified(
        console: Console, browser: Browser) -> None:
    page = await new_page(browser)
    await sign_in(page, console, console.tokens["auditor"])
    await page.goto(f"{console.base_url}/console/records/{console.generated_id}")
    await expect(page.locator("#verdict")).to_have_attribute("data-status", "incomplete")
    assert await statuses(page) == {1: "skipped", 2: "skipped", 3: "skipped", 4: "skipped"}


async def test_session_cookie_flags_as_the_browser_holds_them(
        console: Console, browser: Browser) -> None:
    page = await new_page(browser)
    await sign_in(page, console, console.tokens["admin"])
    await expect(page.locator("#results")).to_be_visible()
    cookies = {c["name"]: c for c in await page.context.cookies()}
    session = cookies["alc_session"]
    assert session["httpOnly"] is True
    assert session["sameSite"] == "Strict"
    assert session["expires"] > 0  # not a cookie that lives as long as the browser
    assert await page.evaluate("document.cookie") == ""  # script cannot read it


async def test_client_key_cannot_sign_in_from_the_browser(
        console: Console, browser: Browser) -> None:
    page = await new_page(browser)
    await sign_in(page, console, console.tokens["client"])
    await expect(page.locator("p.error")).to_have_attribute("data-status", "403")
    assert "alc_session" not in {c["name"] for c in await page.context.cookies()}


@pytest.mark.parametrize(("lie", "failed_check", "reason"), [
    (altered_bytes, 1, "record bytes hash to"),
    (signed_by_another_key, 3, "note carries no signature by key"),
    (forged_signature, 3, "does not verify"),
    (padding_bits_in_the_signature, 3, "not canonical base64"),
    (corrupted_copy_of_the_signature, 3, "one of its repeated lines"),
    (tampered_proof, 2, "calculated root"),
], ids=["altered-record-bytes", "checkpoint-signed-by-another-key", "forged-signature",
        "padding-bits-in-the-signature", "corrupted-copy-of-the-signature", "tampered-proof"])
async def test_lying_server_is_caught_by_the_page(
        console: Console, browser: Browser, lie: Lie, failed_check: int, reason: str) -> None:
    proxy = await lying_proxy(console.base_url, lie)
    try:
        page = await new_page(browser)
        await sign_in(page, console, console.tokens["auditor"])
        await expect(page.locator("#results")).to_be_visible()
        # The session cookie is the loopback host's; the proxy forwards it upstream.
        url = str(proxy.make_url(f"/console/records/{console.synthetic_ids[0]}"))
        await pin_and_verify(page, url, console.verifier_key, console.witness_key)
        await expect(page.locator("#verdict")).to_have_text(
            f"NOT verified: check {failed_check} failed")
        await expect(page.locator(f"#check-{failed_check} .reason")).to_contain_text(reason)
        checks = await statuses(page)
        if SHOTS and lie is altered_bytes:
            await page.screenshot(path=str(Path(SHOTS) / "console-record-lying.png"))
        assert checks[failed_check] == "fail"
        assert [n for n in (1, 2, 3, 4) if checks[n] == "fail"] == [failed_check]
    finally:
        await proxy.close()


async def test_the_pinned_key_in_these_tests_is_a_real_verifier_key(console: Console) -> None:
    # Each log has its own origin (name plus an identifier), and the key is named by it.
    name = NoteVerifier.decode(console.verifier_key).name
    assert name.startswith("audit-ledger.local/log/") and len(name) > len("audit-ledger.local/log/")


async def test_pinning_a_key_whose_base64_has_a_plus_sign(
        console: Console, browser: Browser) -> None:
    # A verifier key's base64 part may contain '+', the field separator: split at two.
    for _ in range(500):
        other = NoteSigner("audit-ledger.local/log", Ed25519PrivateKey.generate())
        text = other.verifier().encode()
        if "+" in text.split("+", 2)[2]:
            break
    else:
        raise AssertionError("no key with '+' in its base64 in 500 tries")
    page = await new_page(browser)
    await sign_in(page, console, console.tokens["auditor"])
    await expect(page.locator("#results")).to_be_visible()
    await pin_and_verify(page, f"{console.base_url}/console/records/{console.generated_id}",
                         text)
    await expect(page.locator("#pinned-key")).to_have_text(text)
    # Not the log's key: the page refuses the checkpoint at check 3.
    await expect(page.locator("#check-3 .reason")).to_contain_text(
        "note carries no signature by key")


async def test_the_pages_inclusion_fold_matches_rfc_9162_for_every_leaf_of_small_trees(
        console: Console, browser: Browser) -> None:
    """verify.js's proof folding against the RFC's own recursive definition (tests/
    merkle_reference.py), for every index of trees of 1 to 17 leaves, and one index off."""
    from ledger.merkle import hash_leaf
    from tests import merkle_reference

    page = await new_page(browser)
    await sign_in(page, console, console.tokens["auditor"])
    await page.goto(f"{console.base_url}/console/records/{console.generated_id}")
    cases = []
    for size in range(1, 18):
        entries = [f"entry {i}".encode() for i in range(size)]
        root = merkle_reference.mth(entries).hex()
        for index in range(size):
            cases.append({"leaf": hash_leaf(entries[index]).hex(), "index": index,
                          "size": size, "root": root,
                          "proof": [h.hex() for h in merkle_reference.path(index, entries)]})
    results = await page.evaluate("""async (cases) => {
        const out = [];
        for (const c of cases) {
            const proof = c.proof.map(unhex);
            const root = await rootFromInclusion(unhex(c.leaf), c.index, c.size, proof);
            let shifted = null;  // the same proof claimed for the next index must not hold
            try {
                shifted = hex(await rootFromInclusion(unhex(c.leaf), c.index + 1, c.size,
                                                      proof));
            } catch (err) { shifted = "error"; }
            out.push([hex(root) === c.root, shifted !== c.root]);
        }
        return out;
    }""", cases)
    assert len(results) == 153
    assert all(ok for ok, _ in results)
    assert all(moved for _, moved in results)


def unreadable_bytes(evidence: dict[str, Any]) -> None:
    evidence["canonical_base64"] = "%%% not base64 %%%"


async def test_evidence_the_page_cannot_read_is_a_failure_not_a_pass(
        console: Console, browser: Browser) -> None:
    proxy = await lying_proxy(console.base_url, unreadable_bytes)
    try:
        page = await new_page(browser)
        await sign_in(page, console, console.tokens["auditor"])
        await expect(page.locator("#results")).to_be_visible()
        await page.goto(str(proxy.make_url(f"/console/records/{console.generated_id}")))
        await page.fill("#pin-key", console.verifier_key)
        await page.click("#pin-button")
        await expect(page.locator("#verdict")).to_have_attribute("data-status", "fail")
        await expect(page.locator("#verdict")).to_contain_text("evidence is malformed")
    finally:
        await proxy.close()
