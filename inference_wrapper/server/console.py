"""The auditor's console at ``/console``: sign in with a key, search, record pages, plots.

Served by the same aiohttp app. A session is a random token in an HttpOnly,
SameSite=Strict cookie, kept server side (in this process) with an expiry; the API key
itself is read once from the sign-in form and never stored or echoed. Every POST form
carries a CSRF token: the sign-in form a double-submit cookie, the others the session's
own token. The record page embeds the evidence (canonical bytes, log leaf hash, proof,
signed checkpoint) and ``static/verify.js`` checks it in the browser against a key the
auditor pinned there: the server sends no verdict.
"""

from __future__ import annotations

import asyncio
import csv
import dataclasses
import hmac
import io
import json
import math
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from html import escape
from typing import Any, Protocol

from aiohttp import web

from inference_wrapper.server.access import readable_tenant
from inference_wrapper.server.appkeys import INTEGRATOR, KEYS, LEDGER, SETTINGS, SIGNER
from inference_wrapper.server.console_pages import (
    SECURITY_HEADERS,
    error_main,
    evidence_dict,
    mirror_rows,
    operator_hosted_notice,
    page_html,
    record_main,
    shown,
    static_asset,
    template,
    visible,
)
from inference_wrapper.server.console_plots import (
    TIMELINE_FIELDS,
    Point,
    bar_chart_svg,
    fingerprint_changes,
    line_chart_svg,
    mean_batch_size,
    per_minute,
    phase_charts_svg,
    timeline_svg,
)
from inference_wrapper.server.console_search import (
    BadField,
    OutOfScope,
    Search,
    error_notice,
    iso_minute,
    page_links,
    parse_search,
    search_main,
)
from inference_wrapper.server.console_sessions import (
    HSTS,
    ClientView,
    Session,
    SessionCodec,
    SignInThrottle,
    client_view,
    parse_proxies,
    session_secret,
)
from ledger.client.bundle_stream import bundle_chunks
from ledger.client.database import DatabaseSource
from ledger.client.sources import RecordNotFoundError, gather
from ledger.errors import BackendError, InvalidInputError
from ledger.leaves.mirror import LOG_WIDE_TENANT
from ledger.store.log_api import RecordRow
from ledger.store.mirror import MirrorPage, SqlMirror
from ledger.verify import LeafEvidence

SESSION_COOKIE = "alc_session"
LOGIN_COOKIE = "alc_login_csrf"
SESSION_TTL_S = 3600.0
CONSOLE_ROLES = ("auditor", "admin")
CSV_PAGE = 1000
PLOT_MAX_RECORDS = 50_000
BUNDLE_MAX_RECORDS = 100_000  # about 150 MB of JSON; larger exports: `audit-ledger export`
CSV_COLUMNS = ("leaf_index", "record_id", "created_at", "tenant", "model_name",
               "model_digest", "accelerator", "accelerator_model", "driver_version",
               "torch_version", "service_revision", "checkpoint_size", "anchor_ref")


# --- sessions --------------------------------------------------------------------------


@dataclass
class ConsoleState:
    """Per app: the session codec (made at first use: its secret needs the log's signer,
    which exists once the app has started), the sign-in throttle, the trusted proxies."""

    throttle: SignInThrottle
    proxies: list[Any]
    configured_secret: str
    codec: SessionCodec | None = None


STATE = web.AppKey("console_state", ConsoleState)


def _codec(request: web.Request) -> SessionCodec:
    state = request.app[STATE]
    if state.codec is None:
        secret = session_secret(state.configured_secret, request.app[SIGNER].sign)
        state.codec = SessionCodec(secret, SESSION_TTL_S)
    return state.codec


def _client(request: web.Request) -> ClientView:
    return client_view(request.remote, request.secure, dict(request.headers),
                       request.app[STATE].proxies)


async def current_session(request: web.Request) -> Session | None:
    token = request.cookies.get(SESSION_COOKIE)
    if not token:
        return None
    session = _codec(request).open(token)
    if session is None:
        return None
    if not await asyncio.to_thread(request.app[KEYS].is_active, session.key_id):
        return None
    return session


def _to_login() -> web.Response:
    return web.Response(status=303, headers={"Location": "/console/login", **SECURITY_HEADERS})


def _same(given: str | None, expected: str | None) -> bool:
    return bool(given) and bool(expected) and hmac.compare_digest(str(given), str(expected))


