"""The console's search form, pure: what the auditor typed to a search, and the form and
result list as HTML.

Shared by the operator's console (which reads its mirror) and the auditor's own
(``audit-ledger console``, which asks the operator's ``GET /v1/records`` the same search,
decision 0047), so both offer the same filters, matching, orders and pick-lists.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from html import escape
from typing import Any
from urllib.parse import urlencode

from inference_wrapper.server.console_pages import invisible, result_row, shown, template, visible
from ledger.errors import InvalidInputError
from ledger.store.mirror import PARTIAL_FILTERS, decode_position

PAGE_LIMIT_MAX = 500
FILTER_LABELS = {"tenant": "tenant", "model_name": "model", "model_digest": "model digest",
                 "accelerator_model": "accelerator", "driver_version": "driver",
                 "service_revision": "service revision"}
MATCHES = {"part": "any part of the name", "whole": "the whole name"}
SORTS = {"-time": "newest first", "time": "oldest first", "leaf": "log order"}
DEFAULT_ORDER = "leaf"


@dataclass(frozen=True)
class Search:
    since: datetime | None
    until: datetime | None
    filters: dict[str, str | None]  # exact
    limit: int
    cursor: str | None
    contains: dict[str, str] = field(default_factory=dict)  # a part of each name
    order: str = DEFAULT_ORDER
    match: str = "part"

    def query_string(self, **extra: str) -> str:
        pairs = {"since": self.since.isoformat() if self.since else None,
                 "until": self.until.isoformat() if self.until else None,
                 **{k: visible(v) if v else v for k, v in self.filters.items()},
                 **{k: visible(v) for k, v in self.contains.items()},
                 "match": self.match, "sort": self.order, "limit": str(self.limit), **extra}
        return urlencode({k: v for k, v in pairs.items() if v})

    def typed(self) -> dict[str, str]:
        """The form's fields as the auditor sees them (control characters visible)."""
        return {"since": iso_minute(self.since), "until": iso_minute(self.until),
                "limit": str(self.limit), "match": self.match, "sort": self.order,
                **{k: visible(v or "") for k, v in {**self.filters, **self.contains}.items()}}

    def mirror_terms(self) -> dict[str, Any]:
        """The keyword arguments of the mirror's ``page`` and ``count`` for this search."""
        return {"since": self.since, "until": self.until, "filters": self.filters,
                "contains": self.contains}

    def api_query(self) -> dict[str, str]:
        """The same search as ``GET /v1/records`` parameters (decision 0047): the exact
        filters, or the parts of names with ``match=part``, the order and the total."""
        named = {**{k: v for k, v in self.filters.items() if v}, **self.contains}
        query = {"limit": str(self.limit), "order": self.order, "total": "true",
                 "match": "part" if self.contains else "whole", **named}
        if self.since is not None:
            query["since"] = self.since.isoformat() + "Z"
        if self.until is not None:
            query["until"] = self.until.isoformat() + "Z"
        if self.cursor is not None:
            query["cursor"] = self.cursor
        return query


class BadField(Exception):
    def __init__(self, field: str, reason: str) -> None:
        super().__init__(reason)
        self.field, self.reason = field, reason


class OutOfScope(BadField):
    """A tenant-scoped session named another tenant (403, field tenant)."""

    def __init__(self, scope: str) -> None:
        super().__init__("tenant", f"this session reads only tenant {scope!r}")


