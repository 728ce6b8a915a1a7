"""The auditor's own console (`audit-ledger console --server URL`) in a real browser,
against a lying operator.

The liar is an aiohttp proxy on loopback in front of the real service that rewrites the
API's evidence answers (JSON) the local console fetches, and serves its own
verify.js. The local console runs in a thread, exactly as the command runs it; the
page's verification code comes from this checkout. Each lie must fail the check that
names it; the honest path must pass only with the log key and the witness pinned.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import threading
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from playwright.async_api import Browser, Page, expect

from audit_cli.local_console import LocalConsole, serve_console
from inference_wrapper.server.app import LEDGER, SIGNER
from inference_wrapper.server.console_pages import ASSETS, verification_code_digest
from ledger.checkpoint import Checkpoint, NoteSigner
from ledger.client.sources import ServerSource
from ledger.merkle import MemoryTree, hash_leaf
from tests.console.conftest import Console
from tests.console.test_console_browser import new_page, sign_in, statuses

# path -> JSON answer -> (possibly rewritten) answer; ``fetch`` reads the real service.
Fetch = Callable[[str], Awaitable[dict[str, Any]]]
Lie = Callable[[str, dict[str, Any], Fetch, Console], Awaitable[dict[str, Any]]]
EVIL_SCRIPT = b"""document.addEventListener("DOMContentLoaded", () => {
  for (const n of [1, 2, 3, 4]) document.getElementById("check-" + n).dataset.status = "pass";
  const v = document.getElementById("verdict");
  v.dataset.status = "pass"; v.textContent = "VERIFIED in this browser: checks 1-4 passed";
});"""


async def no_lie(path: str, answer: dict[str, Any], fetch: Fetch, c: Console) -> dict[str, Any]:
    return answer


def victim(c: Console) -> str:
    return c.synthetic_ids[0]


async def record_swap(path: str, answer: dict[str, Any], fetch: Fetch,
                      c: Console) -> dict[str, Any]:
    """Record B's genuine evidence served under record A's URL."""
    quoted = urllib.parse.quote(victim(c))
    if path.startswith(f"/v1/records/{quoted}"):
        return await fetch(path.replace(quoted, urllib.parse.quote(c.synthetic_ids[2])))
    return answer


def _altered(canonical: bytes) -> bytes:
    altered = canonical.replace(b'"tenant":"bank-a"', b'"tenant":"bank-z"')
    assert altered != canonical
    return altered


async def altered_bytes_recomputed_leaf(path: str, answer: dict[str, Any], fetch: Fetch,
                                        c: Console) -> dict[str, Any]:
    """Other bytes, with the leaf hash the log 'holds' recomputed to match them."""
    quoted = urllib.parse.quote(victim(c))
    if path == f"/v1/records/{quoted}":
        canonical = _altered(base64.b64decode(answer["canonical_base64"]))
        answer["canonical_base64"] = base64.b64encode(canonical).decode()
    elif path == f"/v1/records/{quoted}/proof":
        record = await fetch(f"/v1/records/{quoted}")
        answer["leaf_hash"] = hash_leaf(_altered(
            base64.b64decode(record["canonical_base64"]))).hex()
    return answer


async def impostor_checkpoint_key(path: str, answer: dict[str, Any], fetch: Fetch,
                                  c: Console) -> dict[str, Any]:
    if path.endswith("/proof") or path == "/v1/checkpoints/anchored":
        body = Checkpoint.peek(answer["checkpoint"].encode()).body()
        origin = body.decode().split("\n", 1)[0]
        answer["checkpoint"] = NoteSigner(origin, Ed25519PrivateKey.generate()).sign(
            body).decode()
    return answer


async def operator_fork(path: str, answer: dict[str, Any], fetch: Fetch,
                        c: Console) -> dict[str, Any]:
    """A forked history with altered bytes at the victim's leaf, every root recomputed
    and the checkpoint signed with the log's real key: checks 1-3 pass, only the anchored
    (witnessed) history can expose it."""
    quoted = urllib.parse.quote(victim(c))
    if path == f"/v1/records/{quoted}":
        canonical = _altered(base64.b64decode(answer["canonical_base64"]))
        answer["canonical_base64"] = base64.b64encode(canonical).decode()
    elif path == f"/v1/records/{quoted}/proof":
        record = await fetch(f"/v1/records/{quoted}")
        leaf = hash_leaf(_altered(base64.b64decode(record["canonical_base64"])))
        size, index = int(answer["tree_size"]), int(answer["leaf_index"])
        ledger = c.app[LEDGER]
        leaves = [leaf if i == index else ledger.leaf_hash(i) for i in range(size)]
        tree = MemoryTree(leaves)
        origin = answer["checkpoint"].split("\n", 1)[0]
        answer.update(leaf_hash=leaf.hex(),
                      inclusion_proof=[h.hex() for h in tree.inclusion_proof(index)],
                      checkpoint=c.app[SIGNER].sign(Checkpoint(origin, size,
                                                               tree.root()).body()).decode())
    return answer


async def lying_api(upstream: str, lie: Lie, c: Console) -> TestServer:
    async def fetch(path_qs: str) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {c.tokens['auditor']}"}
        async with aiohttp.ClientSession() as session, session.get(
                upstream + path_qs, headers=headers) as answer:
            result: dict[str, Any] = await answer.json()
            return result

    async def forward(request: web.Request) -> web.Response:
        if request.path == "/console/static/verify.js":  # the operator's own copy, swapped
            return web.Response(body=EVIL_SCRIPT, content_type="text/javascript")
        headers = {k: v for k, v in request.headers.items()
                   if k.lower() in ("authorization", "cookie")}
        async with aiohttp.ClientSession() as session, session.request(
                request.method, upstream + request.path_qs, headers=headers,
                data=await request.read(), allow_redirects=False) as answer:
            body = await answer.read()
            if answer.content_type == "application/json" and answer.status == 200:
                rewritten = await lie(request.path, json.loads(body), fetch, c)
                body = json.dumps(rewritten).encode()
            keep = ("Content-Type", "Location", "Content-Security-Policy")
            return web.Response(status=answer.status, body=body,
                                headers={k: answer.headers[k] for k in keep
                                         if k in answer.headers})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server


@dataclass
class Local:
    url: str  # the address `audit-ledger console` prints, with its launch token
    base: str


@pytest.fixture()
async def anchored(console: Console) -> Console:
    """Wait (polled, no fixed delay) until the anchor covers the latest checkpoint."""
    ledger = console.app[LEDGER]
    from ledger.store.anchors import SqlAnchorStore

    for _ in range(600):
        latest = await asyncio.to_thread(ledger.latest_checkpoint)
        anchor = await asyncio.to_thread(SqlAnchorStore(ledger.engine).latest)
        if anchor is not None and latest is not None and anchor.size == latest.size:
            return console
        await asyncio.sleep(0.1)
    raise AssertionError("the anchor never caught up with the latest checkpoint")


async def start_local(operator: str, token: str) -> tuple[Local, Callable[[], None]]:
    local = LocalConsole(ServerSource(operator, token))
    server = serve_console(local, 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}"

    def stop() -> None:
        server.shutdown()
        server.server_close()
    return Local(f"{base}/console?token={local.token}", base), stop


@pytest.fixture()
async def liar(anchored: Console, request: pytest.FixtureRequest
               ) -> AsyncIterator[tuple[Console, TestServer, Local]]:
    proxy = await lying_api(anchored.base_url, request.param, anchored)
    local, stop = await start_local(str(proxy.make_url("")).rstrip("/"),
                                    anchored.tokens["auditor"])
    try:
        yield anchored, proxy, local
    finally:
        await asyncio.to_thread(stop)
        await proxy.close()


async def open_record(page: Page, c: Console, local: Local, record_id: str,
                      witnesses: str) -> None:
    await page.goto(local.url)
    await expect(page.locator("#results")).to_be_visible()
    leaf = c.app[LEDGER].get_record(record_id).leaf_index
    await page.goto(f"{local.base}/console/records/{record_id}?leaf={leaf}")
    await page.fill("#pin-key", c.verifier_key)
    await page.fill("#pin-witnesses", witnesses)
    await page.click("#pin-button")
    await expect(page.locator("#verdict")).not_to_have_attribute("data-status", "pending")
    await expect(page.locator("#verdict")).not_to_have_attribute("data-status", "incomplete")


@pytest.mark.parametrize("liar", [no_lie], indirect=True, ids=["honest"])
async def test_honest_operator_verifies_only_with_log_key_and_witness_pinned(
        liar: tuple[Console, TestServer, Local], browser: Browser) -> None:
    c, _, local = liar
    context = await browser.new_context()
    page = await context.new_page()
    await page.goto(local.url)
    await page.goto(f"{local.base}/console/records/{victim(c)}")
    # Nothing is green before a key is pinned: not even check 1.
    await expect(page.locator("#verdict")).to_have_attribute("data-status", "incomplete")
    assert set((await statuses(page)).values()) == {"skipped"}
    await open_record(page, c, local, victim(c), c.witness_key)
    await expect(page.locator("#verdict")).to_have_attribute("data-status", "pass")
    assert await statuses(page) == {1: "pass", 2: "pass", 3: "pass", 4: "pass"}
    await expect(page.locator("#check-4 .reason")).to_contain_text("cosigned by 1 of 1")
    # The verified identity is the record asked for, from its own bytes.
    identity = page.locator("table[data-section=identity]")
    await expect(identity).to_contain_text(victim(c))
    await expect(identity).to_contain_text("bank-a")
    await expect(page.locator("#hosting")).to_have_attribute("data-hosted-by", "auditor")
    # The pins hold for the browser session, in another tab too.
    other = await context.new_page()
    await other.goto(f"{local.base}/console/records/{c.synthetic_ids[2]}")
    await expect(other.locator("#verdict")).to_have_attribute("data-status", "pass")


@pytest.mark.parametrize("liar", [no_lie], indirect=True, ids=["honest"])
async def test_self_anchored_is_never_shown_as_verified(
        liar: tuple[Console, TestServer, Local], browser: Browser) -> None:
    c, _, local = liar
    page = await new_page(browser)
    await open_record(page, c, local, victim(c), "")
    await expect(page.locator("#verdict")).to_have_text("NOT verified: check 4 failed")
    await expect(page.locator("#check-4 .reason")).to_contain_text("self-anchored")
    checks = await statuses(page)
    assert (checks[1], checks[2], checks[3], checks[4]) == ("pass", "pass", "pass", "fail")


@pytest.mark.parametrize(("liar", "failed_check", "reason", "others"), [
    (record_swap, 1, "(the record asked for)", {2: "skipped", 3: "pass", 4: "skipped"}),
    (altered_bytes_recomputed_leaf, 2, "calculated root", {1: "pass", 3: "pass",
                                                           4: "skipped"}),
    (impostor_checkpoint_key, 3, "note carries no signature by key",
     {1: "pass", 2: "skipped", 4: "skipped"}),
    (operator_fork, 4, "fork", {1: "pass", 2: "pass", 3: "pass"}),
], indirect=["liar"], ids=["record-swap", "altered-bytes-recomputed-leaf-hash",
                           "impostor-checkpoint-key", "operator-fork-signed-with-real-key"])
async def test_lying_operator_is_caught_by_the_local_console(
        liar: tuple[Console, TestServer, Local], browser: Browser, failed_check: int,
        reason: str, others: dict[int, str]) -> None:
    c, _, local = liar
    page = await new_page(browser)
    await open_record(page, c, local, victim(c), c.witness_key)
    await expect(page.locator("#verdict")).to_have_text(
        f"NOT verified: check {failed_check} failed")
    await expect(page.locator(f"#check-{failed_check} .reason")).to_contain_text(reason)
    assert await statuses(page) == {failed_check: "fail", **others}


@pytest.mark.parametrize("liar", [operator_fork], indirect=True, ids=["fork"])
async def test_a_swapped_operator_script_cannot_change_the_local_verdict(
        liar: tuple[Console, TestServer, Local], browser: Browser) -> None:
    """The operator serves a script that paints everything green. Its own console shows
    the forged record verified; the local console never loads that script."""
    c, proxy, local = liar
    operator_page = await new_page(browser)
    await sign_in(operator_page, c, c.tokens["auditor"])
    await expect(operator_page.locator("#results")).to_be_visible()
    await operator_page.goto(str(proxy.make_url(f"/console/records/{victim(c)}")))
    await expect(operator_page.locator("#verdict")).to_have_attribute("data-status", "pass")

    page = await new_page(browser)
    await open_record(page, c, local, victim(c), c.witness_key)
    await expect(page.locator("#verdict")).to_have_text("NOT verified: check 4 failed")
    served = await page.evaluate("""async () => {
        const text = await (await fetch(document.querySelector("script[src]").src)).text();
        const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(text));
        return Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, "0")).join("");
    }""")
    install = hashlib.sha256((ASSETS / "static" / "verify.js").read_bytes()).hexdigest()
    assert served == install
    assert verification_code_digest() == f"sha256:{install}"
    await expect(page.locator("#code-digest")).to_have_text(f"sha256:{install}")
    assert hashlib.sha256(EVIL_SCRIPT).hexdigest() != install


async def test_the_local_console_refuses_a_browser_without_its_launch_token(
        console: Console) -> None:
    local, stop = await start_local(console.base_url, console.tokens["auditor"])
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{local.base}/console/records/{victim(console)}") as r:
                assert r.status == 403
                assert "launch token" in await r.text()
            rebound = {"Host": "attacker.example:80"}
            async with session.get(local.url, headers=rebound) as r:
                assert r.status == 421
    finally:
        await asyncio.to_thread(stop)


async def test_the_pages_consistency_check_matches_the_python_one(
        console: Console, browser: Browser) -> None:
    """verify.js's RFC 9162 consistency verification against ledger.merkle's proofs, for
    every pair of sizes up to 17, and a proof offered for the wrong sizes."""
    local, stop = await start_local(console.base_url, console.tokens["auditor"])
    try:
        page = await new_page(browser)
        await page.goto(local.url)
        cases = []
        tree = MemoryTree(hash_leaf(f"entry {i}".encode()) for i in range(17))
        for second in range(1, 18):
            for first in range(1, second + 1):
                cases.append({"first": first, "second": second,
                              "proof": [h.hex() for h in tree.consistency_proof(first, second)],
                              "r1": tree.root(first).hex(), "r2": tree.root(second).hex()})
        await page.goto(f"{local.base}/console/records/{victim(console)}")
        results = await page.evaluate("""async (cases) => {
            const out = [];
            for (const c of cases) {
                const proof = c.proof.map(unhex);
                let ok = true, wrong = true;
                try { await verifyConsistency(c.first, c.second, proof, unhex(c.r1), unhex(c.r2)); }
                catch (err) { ok = false; }
                try { await verifyConsistency(c.first, c.second, proof, unhex(c.r2), unhex(c.r1));
                      wrong = c.first === c.second && c.r1 === c.r2 ? true : false; }
                catch (err) { wrong = true; }
                out.push([ok, wrong]);
            }
            return out;
        }""", cases)
    finally:
        await asyncio.to_thread(stop)
    assert len(results) == 153
    assert all(ok for ok, _ in results)
    assert all(wrong for _, wrong in results)


def test_the_local_console_needs_no_serving_stack() -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    from tests.console.test_report import BLOCK_SERVING_STACK

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", BLOCK_SERVING_STACK, "console",
                           "--print-digest"], cwd=root,
                          env={**os.environ, "PYTHONPATH": str(root)},
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout
    assert done.stdout.strip() == verification_code_digest()


class MalformedOperator:
    """An operator whose API answers JSON of the wrong shape (a lying or broken server)."""

    base_url = "http://operator.invalid"

    def __init__(self, records: dict[str, Any]) -> None:
        self.records = records

    def get(self, path: str, **query: Any) -> dict[str, Any]:
        if path == "/v1/known-values":
            return {"model_name": ["<b>ok</b>"], "driver_version": "not a list"}
        return self.records


@pytest.mark.parametrize("answer", [
    {"records": "not a list"}, {"records": [{"record_id": "r", "leaf_index": "7<b>"}]},
    {"records": [], "total": True}, {"records": [], "next_cursor": 5}])
def test_a_malformed_operator_answer_is_a_502_page_not_a_crash(answer: dict[str, Any]
                                                               ) -> None:
    local = LocalConsole(MalformedOperator(answer), token="t")  # type: ignore[arg-type]
    page = local.answer("/console", {}, "t")
    assert page.status == 502
    assert b"not a page of records as the API describes it" in page.body


def test_the_local_form_refuses_an_overflowing_time_keeping_the_form() -> None:
    local = LocalConsole(MalformedOperator({"records": []}), token="t")  # type: ignore[arg-type]
    page = local.answer("/console", {"since": "0001-01-01T00:00+01:00"}, "t")
    assert page.status == 400 and b'data-field="since"' in page.body
    assert b"&lt;b&gt;ok&lt;/b&gt;" in page.body  # the pick-list, escaped