# --- rendering -------------------------------------------------------------------------


def page(title: str, main: str, session: Session | None, status: int = 200) -> web.Response:
    nav = ""
    if session is not None:
        nav = template("nav.html").substitute(
            who=shown(f"{session.role} ({session.scope or 'every tenant'})"),
            csrf=escape(session.csrf))
    return web.Response(status=status, text=page_html(title, main, nav),
                        content_type="text/html", charset="utf-8", headers=SECURITY_HEADERS)


def error_page(status: int, title: str, detail: str, session: Session | None,
               field: str | None = None) -> web.Response:
    return page(title, error_main(status, title, detail, field), session, status)


# --- sign in and out -------------------------------------------------------------------


def _set_cookie(response: web.StreamResponse, request: web.Request, name: str, value: str,
                max_age: int) -> None:
    response.set_cookie(name, value, max_age=max_age, path="/console", httponly=True,
                        samesite="Strict", secure=_client(request).https)


async def login_form(request: web.Request) -> web.Response:
    if await current_session(request) is not None:
        return web.Response(status=303, headers={"Location": "/console",
                                                 **SECURITY_HEADERS})
    return _login_page(request, None, 200)


def _login_page(request: web.Request, message: str | None, status: int) -> web.Response:
    csrf = secrets.token_urlsafe(32)
    notice = (f'<p class="error" data-status="{status}">{escape(message)}</p>'
              if message else "")
    main = template("login.html").substitute(csrf=escape(csrf), notice=notice)
    response = page("Sign in", main, None, status)
    _set_cookie(response, request, LOGIN_COOKIE, csrf, 600)
    return response


async def login(request: web.Request) -> web.Response:
    form = await request.post()
    if not _same(_text(form.get("csrf")), request.cookies.get(LOGIN_COOKIE)):
        return error_page(403, "Forbidden", "the form's CSRF token is missing or does not "
                          "match; reload the sign-in page", None, field="csrf")
    address = _client(request).address
    wait = request.app[STATE].throttle.retry_after(address)
    if wait > 0:
        response = _login_page(request, "too many failed sign-ins from this address; try "
                               f"again in {math.ceil(wait)} s", 429)
        response.headers["Retry-After"] = str(math.ceil(wait))
        return response
    token = _text(form.get("api_key")).strip()
    if not token:
        return _login_page(request, "an API key is required (field api_key)", 400)
    key = await asyncio.to_thread(request.app[KEYS].authenticate, token)
    if key is None:
        request.app[STATE].throttle.failed(address)
        return _login_page(request, "the API key is unknown or revoked", 401)
    if key.role not in CONSOLE_ROLES:
        return _login_page(request, f"role {key.role!r} may not use the console; "
                           "sign in with an auditor or admin key", 403)
    session_token, _ = _codec(request).issue(key.key_id, key.tenant, key.role,
                                             readable_tenant(key))
    response = web.Response(status=303, headers={"Location": "/console", **SECURITY_HEADERS})
    _set_cookie(response, request, SESSION_COOKIE, session_token, int(SESSION_TTL_S))
    response.del_cookie(LOGIN_COOKIE, path="/console")
    return response


async def logout(request: web.Request) -> web.Response:
    session = await current_session(request)
    if session is None:
        return _to_login()
    form = await request.post()
    if not _same(_text(form.get("csrf")), session.csrf):
        return error_page(403, "Forbidden", "the form's CSRF token is missing or wrong",
                          session, field="csrf")
    response = _to_login()
    response.del_cookie(SESSION_COOKIE, path="/console")
    return response


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


# --- search and export -----------------------------------------------------------------


def search_error(exc: BadField | InvalidInputError, session: Session,
                 title: str = "Bad search") -> web.Response:
    if isinstance(exc, OutOfScope):
        return error_page(403, "Forbidden", exc.reason, session, field=exc.field)
    return error_page(400, title, exc.reason, session, field=exc.field)


class MirroredLog(Protocol):
    """What the console's searches, exports and plots read: the mirror's queries."""

    @property
    def mirror(self) -> SqlMirror: ...


def page_of(ledger: MirroredLog, search: Search, limit: int, cursor: str | None
            ) -> MirrorPage:
    return ledger.mirror.page(limit=limit, cursor=cursor, order=search.order,
                              **search.mirror_terms())