def parse_search(query: Any, scope: str | None = None) -> Search:
    """Form fields to a search; an empty field means no filter. A session scoped to one
    tenant searches that tenant only; naming another is refused (403, as the API does)."""
    def when(name: str) -> datetime | None:
        raw = (query.get(name) or "").strip()
        if not raw:
            return None
        try:
            moment = datetime.fromisoformat(raw)
            # A year-1 time east of UTC (or 9999 west of it) overflows in UTC.
            return moment.astimezone(UTC).replace(tzinfo=None) if moment.tzinfo else moment
        except (ValueError, OverflowError) as exc:
            raise BadField(name, "must be a date and time such as 2026-11-30T10:00") from exc

    raw_limit = (query.get("limit") or "50").strip()
    if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= PAGE_LIMIT_MAX:
        raise BadField("limit", f"must be a whole number from 1 to {PAGE_LIMIT_MAX}")
    match = (query.get("match") or "part").strip()
    if match not in MATCHES:
        raise BadField("match", f"must be one of {', '.join(MATCHES)}")
    order = (query.get("sort") or DEFAULT_ORDER).strip()
    if order not in SORTS:
        raise BadField("sort", f"must be one of {', '.join(SORTS)}")
    # What the list shows ("<U+202E>") is what the auditor types back: the character.
    typed = {name: invisible((query.get(name) or "").strip()) or None
             for name in FILTER_LABELS}
    for name, value in typed.items():
        if value is not None and "\x00" in value:  # no name holds it; PostgreSQL refuses it
            raise BadField(name, "must not hold the NUL character")
    contains = ({name: typed[name] or "" for name in PARTIAL_FILTERS if typed[name]}
                if match == "part" else {})
    filters = {name: typed[name] for name in FILTER_LABELS if name not in contains}
    if scope is not None:
        if filters["tenant"] not in (None, scope):
            raise OutOfScope(scope)
        filters["tenant"] = scope
    cursor = (query.get("cursor") or "").strip() or None
    if cursor is not None:
        try:
            place = decode_position(cursor)
        except InvalidInputError as exc:
            raise BadField("cursor", exc.reason) from exc
        if place.order != order:
            raise BadField("cursor", "belongs to another sort order; search again")
    return Search(when("since"), when("until"), filters, int(raw_limit), cursor, contains,
                  order, match)


def iso_minute(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%dT%H:%MZ") if moment else ""


def _choice(name: str, label: str, options: dict[str, str], chosen: str) -> str:
    return (f'<label>{escape(label)} <select name="{name}" id="{name}">'
            + "".join(f'<option value="{escape(value)}"'
                      f'{" selected" if value == chosen else ""}>{escape(text)}</option>'
                      for value, text in options.items())
            + "</select></label>")


def search_inputs(typed: Any, known: dict[str, list[str]]) -> str:
    """The filter fields, each with a pick-list of the values the mirror knows (for this
    session's tenants; control characters shown, as the list shows them), and the match
    and sort choices."""
    fields = []
    for name, label in FILTER_LABELS.items():
        values = known.get(name)
        listed = ""
        if values is not None:
            listed = (f' list="known-{name}"><datalist id="known-{name}">'
                      + "".join(f'<option value="{shown(v)}">' for v in values)
                      + "</datalist")
        fields.append(f'<label>{escape(label)} <input id="filter-{name}" name="{name}" '
                      f'value="{escape(typed.get(name) or "")}"{listed}></label>')
    return ("".join(fields)
            + _choice("match", "names match", MATCHES, typed.get("match") or "part")
            + _choice("sort", "sort", SORTS, typed.get("sort") or DEFAULT_ORDER))


def search_main(typed: Any, known: dict[str, list[str]], rows: list[dict[str, Any]],
                total: int | None, exports: str, more: str) -> str:
    """The search form with what was typed, and the results (none after an error); each
    row as the API spells it."""
    return template("search.html").substitute(
        since=escape(typed.get("since") or ""), until=escape(typed.get("until") or ""),
        limit=escape(typed.get("limit") or "50"), inputs=search_inputs(typed, known),
        rows="".join(result_row(row) for row in rows), count=len(rows),
        total="" if total is None else f' of <span id="total-count">{total}</span> matching',
        more=more, exports=exports)


def error_notice(exc: BadField | InvalidInputError) -> tuple[int, str]:
    """A refused search's status and the notice shown above the form as it was typed."""
    status = 403 if isinstance(exc, OutOfScope) else 400
    return status, (f'<section class="error" data-status="{status}" '
                    f'data-field="{escape(exc.field or "")}"><p>{shown(exc.reason)} '
                    f'<span class="field">field: <code>{escape(exc.field or "")}</code>'
                    "</span></p></section>")


def page_links(search: Search, previous_cursor: str | None, next_cursor: str | None) -> str:
    """The previous and next page links of a result page."""
    links = [f'<a id="{name}-page" href="/console?{escape(search.query_string(cursor=c))}">'
             f"{label}</a>" for name, label, c in
             (("previous", "previous page", previous_cursor),
              ("next", "next page", next_cursor)) if c]
    return " · ".join(links)
