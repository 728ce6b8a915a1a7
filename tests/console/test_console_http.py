"""The console over real HTTP: sessions, CSRF, roles, search, CSV, record evidence, plots."""

from __future__ import annotations

import asyncio
import base64
import csv
import dataclasses
import io
import json
import re
import time
from datetime import UTC, datetime
from typing import Any

from inference_wrapper.server import console as console_module
from inference_wrapper.server import console_pages
from inference_wrapper.server.app import KEYS, LEDGER, SETTINGS, create_app
from inference_wrapper.server.console_sessions import SessionCodec
from ledger.checkpoint import NoteVerifier
from ledger.store.anchors import SqlAnchorStore
from ledger.verify import Evidence, LeafEvidence, TrustPolicy, verify_record
from tests.cli_runs import cli_json
from tests.console.conftest import Console, sign_in

EVIDENCE = re.compile(r'<script type="application/json" id="evidence">(.*?)</script>', re.S)


async def test_console_without_session_redirects_to_sign_in(console: Console) -> None:
    for path in ("/console", "/console/plots", "/console/records.csv",
                 f"/console/records/{console.generated_id}"):
        response = await console.client.get(path, allow_redirects=False)
        assert response.status == 303, path
        assert response.headers["Location"] == "/console/login"


async def test_session_cookie_is_httponly_samesite_strict_with_expiry(console: Console) -> None:
    response = await sign_in(console.client, console.tokens["auditor"])
    assert response.status == 303
    assert response.headers["Location"] == "/console"  # the key is never in a URL
    cookie = next(v for v in response.headers.getall("Set-Cookie")
                  if v.startswith("alc_session="))
    attributes = {part.strip().split("=")[0].lower() for part in cookie.split(";")[1:]}
    assert {"httponly", "samesite", "max-age", "path"} <= attributes
    assert "SameSite=Strict" in cookie
    assert "Max-Age=3600" in cookie
    assert console.tokens["auditor"] not in cookie
    page = await (await console.client.get("/console")).text()
    assert "signed in as auditor (every tenant)" in page
    assert console.tokens["auditor"] not in page


async def test_sign_in_without_csrf_token_is_refused_403(console: Console) -> None:
    await console.client.get("/console/login")  # the CSRF cookie is set, the field is not sent
    response = await console.client.post("/console/login",
                                         data={"api_key": console.tokens["auditor"]},
                                         allow_redirects=False)
    assert response.status == 403
    assert 'data-field="csrf"' in await response.text()
    assert "alc_session" not in response.headers.get("Set-Cookie", "")
    assert (await console.client.get("/console", allow_redirects=False)).status == 303


async def test_sign_in_with_a_forged_csrf_token_is_refused_403(console: Console) -> None:
    await console.client.get("/console/login")
    response = await console.client.post(
        "/console/login", data={"api_key": console.tokens["auditor"], "csrf": "forged"},
        allow_redirects=False)
    assert response.status == 403


async def test_client_key_cannot_sign_in_403(console: Console) -> None:
    response = await sign_in(console.client, console.tokens["client"])
    assert response.status == 403
    assert "role &#x27;client&#x27; may not use the console" in await response.text()
    assert (await console.client.get("/console", allow_redirects=False)).status == 303


async def test_unknown_key_cannot_sign_in_401(console: Console) -> None:
    response = await sign_in(console.client, "alk_0000000000000000_nope")
    assert response.status == 401
    assert "unknown or revoked" in await response.text()


async def test_admin_key_signs_in(console: Console) -> None:
    assert (await sign_in(console.client, console.tokens["admin"])).status == 303
    assert "signed in as admin" in await (await console.client.get("/console")).text()


async def test_sign_out_needs_the_session_csrf_token(console: Console) -> None:
    await sign_in(console.client, console.tokens["auditor"])
    refused = await console.client.post("/console/logout", data={}, allow_redirects=False)
    assert refused.status == 403
    assert (await console.client.get("/console", allow_redirects=False)).status == 200
    page = await (await console.client.get("/console")).text()
    token = re.search(r'action="/console/logout".*?name="csrf" value="([^"]+)"', page, re.S)
    assert token is not None
    done = await console.client.post("/console/logout", data={"csrf": token.group(1)},
                                     allow_redirects=False)
    assert done.status == 303
    assert (await console.client.get("/console", allow_redirects=False)).status == 303