def count_of(ledger: MirroredLog, search: Search) -> int:
    return ledger.mirror.count(**search.mirror_terms())


def exports_for(search: Search) -> str:
    """The export links of a search, and the proof link when it names a whole window."""
    query = search.query_string()
    exports = (f'<a id="csv-export" href="{escape("/console/records.csv?" + query)}">'
               "export all matching as CSV</a> · "
               f'<a id="bundle-export" href="{escape("/console/records.bundle?" + query)}">'
               "as an evidence bundle</a>")
    if search.since is not None and search.until is not None:
        # Its own page: a proof reads every leaf of the window, not one page of rows.
        exports += (f' · <a id="prove-complete" href="'
                    f'{escape("/console/prove?" + query)}">prove this answer complete</a>')
    return exports


async def search_page(request: web.Request) -> web.Response:
    session = await current_session(request)
    if session is None:
        return _to_login()
    ledger = request.app[LEDGER]
    known = await asyncio.to_thread(ledger.mirror.known_values, session.scope)
    try:
        search = parse_search(request.query, session.scope)
        found = await asyncio.to_thread(page_of, ledger, search, search.limit, search.cursor)
        total = await asyncio.to_thread(count_of, ledger, search)
    except (BadField, InvalidInputError) as exc:
        # The form comes back as it was typed, with the error beside it.
        status, notice = error_notice(exc)
        return page("Bad search", notice + search_main(request.query, known, [], None, "", ""),
                    session, status)
    return page("Records", search_main(
        search.typed(), known, [mirror_json(row) for row in found.rows], total,
        exports_for(search), page_links(search, found.previous_cursor, found.next_cursor)),
        session)


def mirror_json(row: RecordRow) -> dict[str, Any]:
    """A mirror row as the API spells it (what the result table renders)."""
    return {"record_id": row.record_id, "leaf_index": row.leaf_index,
            "created_at": row.created_at.isoformat() + "Z", "tenant": row.tenant,
            **row.columns}


def csv_name(search: Search) -> str:
    """A file name that says what was exported: tenant, filters and range, safe chars."""
    parts = ["audit-records", *(v for v in search.filters.values() if v),
             *search.contains.values()]
    if search.since:
        parts.append("from-" + search.since.strftime("%Y%m%dT%H%M"))
    if search.until:
        parts.append("to-" + search.until.strftime("%Y%m%dT%H%M"))
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", "_".join(parts))[:120]
    return name + ".csv"


def _csv_cell(value: object) -> str:
    text = "" if value is None else visible(str(value))
    # A spreadsheet runs a cell that starts with one of these as a formula.
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def csv_lines(rows: list[RecordRow], header: bool) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    if header:
        writer.writerow(CSV_COLUMNS)
    for row in rows:
        values = {"leaf_index": row.leaf_index, "record_id": row.record_id,
                  "created_at": row.created_at.isoformat() + "Z", "tenant": row.tenant,
                  "checkpoint_size": row.checkpoint_size, "anchor_ref": row.anchor_ref,
                  **row.columns}
        writer.writerow([_csv_cell(values.get(c)) for c in CSV_COLUMNS])
    return out.getvalue()


async def export_csv(request: web.Request) -> web.StreamResponse:
    session = await current_session(request)
    if session is None:
        return _to_login()
    try:
        search = parse_search(request.query, session.scope)
        found = await asyncio.to_thread(page_of, request.app[LEDGER], search, CSV_PAGE, None)
    except (BadField, InvalidInputError) as exc:
        return search_error(exc, session)
    response = web.StreamResponse(headers={
        "Content-Type": "text/csv; charset=utf-8",
        "Content-Disposition": f'attachment; filename="{csv_name(search)}"',
        **SECURITY_HEADERS})
    await response.prepare(request)
    # A byte order mark: spreadsheets then read UTF-8 ("Société Générale" stays intact).
    await response.write(b"\xef\xbb\xbf" + csv_lines(found.rows, header=True).encode())
    while found.next_cursor is not None:  # every matching row, a page at a time
        found = await asyncio.to_thread(page_of, request.app[LEDGER], search, CSV_PAGE,
                                        found.next_cursor)
        await response.write(csv_lines(found.rows, header=False).encode())
    await response.write_eof()
    return response


