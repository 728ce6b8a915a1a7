"""Error answers: the one place errors become HTTP responses.

Native routes answer RFC 9457 problem details; the OpenAI-compatible routes answer
OpenAI's error object (``{"error": {"message", "type", "param", "code"}}``), which the
official clients read into ``exc.message``, ``exc.param`` and ``exc.code``. Statuses of
error classes come from ``ledger.error_map``; no exception text of a backend ever reaches
a body (it may hold SQL, parameters, other tenants' data).
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from inference_wrapper.audit.batcher import QueueFullError, ShuttingDownError
from inference_wrapper.engine.protocol import EngineDownError
from ledger.error_map import http_status_for
from ledger.errors import BackendError, DuplicateRecordError, InvalidInputError, LedgerError

PROBLEM_TYPE = "application/problem+json"

# OpenAI's error types, by status.
_OPENAI_TYPES = {401: "invalid_request_error", 403: "permission_error",
                 404: "invalid_request_error", 429: "rate_limit_error"}


class Problem(Exception):
    """An error answer; ``field`` names the offending input when there is one.

    ``code`` is a stable machine-readable reason (OpenAI's ``code``), ``request_id``
    lets an operator find the log lines of a server error.
    """

    def __init__(self, status: int, title: str, detail: str, *, field: str | None = None,
                 headers: dict[str, str] | None = None, code: str | None = None) -> None:
        super().__init__(detail)
        self.status, self.title, self.detail = status, title, detail
        self.field, self.headers, self.code = field, headers or {}, code
        self.request_id: str | None = None

    def response(self, instance: str | None = None) -> web.Response:
        body: dict[str, Any] = {"type": "about:blank", "title": self.title,
                                "status": self.status, "detail": self.detail}
        if self.field is not None:
            body["field"] = self.field
        if self.code is not None:
            body["code"] = self.code
        if instance:
            body["instance"] = instance
        if self.request_id is not None:
            body["request_id"] = self.request_id
        return web.Response(status=self.status, text=json.dumps(body),
                            content_type=PROBLEM_TYPE, headers=self.headers)

    def openai_response(self) -> web.Response:
        """OpenAI's error shape; an invalid request is a 400 there, as OpenAI answers it."""
        status = 400 if self.status == 422 else self.status
        kind = _OPENAI_TYPES.get(status, "server_error" if status >= 500
                                 else "invalid_request_error")
        code = self.code
        if code is None and status == 401:
            code = "invalid_api_key"
        message = self.detail
        if self.field is not None and not message.startswith(self.field):
            message = f"{self.field}: {message}"
        if self.request_id is not None:
            message = f"{message} (request id {self.request_id})"
        body = {"error": {"message": message, "type": kind, "param": self.field,
                          "code": code}}
        return web.json_response(body, status=status, headers=self.headers)


class CommittedProblem(Problem):
    """An error answer for a request whose audit record is committed (e.g. the content
    vault could not keep its content): it names the record, and a streamed request's
    start record too. Under an Idempotency-Key it is the key's stored outcome, so a retry
    gets it again instead of a second record."""

    def __init__(self, status: int, title: str, detail: str, record_id: str, *,
                 headers: dict[str, str] | None = None, code: str | None = None,
                 stream_start_record_id: str | None = None) -> None:
        super().__init__(status, title, detail, headers=headers, code=code)
        self.record_id = record_id
        self.stream_start_record_id = stream_start_record_id

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "title": self.title, "detail": self.detail,
                "record_id": self.record_id, "headers": self.headers, "code": self.code,
                "stream_start_record_id": self.stream_start_record_id}

    @classmethod
    def from_dict(cls, stored: dict[str, Any]) -> CommittedProblem:
        return cls(int(stored["status"]), str(stored["title"]), str(stored["detail"]),
                   str(stored["record_id"]), headers=dict(stored.get("headers") or {}),
                   code=stored.get("code"),
                   stream_start_record_id=stored.get("stream_start_record_id"))

    def _records(self) -> dict[str, str]:
        records = {"record_id": self.record_id}
        if self.stream_start_record_id is not None:
            records["stream_start_record_id"] = self.stream_start_record_id
        return records

    def response(self, instance: str | None = None) -> web.Response:
        response = super().response(instance)
        response.text = json.dumps(json.loads(response.text or "{}") | self._records())
        return response

    def openai_response(self) -> web.Response:
        response = super().openai_response()
        body = json.loads(response.text or "{}")
        body["error"] |= self._records()
        response.text = json.dumps(body)
        return response


def invalid(field: str, detail: str, status: int = 422, code: str | None = None) -> Problem:
    return Problem(status, "Invalid request", detail, field=field, code=code)


def not_admitted(error: QueueFullError | ShuttingDownError | EngineDownError | TimeoutError,
                 timeout_detail: str = "") -> Problem:
    """The answer for a generate request the batcher did not take (queue full, shutting
    down) or did not finish in time; ``timeout_detail`` is added to the timeout's text."""
    if isinstance(error, QueueFullError):
        return Problem(503, "Service Unavailable", str(error), headers={"Retry-After": "1"})
    if isinstance(error, ShuttingDownError):
        return Problem(503, "Service Unavailable", str(error), headers={"Retry-After": "5"})
    if isinstance(error, EngineDownError):  # no output was produced, nothing was recorded
        return Problem(503, "Service Unavailable", "the model engine is down and restarting; "
                       "no output was produced" + timeout_detail, headers={"Retry-After": "2"})
    return Problem(504, "Gateway Timeout", "generation did not finish in time" + timeout_detail)


def internal_error(request_id: str) -> Problem:
    """A 500 says only that, and which request id to look for in the server's log."""
    problem = Problem(500, "Internal Server Error", "internal error")
    problem.request_id = request_id
    return problem


def problem_for(error: LedgerError) -> Problem:
    """A deliberate error that reached the top of a handler; its status from the error map.

    Only our own reasons for invalid input are shown; every other class gets a fixed
    sentence, since its message may carry backend text.
    """
    status = http_status_for(error)
    if isinstance(error, InvalidInputError):
        return invalid(error.field, error.reason, status=status)
    if isinstance(error, DuplicateRecordError):
        return Problem(status, "Conflict", "a different record already holds this id")
    if isinstance(error, BackendError):
        return Problem(status, "Service Unavailable", "a backend of this service is "
                       "unavailable; retry later", headers={"Retry-After": "1"})
    return Problem(status, "Internal Server Error", "internal error")