async def test_revoking_the_key_ends_its_session(console: Console) -> None:
    keys = console.client.server.app[KEYS]
    token, key = keys.create("audit-firm", "auditor")
    await sign_in(console.client, token)
    assert (await console.client.get("/console", allow_redirects=False)).status == 200
    keys.revoke(key.key_id)
    assert (await console.client.get("/console", allow_redirects=False)).status == 303


async def test_search_filters_by_tenant_driver_and_time(console: Console) -> None:
    await sign_in(console.client, console.tokens["auditor"])

    async def ids(query: str) -> list[str]:
        page = await (await console.client.get(f"/console?{query}")).text()
        return re.findall(r'class="record-link" href="/console/records/([^"?]+)\?leaf=', page)

    assert len(await ids("")) == 9  # and the engine's environment leaf (log-wide)
    assert await ids("tenant=bank-b") == console.synthetic_ids[1::2]
    assert await ids("driver_version=560.35.03") == console.synthetic_ids[4:]
    assert await ids("since=2026-11-30T09:02&until=2026-11-30T09:04") == \
        console.synthetic_ids[2:4]
    assert await ids("tenant=bank-a&driver_version=550.54.15") == console.synthetic_ids[0:4:2]


async def test_search_paginates_with_a_cursor(console: Console) -> None:
    await sign_in(console.client, console.tokens["auditor"])
    seen: list[str] = []
    url = "/console?limit=3"
    while url:
        page = await (await console.client.get(url)).text()
        seen += re.findall(r'class="record-link" href="/console/records/([^"?]+)\?leaf=', page)
        more = re.search(r'id="next-page" href="([^"]+)"', page)
        url = more.group(1).replace("&amp;", "&") if more else ""
    environment = console.app[LEDGER].record_at(len(console.synthetic_ids))
    assert environment is not None and environment.tenant == ""  # logged when it started
    assert seen == [*console.synthetic_ids, environment.record_id, console.generated_id]


async def test_bad_search_input_is_400_naming_the_field(console: Console) -> None:
    await sign_in(console.client, console.tokens["auditor"])
    for query, field in (("since=yesterday", "since"), ("limit=0", "limit"),
                         ("limit=9999", "limit"), ("cursor=bogus", "cursor")):
        response = await console.client.get(f"/console?{query}")
        assert response.status == 400, query
        assert f'data-field="{field}"' in await response.text()


async def test_csv_export_has_every_matching_row_across_pages(console: Console,
                                                              monkeypatch: Any) -> None:
    monkeypatch.setattr(console_module, "CSV_PAGE", 2)  # force several pages
    await sign_in(console.client, console.tokens["auditor"])
    response = await console.client.get("/console/records.csv?tenant=bank-a")
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(await response.text())))
    assert [r["record_id"] for r in rows] == [*console.synthetic_ids[0::2],
                                              console.generated_id]
    assert rows[1]["driver_version"] == "550.54.15"
    assert rows[-2]["driver_version"] == "560.35.03"


def test_csv_cells_that_a_spreadsheet_would_run_are_defused() -> None:
    assert console_module._csv_cell("=HYPERLINK(1)") == "'=HYPERLINK(1)"
    assert console_module._csv_cell("@SUM(A1)") == "'@SUM(A1)"
    assert console_module._csv_cell("bank-a") == "bank-a"