async def export_bundle(request: web.Request) -> web.StreamResponse:
    """The matching records as an offline evidence bundle (``audit-ledger verify --bundle``),
    streamed a page at a time (bounded memory); more than ``BUNDLE_MAX_RECORDS`` is
    refused before anything is written (422: narrow the range, or use ``audit-ledger
    export``). The bundle names no log key: whoever checks it pins their own."""
    session = await current_session(request)
    if session is None:
        return _to_login()
    try:
        search = parse_search(request.query, session.scope)
    except BadField as exc:
        return search_error(exc, session)
    ledger = request.app[LEDGER]
    filters = {k: v for k, v in search.filters.items() if v is not None}
    matching = await asyncio.to_thread(count_of, ledger, search)
    if matching > BUNDLE_MAX_RECORDS:
        return error_page(422, "Too many records for one bundle",
                          f"this search matches {matching} records; a bundle from the console "
                          f"holds at most {BUNDLE_MAX_RECORDS}: narrow the time range, or "
                          "use `audit-ledger export`", session, field="until")
    await asyncio.to_thread(request.app[INTEGRATOR].seal_now)  # cover the newest records
    chunks = bundle_chunks(ledger, search.since, search.until, filters, search.contains,
                           session.scope)
    try:
        first = await asyncio.to_thread(next, chunks)
    except BackendError:
        return error_page(503, "Service Unavailable", "the log has no checkpoint yet; "
                          "try again in a moment", session)
    response = web.StreamResponse(headers={
        "Content-Type": "application/json",
        "Content-Disposition": 'attachment; filename="audit-bundle.json"', **SECURITY_HEADERS})
    await response.prepare(request)
    chunk: str | None = first
    while chunk is not None:
        await response.write(chunk.encode())
        chunk = await asyncio.to_thread(next, chunks, None)
    await response.write_eof()
    return response


# --- the record page -------------------------------------------------------------------


def _evidence(request: web.Request, record_id: str, scope: str | None) -> dict[str, Any]:
    """What the browser needs to run checks 1-4 (in a worker thread): the same gathering
    as ``audit-ledger verify --db``, so the page checks what the CLI checks. A session
    scoped to a tenant gets no other tenant's leaf, even one the record names (check 1
    then says it was not given)."""
    ledger = request.app[LEDGER]
    latest = ledger.latest_checkpoint()
    row = ledger.get_record(record_id)
    if row is not None and (latest is None or latest.size <= row.leaf_index):
        request.app[INTEGRATOR].seal_now()  # cover the newest records
    evidence = gather(DatabaseSource(ledger), record_id, None)
    if scope is not None:
        def held_by(leaf: LeafEvidence | None, owner: str) -> LeafEvidence | None:
            named = None if leaf is None else ledger.record_at(leaf.leaf_index)
            return leaf if named is not None and named.tenant == owner else None
        evidence = dataclasses.replace(
            evidence, stream_start=held_by(evidence.stream_start, scope),
            environment=held_by(evidence.environment, LOG_WIDE_TENANT))
    return evidence_dict(evidence)


async def record_page(request: web.Request) -> web.Response:
    session = await current_session(request)
    if session is None:
        return _to_login()
    record_id = request.match_info["record_id"]
    row = await asyncio.to_thread(request.app[LEDGER].get_record, record_id)
    # Another tenant's record is not found, as the API answers: not even its existence.
    if row is None or (session.scope is not None and row.tenant != session.scope):
        return error_page(404, "Not found", f"no record {record_id!r}", session)
    try:
        evidence = await asyncio.to_thread(_evidence, request, record_id, session.scope)
    except RecordNotFoundError:
        return error_page(404, "Not found", f"no record {record_id!r}", session)
    except BackendError:
        return error_page(503, "Service Unavailable", "the record is not yet covered by a "
                          "checkpoint; reload in a moment", session)
    mirror = mirror_rows([("leaf index", row.leaf_index),
                          ("created", f"{row.created_at:%Y-%m-%d %H:%M:%S} UTC"),
                          ("tenant", row.tenant),
                          ("first checkpoint size", row.checkpoint_size or "not yet"),
                          ("anchor", row.anchor_ref or "not anchored yet"),
                          *((k, v) for k, v in row.columns.items() if v is not None)])
    main = record_main(record_id, mirror, evidence, operator_hosted_notice())
    return page(f"Record {record_id}", main, session)


# --- plots -----------------------------------------------------------------------------


