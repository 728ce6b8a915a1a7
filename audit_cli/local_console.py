"""The auditor's own console: pages and verification code from this install, evidence
from the operator.

A small standard-library HTTP server on loopback (no aiohttp: it runs on the auditor
install). It renders the same pages as the operator's console
(``inference_wrapper.server.console_pages``) but fetches only evidence from the operator's
API, with the auditor's key, and serves ``verify.js`` from this install: the operator
cannot change the code that decides (docs/decisions/0040).

Only the browser that opened the URL printed at start (it carries a random launch token)
gets in; the Host header must be the loopback address, so another web page cannot reach
it through DNS rebinding.
"""

from __future__ import annotations

import hmac
import secrets
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from inference_wrapper.server.console_pages import (
    SECURITY_HEADERS,
    error_main,
    evidence_dict,
    local_notice,
    mirror_rows,
    page_html,
    record_main,
    static_asset,
)
from inference_wrapper.server.console_search import (
    BadField,
    error_notice,
    page_links,
    parse_search,
    search_main,
)
from ledger.client.sources import (
    MalformedAnswerError,
    RecordNotFoundError,
    ServerSource,
    gather,
)
from ledger.errors import BackendError, BackendUnavailableError, InvalidInputError

COOKIE = "alc_local"
NAV = '<nav><a href="/console">records</a> <span class="who">your own install</span></nav>'


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    content_type: str
    headers: dict[str, str]


def html_answer(status: int, title: str, main: str) -> Answer:
    return Answer(status, page_html(title, main, NAV).encode(), "text/html; charset=utf-8",
                  dict(SECURITY_HEADERS))


def error_answer(status: int, title: str, detail: str, field: str | None = None) -> Answer:
    return html_answer(status, title, error_main(status, title, detail, field))


class LocalConsole:
    """Routes of the local console; ``answer`` is pure apart from the source's fetches."""

    def __init__(self, source: ServerSource, token: str | None = None) -> None:
        self.source = source
        self.token = token or secrets.token_urlsafe(24)

    def answer(self, path: str, query: dict[str, str], cookie: str | None) -> Answer:
        if path.startswith("/console/static/"):
            asset = static_asset(path.rsplit("/", 1)[1])
            if asset is None:
                return error_answer(404, "Not found", "no such file")
            return Answer(200, asset[0], asset[1], {"X-Content-Type-Options": "nosniff",
                                                    "Cache-Control": "no-cache"})
        if query.get("token") and hmac.compare_digest(query["token"], self.token):
            return Answer(303, b"", "text/plain", {
                "Location": path, "Set-Cookie": f"{COOKIE}={self.token}; Path=/; HttpOnly; "
                                                "SameSite=Strict"})
        if not (cookie and hmac.compare_digest(cookie, self.token)):
            return error_answer(403, "Forbidden", "open the address that `audit-ledger "
                                "console` printed when it started (it carries a launch token)")
        try:
            if path in ("/", "/console"):
                return self.search(query)
            if path.startswith("/console/records/"):
                return self.record(urllib.parse.unquote(path.removeprefix("/console/records/")))
        except BackendUnavailableError as exc:
            return error_answer(502, "Bad Gateway", f"the operator's service cannot be "
                                f"reached: {exc}")
        except InvalidInputError as exc:
            return error_answer(400, "Bad request", exc.reason, exc.field)
        except BackendError as exc:
            return error_answer(502, "Bad Gateway", f"the operator's service answered with "
                                f"an error: {exc}")
        return error_answer(404, "Not found", "no such page")

    def search(self, query: dict[str, str]) -> Answer:
        """The operator console's search form, asked of the operator's API (decision
        0047): the same filters, partial match, orders, total and pick-lists. A refused
        search keeps the form as typed, with the error beside it."""
        try:
            known = _known_values(self.source.get("/v1/known-values"))
        except RecordNotFoundError:  # an operator's service older than the route
            known = {}
        try:
            search = parse_search(query)
            found = self.source.get("/v1/records", **search.api_query())
        except (BadField, InvalidInputError) as exc:
            status, notice = error_notice(exc)
            return html_answer(status, "Bad search",
                               notice + search_main(query, known, [], None, "", ""))
        rows, total, previous, following = _records_page(found)
        main = search_main(search.typed(), known, rows, total,
                           "export them with <code>audit-ledger export --server</code>",
                           page_links(search, previous, following))
        return html_answer(200, "Records", main)

    def record(self, record_id: str) -> Answer:
        try:
            evidence = gather(self.source, record_id, None)
        except RecordNotFoundError:
            return error_answer(404, "Not found", f"the operator has no record {record_id!r}")
        row = self.source.get(f"/v1/records/{urllib.parse.quote(record_id, safe='')}")
        skip = {"record", "canonical_base64"}
        mirror = mirror_rows([(k, v) for k, v in row.items() if k not in skip and v is not None])
        main = record_main(record_id, mirror, evidence_dict(evidence),
                           local_notice(self.source.base_url))
        return html_answer(200, f"Record {record_id}", main)


def _known_values(answer: dict[str, Any]) -> dict[str, list[str]]:
    """The operator's pick-lists, each a list of strings, or nothing to pick from."""
    return {name: values for name, values in answer.items()
            if isinstance(values, list) and all(isinstance(v, str) for v in values)}


def _records_page(answer: dict[str, Any]
                  ) -> tuple[list[dict[str, Any]], int | None, str | None, str | None]:
    """(rows, total, previous cursor, next cursor) of the operator's answer, each of the
    type the API promises; anything else is a malformed answer (502), never a page built
    from it."""
    rows, total = answer.get("records"), answer.get("total")
    cursors = answer.get("previous_cursor"), answer.get("next_cursor")
    if (not isinstance(rows, list)
            or not all(isinstance(r, dict) and type(r.get("leaf_index")) is int
                       and isinstance(r.get("record_id"), str) for r in rows)
            or not (total is None or type(total) is int)
            or not all(c is None or isinstance(c, str) for c in cursors)):
        raise MalformedAnswerError("/v1/records: the operator's answer is not a page of "
                                   "records as the API describes it")
    return rows, total, cursors[0], cursors[1]


def handler_for(console: LocalConsole, allowed_hosts: set[str]) -> Callable[..., Any]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "audit-ledger-console"

        def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
            if self.headers.get("Host", "") not in allowed_hosts:
                answer = error_answer(421, "Misdirected Request", "this console answers "
                                      "only on its loopback address")
            else:
                url = urllib.parse.urlsplit(self.path)
                query = dict(urllib.parse.parse_qsl(url.query))
                cookies = {}
                for part in self.headers.get("Cookie", "").split(";"):
                    name, _, value = part.strip().partition("=")
                    cookies[name] = value
                answer = console.answer(url.path, query, cookies.get(COOKIE))
            self.send_response(answer.status, HTTPStatus(answer.status).phrase
                               if answer.status in HTTPStatus._value2member_map_ else None)
            self.send_header("Content-Type", answer.content_type)
            self.send_header("Content-Length", str(len(answer.body)))
            for name, value in answer.headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(answer.body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass  # the auditor's terminal shows the address, not every request

    return Handler


def serve_console(console: LocalConsole, port: int) -> ThreadingHTTPServer:
    """A server bound to 127.0.0.1 (call ``serve_forever``); port 0 picks a free one."""
    server = ThreadingHTTPServer(("127.0.0.1", port), BaseHTTPRequestHandler)
    bound = server.server_address[1]
    server.RequestHandlerClass = handler_for(
        console, {f"127.0.0.1:{bound}", f"localhost:{bound}"})
    return server