async def test_record_page_carries_evidence_and_no_verdict(console: Console) -> None:
    await sign_in(console.client, console.tokens["auditor"])
    page = await (await console.client.get(f"/console/records/{console.generated_id}")).text()
    match = EVIDENCE.search(page)
    assert match is not None
    evidence = json.loads(match.group(1))
    # The server says nothing about the outcome: every check starts pending.
    assert page.count('data-status="pending"') == 5
    assert "pass" not in json.dumps(evidence)
    environment = evidence["environment"]  # a v2 record: its environment leaf comes along
    # The evidence is complete: Python's verifier, given the pinned key, accepts it.
    verdict = verify_record(
        Evidence(record_id=evidence["record_id"],
                 canonical=base64.b64decode(evidence["canonical_base64"]),
                 leaf_index=evidence["leaf_index"],
                 inclusion_proof=[bytes.fromhex(h) for h in evidence["inclusion_proof"]],
                 checkpoint_note=evidence["checkpoint"].encode(),
                 log_leaf_hash=bytes.fromhex(evidence["log_leaf_hash"]),
                 body=base64.b64decode(evidence["body_base64"]),
                 environment=LeafEvidence(
                     environment["leaf_index"], base64.b64decode(environment["envelope_base64"]),
                     base64.b64decode(environment["body_base64"]),
                     [bytes.fromhex(h) for h in environment["inclusion_proof"]])),
        NoteVerifier.decode(console.verifier_key), NoteVerifier.decode(
            console.verifier_key).name, policy=TrustPolicy(require_anchor=False))
    assert [c.passed for c in verdict.checks[:3]] == [True, True, True]


async def test_record_page_escapes_what_could_close_the_evidence_block() -> None:
    block = console_pages.evidence_script({"x": "</script><script>alert(1)</script>"})
    assert block.count("</script>") == 1
    assert json.loads(block.split(">", 1)[1].rsplit("<", 1)[0]) == {
        "x": "</script><script>alert(1)</script>"}


async def test_unknown_record_is_404(console: Console) -> None:
    await sign_in(console.client, console.tokens["auditor"])
    response = await console.client.get("/console/records/no-such-record")
    assert response.status == 404
    assert "no record &#x27;no-such-record&#x27;" in await response.text()