def _plot_points(ledger: MirroredLog, since: datetime, until: datetime,
                 tenant: str | None) -> list[Point]:
    points: list[Point] = []
    cursor: str | None = None
    while len(points) < PLOT_MAX_RECORDS:
        rows, cursor = ledger.mirror.query(since=since, until=until, limit=5000, cursor=cursor,
                                           tenant=tenant)
        # An engine's environment leaf is no request: it has no point on the plots.
        points.extend(Point.from_record(r.created_at, r.columns, json.loads(r.leaf_body))
                      for r in rows if r.tenant != LOG_WIDE_TENANT)
        if cursor is None:
            break
    return points[:PLOT_MAX_RECORDS]


async def plots_page(request: web.Request) -> web.Response:
    session = await current_session(request)
    if session is None:
        return _to_login()
    try:
        search = parse_search(request.query, session.scope)
    except BadField as exc:
        return search_error(exc, session, "Bad range")
    until = search.until or datetime.now(UTC).replace(tzinfo=None) + timedelta(minutes=1)
    since = search.since or until - timedelta(hours=24)
    points = await asyncio.to_thread(_plot_points, request.app[LEDGER], since, until,
                                     session.scope)
    lag = await asyncio.to_thread(request.app[LEDGER].mirror.anchor_lags, since, until)
    changes = fingerprint_changes(points)
    labels = dict(TIMELINE_FIELDS)
    change_rows = "".join(
        f'<tr class="change-row"><td>{c.at:%Y-%m-%d %H:%M:%S} UTC</td>'
        f"<td>{escape(labels[c.field])}</td><td><code>{shown(c.before)}</code></td>"
        f"<td>{c.records_before}</td><td><code>{shown(c.after)}</code></td>"
        f"<td>{c.records_after}</td></tr>" for c in changes)
    capped = (f"<p>Only the first {PLOT_MAX_RECORDS} records of the range are plotted.</p>"
              if len(points) >= PLOT_MAX_RECORDS else "")
    main = template("plots.html").substitute(
        since=escape(iso_minute(since)),
        until=escape(iso_minute(until)), count=len(points), capped=capped,
        rpm=bar_chart_svg(per_minute(points), title="records (requests) per minute"),
        timeline=timeline_svg(points, changes), change_rows=change_rows,
        latency=phase_charts_svg(points, title="p50 and p99 per minute (from the records' "
                                 "timings)"),
        batch=line_chart_svg({"mean batch size": mean_batch_size(points)},
                             title="mean batch size per minute", unit=""),
        anchor_lag=line_chart_svg({"seal to anchor": lag},
                                  title="anchoring lag per anchored checkpoint", unit="s"))
    return page("Plots", main, session)


# --- static assets and registration ----------------------------------------------------


async def static(request: web.Request) -> web.Response:
    asset = static_asset(request.match_info["name"])
    if asset is None:  # a fixed list: no path ever reaches the file system
        return web.Response(status=404, text="not found")
    return web.Response(body=asset[0], content_type=asset[1],
                        headers={"X-Content-Type-Options": "nosniff",
                                 "Cache-Control": "no-cache"})


def console_routes() -> list[web.RouteDef]:
    # Imported here: the proof page is built on this module's session and search helpers.
    from inference_wrapper.server.console_prove import prove_page

    return [
        web.get("/console/prove", prove_page),
        web.get("/console", search_page),
        web.get("/console/login", login_form),
        web.post("/console/login", login),
        web.post("/console/logout", logout),
        web.get("/console/records.csv", export_csv),
        web.get("/console/records.bundle", export_bundle),
        web.get("/console/records/{record_id}", record_page),
        web.get("/console/plots", plots_page),
        web.get("/console/static/{name}", static),
    ]


async def _transport_headers(request: web.Request, response: web.StreamResponse) -> None:
    """HSTS on the console's answers when the client reached us over HTTPS (directly, or
    through a configured TLS-terminating proxy)."""
    if request.path.startswith("/console") and _client(request).https:
        response.headers["Strict-Transport-Security"] = HSTS


def setup_console(app: web.Application) -> None:
    """Register the console on an app built by ``create_app``."""
    settings = app[SETTINGS]
    app[STATE] = ConsoleState(SignInThrottle(), parse_proxies(settings.trusted_proxies),
                              settings.console_session_secret)
    app.on_response_prepare.append(_transport_headers)
    app.add_routes(console_routes())
