"""RFC 9457 problem details: the one place errors become HTTP responses."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

PROBLEM_TYPE = "application/problem+json"


class Problem(Exception):
    """An error answer; ``field`` names the offending input when there is one."""

    def __init__(self, status: int, title: str, detail: str, *, field: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status, self.title, self.detail = status, title, detail
        self.field, self.headers = field, headers or {}

    def response(self, instance: str | None = None) -> web.Response:
        body: dict[str, Any] = {"type": "about:blank", "title": self.title,
                                "status": self.status, "detail": self.detail}
        if self.field is not None:
            body["field"] = self.field
        if instance:
            body["instance"] = instance
        return web.Response(status=self.status, text=json.dumps(body),
                            content_type=PROBLEM_TYPE, headers=self.headers)


def invalid(field: str, detail: str, status: int = 422) -> Problem:
    return Problem(status, "Invalid request", detail, field=field)