async def test_pages_forbid_inline_script_and_framing(console: Console) -> None:
    await sign_in(console.client, console.tokens["auditor"])
    response = await console.client.get(f"/console/records/{console.generated_id}")
    policy = response.headers["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert response.headers["Cache-Control"] == "no-store"
    script = await console.client.get("/console/static/verify.js")
    assert script.status == 200 and script.content_type == "text/javascript"
    assert (await console.client.get("/console/static/..%2Fconsole.py")).status == 404


async def test_plots_show_requests_per_minute_and_the_driver_change(console: Console) -> None:
    await sign_in(console.client, console.tokens["auditor"])
    now = datetime.now(UTC).replace(tzinfo=None)
    page = await (await console.client.get(
        f"/console/plots?since=2026-11-30T08:00&until={now:%Y-%m-%dT%H:%M}:59")).text()
    assert '<span id="plot-count">8</span>' in page
    assert 'name="since" value="2026-11-30T08:00Z"' in page  # ISO 8601 text, 24-hour
    assert page.count("<rect ") == 8  # 7 synthetic minutes and the generated record's
    rows = re.findall(r'<tr class="change-row">(.*?)</tr>', page, re.S)
    driver = [r for r in rows if "<td>driver</td>" in r and "<code>550.54.15</code>" in r
              and "<code>560.35.03</code>" in r]
    assert len(driver) == 1
    cells = re.findall(r"<td>(.*?)</td>", driver[0])
    assert cells[2:] == ["<code>550.54.15</code>", "4", "<code>560.35.03</code>", "3"]
    # Latency lines come from the records' own timings: the generated record has four
    # phases (p50 and p99 each, and their total), the synthetic ones only "forward".
    latency = re.search(r'<figure id="latency">(.*?)</figure>', page, re.S)
    assert latency is not None
    labels = set(re.findall(r"<polyline[^>]*><title>([^<]+)</title>", latency.group(1)))
    assert {"forward p50", "forward p99", "decode p99", "total p50"} <= labels
    batch = re.search(r'<figure id="batch">(.*?)</figure>', page, re.S)
    assert batch is not None and "mean batch size" in batch.group(1)


async def test_plots_show_the_anchoring_lag_once_something_is_anchored(
        console: Console) -> None:

    ledger = console.client.server.app[LEDGER]
    for _ in range(1200):  # polled, generous: the anchor worker runs on its own interval
        if await asyncio.to_thread(SqlAnchorStore(ledger.engine).latest) is not None:
            break
        await asyncio.sleep(0.05)
    lag = await asyncio.to_thread(ledger.mirror.anchor_lags, datetime(2026, 1, 1),
                                  datetime(2100, 1, 1))
    assert lag and all(seconds >= 0 for _, seconds in lag)
    await sign_in(console.client, console.tokens["auditor"])
    page = await (await console.client.get("/console/plots")).text()
    figure = re.search(r'<figure id="anchor-lag">(.*?)</figure>', page, re.S)
    assert figure is not None
    assert "<polyline" in figure.group(1) and "seal to anchor" in figure.group(1)


async def test_bundle_export_verifies_offline_with_the_pinned_key(console: Console,
                                                                   tmp_path: Any) -> None:
    from audit_cli.main import main
    from ledger.bundle import Bundle

    # Check 4 needs an anchored checkpoint: wait (polled, generous) for the anchor worker.
    ledger = console.client.server.app[LEDGER]
    for _ in range(1200):
        if await asyncio.to_thread(SqlAnchorStore(ledger.engine).latest) is not None:
            break
        await asyncio.sleep(0.05)
    await sign_in(console.client, console.tokens["auditor"])
    page = await (await console.client.get("/console?tenant=bank-b")).text()
    link = re.search(r'id="bundle-export" href="([^"]+)"', page)
    assert link is not None
    response = await console.client.get(link.group(1).replace("&amp;", "&"))
    assert response.status == 200
    text = await response.text()
    bundle = Bundle.loads(text)
    assert [e.record_id for e in bundle.entries] == console.synthetic_ids[1::2]
    path = tmp_path / "bundle.json"
    path.write_text(text)
    assert main(["verify", "--bundle", str(path), "--log-key", console.verifier_key,
                 "--no-state", "--accept-self-anchored"]) == 0


async def test_an_expired_session_is_refused_even_if_the_browser_still_sends_it(
        console: Console) -> None:
    assert (await sign_in(console.client, console.tokens["auditor"])).status == 303
    assert (await console.client.get("/console", allow_redirects=False)).status == 200
    codec = console.app[console_module.STATE].codec
    assert codec is not None
    codec._clock = lambda: time.time() + 2 * console_module.SESSION_TTL_S  # time passes
    assert (await console.client.get("/console", allow_redirects=False)).status == 303


def test_a_session_cookie_opens_only_unaltered_and_under_its_own_secret() -> None:
    codec = SessionCodec(b"s" * 32, ttl_s=60.0)
    token, session = codec.issue("k1", "bank-a", "admin", "bank-a")
    assert codec.open(token) == session
    payload, mac = token.split(".")
    forged = base64.urlsafe_b64encode(base64.urlsafe_b64decode(payload + "==").replace(
        b'"bank-a"', b'null', 1)).decode().rstrip("=")
    assert codec.open(f"{forged}.{mac}") is None  # scope widened: the MAC no longer holds
    assert SessionCodec(b"t" * 32, ttl_s=60.0).open(token) is None
    assert codec.open("garbage") is None and codec.open("a.b") is None


async def test_a_session_is_valid_on_every_replica(
        console: Console, aiohttp_client: Any, tiny_generator: Any) -> None:
    """Two replicas of one log (one database, one log key), no sticky sessions: a
    session signed in on one is honoured by the other, and sign-out is the cookie's."""
    other = await aiohttp_client(create_app(console.app[SETTINGS], tiny_generator))
    assert (await sign_in(console.client, console.tokens["auditor"])).status == 303
    cookie = console.client.session.cookie_jar.filter_cookies(
        console.client.make_url("/console"))["alc_session"].value
    answer = await other.get("/console", cookies={"alc_session": cookie},
                             allow_redirects=False)
    assert answer.status == 200
    assert "signed in as auditor" in await answer.text()


async def test_sign_in_is_throttled_per_client_address(console: Console) -> None:
    for _ in range(10):
        form = await (await console.client.get("/console/login")).text()
        csrf = re.search(r'name="csrf" value="([^"]+)"', form)
        assert csrf is not None
        wrong = await console.client.post("/console/login", allow_redirects=False,
                                          data={"api_key": "alk_wrong", "csrf": csrf.group(1)})
        assert wrong.status == 401
    refused = await sign_in(console.client, console.tokens["auditor"])
    assert refused.status == 429  # even the right key, until the window passes
    assert int(refused.headers["Retry-After"]) > 0
    assert "too many failed sign-ins" in await refused.text()


async def test_secure_cookie_and_hsts_only_behind_a_trusted_tls_proxy(
        console: Console, aiohttp_client: Any, tiny_generator: Any) -> None:
    https = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.7"}
    # Not a configured proxy: the header is anyone's to send, and is ignored.
    plain = await console.client.get("/console/login", headers=https)
    assert "Strict-Transport-Security" not in plain.headers
    assert "Secure" not in plain.headers["Set-Cookie"]
    behind = await aiohttp_client(create_app(
        dataclasses.replace(console.app[SETTINGS], trusted_proxies="127.0.0.1/32"),
        tiny_generator))
    answer = await behind.get("/console/login", headers=https)
    assert answer.headers["Strict-Transport-Security"] == "max-age=31536000"
    assert "Secure" in answer.headers["Set-Cookie"]
    assert "Strict-Transport-Security" not in (await behind.get("/console/login")).headers


# --- tenant scope: a tenant's admin sees only its tenant, on every page and export --------


async def scoped_admin(console: Console) -> None:
    token, _ = console.client.server.app[KEYS].create("bank-a", "admin")
    assert (await sign_in(console.client, token)).status == 303


def bank_a(console: Console) -> list[str]:
    return [console.generated_id, *console.synthetic_ids[0::2]]


async def test_scoped_admin_search_lists_only_its_tenant(console: Console) -> None:
    await scoped_admin(console)
    page = await (await console.client.get("/console")).text()
    found = re.findall(r'class="record-link" href="/console/records/([^"?]+)\?leaf=', page)
    assert sorted(found) == sorted(bank_a(console))
    refused = await console.client.get("/console?tenant=bank-b")
    assert refused.status == 403
    assert 'data-field="tenant"' in await refused.text()


async def test_scoped_admin_cannot_open_another_tenants_record(console: Console) -> None:
    await scoped_admin(console)
    other = await console.client.get(f"/console/records/{console.synthetic_ids[1]}")
    assert other.status == 404  # not even whether it exists, as the API answers
    own = await console.client.get(f"/console/records/{console.synthetic_ids[0]}")
    assert own.status == 200


async def test_scoped_admin_csv_export_holds_only_its_tenant(console: Console) -> None:
    await scoped_admin(console)
    text = await (await console.client.get("/console/records.csv")).text()
    rows = list(csv.DictReader(io.StringIO(text.lstrip("\ufeff"))))
    assert sorted(r["record_id"] for r in rows) == sorted(bank_a(console))
    assert (await console.client.get("/console/records.csv?tenant=bank-b")).status == 403


async def test_scoped_admin_bundle_export_holds_only_its_tenant(console: Console) -> None:
    from ledger.bundle import Bundle

    await scoped_admin(console)
    response = await console.client.get("/console/records.bundle")
    assert response.status == 200
    bundle = Bundle.loads(await response.text())
    assert sorted(e.record_id for e in bundle.entries) == sorted(bank_a(console))
    assert (await console.client.get("/console/records.bundle?tenant=bank-b")).status == 403


async def test_scoped_admin_plots_count_only_its_tenant(console: Console) -> None:
    await scoped_admin(console)
    page = await (await console.client.get("/console/plots?since=2026-11-30T08:00")).text()
    count = re.search(r'id="plot-count">(\d+)<', page)
    assert count is not None and int(count.group(1)) == 5  # generated + 4 synthetic bank-a
    assert (await console.client.get("/console/plots?tenant=bank-b")).status == 403


async def test_a_forged_huge_cursor_is_a_clear_400_not_a_500(console: Console) -> None:
    await sign_in(console.client, console.tokens["auditor"])
    forged = base64.urlsafe_b64encode(f"after:{10**30}".encode()).decode().rstrip("=")
    for path in ("/console", "/console/records.csv"):
        response = await console.client.get(f"{path}?cursor={forged}")
        assert response.status == 400
        assert 'data-field="cursor"' in await response.text()


async def test_a_bundle_over_the_cap_is_refused_before_anything_is_written(
        console: Console, monkeypatch: Any) -> None:
    monkeypatch.setattr(console_module, "BUNDLE_MAX_RECORDS", 4)
    await sign_in(console.client, console.tokens["auditor"])
    refused = await console.client.get("/console/records.bundle")
    assert refused.status == 422
    text = await refused.text()
    assert "this search matches 9 records" in text and 'data-field="until"' in text
    narrowed = await console.client.get("/console/records.bundle?tenant=bank-b")
    assert narrowed.status == 200  # 3 records: under the cap


async def test_csv_has_a_bom_and_a_file_name_from_the_query(console: Console) -> None:
    await sign_in(console.client, console.tokens["auditor"])
    response = await console.client.get(
        "/console/records.csv?tenant=bank-a&since=2026-11-30T09:00Z")
    assert (await response.read()).startswith(b"\xef\xbb\xbfleaf_index,")
    assert response.headers["Content-Disposition"] == (
        'attachment; filename="audit-records_bank-a_from-20261130T0900.csv"')


async def test_search_shows_the_total_and_a_bad_time_keeps_the_form(console: Console) -> None:
    await sign_in(console.client, console.tokens["auditor"])
    page = await (await console.client.get("/console?tenant=bank-a&limit=2")).text()
    assert '<span id="result-count">2</span>' in page
    assert '<span id="total-count">5</span> matching' in page
    bad = await console.client.get("/console?tenant=bank-a&since=half+past+nine")
    assert bad.status == 400
    text = await bad.text()
    assert 'data-field="since"' in text
    assert 'name="since" value="half past nine"' in text  # what was typed comes back
    assert 'name="tenant" value="bank-a"' in text


def test_bidi_and_control_characters_are_made_visible() -> None:
    liar = "\u202e51.45.055"
    assert console_pages.visible(liar) == "<U+202E>51.45.055"
    assert "\u202e" not in console_pages.result_row(
        {"record_id": "r", "leaf_index": 1, "created_at": "", "tenant": "t",
         "driver_version": liar})
    assert console_module._csv_cell(liar) == "<U+202E>51.45.055"


async def test_the_consoles_bundle_verifies_offline_v2_and_streamed_records_included(
        console: Console, tmp_path: Any, capsys: Any) -> None:
    # A streamed request: its record names a stream start leaf, and both an environment.
    streamed = await console.client.post(
        "/v1/completions", json={"model": "tiny-llama", "prompt": "Hello bundle",
                                 "max_tokens": 3, "stream": True},
        headers={"Authorization": f"Bearer {console.tokens['client']}"})
    assert streamed.status == 200
    await streamed.read()
    await sign_in(console.client, console.tokens["auditor"])
    response = await console.client.get("/console/records.bundle?tenant=bank-a")
    assert response.status == 200
    path = tmp_path / "console-bundle.json"
    path.write_bytes(await response.read())
    written = json.loads(path.read_text())
    assert written["environments"] and len(written["stream_starts"]) == 1
    code, out = await asyncio.to_thread(
        cli_json, capsys, "verify", "--bundle", str(path), "--log-key", console.verifier_key,
        "--accept-self-anchored", "--no-state")
    # 4 synthetic v1 records, the generated v2 record, the stream start and its record.
    assert code == 0 and (out["verified"], out["failed"]) == (7, 0), out


async def test_a_nul_or_an_overflowing_time_keeps_the_form_with_a_400(console: Console) -> None:
    # Both were 500s: PostgreSQL refuses NUL in text, and year 1 east of UTC overflows.
    await sign_in(console.client, console.tokens["auditor"])
    for query, field in (("model_name=%3CU%2B0000%3E", "model_name"),
                         ("since=0001-01-01T00:00%2B01:00", "since"),
                         ("until=9999-12-31T23:59-01:00", "until")):
        response = await console.client.get(f"/console?{query}")
        assert response.status == 400, query
        assert f'data-field="{field}"' in await response.text()
