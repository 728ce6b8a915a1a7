"""HTTP for the evidence clients: the bearer key stays with the origin it was given for,
and an answer has a size cap.

The standard library's redirect handling copies every header, ``Authorization``
included, to wherever a 30x points: a server (or anyone who can answer for it) could
collect an auditor's key on another host. Here a redirect is followed only within the
same scheme, host and port; any other is refused. Answers are read up to a cap, so a
hostile server cannot make a verifier hold gigabytes.
"""

from __future__ import annotations

import urllib.parse
import urllib.request
from http.client import HTTPMessage
from typing import IO, Any

from ledger.errors import BackendError

# Evidence answers are small (a record, a proof, a checkpoint: kilobytes); retained
# content is bounded by the server's own limits, far below this.
MAX_ANSWER_BYTES = 16 * 1024 * 1024


class CrossOriginRedirectError(BackendError):
    """The server redirected to another origin; not followed (the key stays home)."""


class AnswerTooLargeError(BackendError):
    """The server's answer exceeds the cap."""


def origin_of(url: str) -> tuple[str, str, int | None]:
    parts = urllib.parse.urlsplit(url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme.lower())
    return parts.scheme.lower(), (parts.hostname or "").lower(), port


class _SameOriginRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req: urllib.request.Request, fp: IO[bytes], code: int,
                         msg: str, headers: HTTPMessage, newurl: str
                         ) -> urllib.request.Request | None:
        if origin_of(newurl) != origin_of(req.full_url):
            fp.close()
            scheme, host, port = origin_of(newurl)
            raise CrossOriginRedirectError(
                f"the server redirected to another origin ({scheme}://{host}:{port}); "
                "not followed, so the API key is sent only where it was given for")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


_OPENER = urllib.request.build_opener(_SameOriginRedirects)


def read_capped(response: Any, limit: int | None = None) -> bytes:
    """The body, or ``AnswerTooLargeError`` past ``limit`` bytes (never read whole)."""
    limit = MAX_ANSWER_BYTES if limit is None else limit
    declared = response.headers.get("Content-Length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise AnswerTooLargeError(f"the server's answer has {declared} bytes (at most "
                                  f"{limit})")
    data: bytes = response.read(limit + 1)
    if len(data) > limit:
        raise AnswerTooLargeError(f"the server's answer has more bytes than allowed (at "
                                  f"most {limit})")
    return data


def get(url: str, headers: dict[str, str], timeout_s: float,
        limit: int | None = None) -> bytes:
    """GET ``url`` and return its body; urllib's errors (``HTTPError``, ``URLError``)
    pass through for the caller to map."""
    request = urllib.request.Request(url, headers=headers)
    with _OPENER.open(request, timeout=timeout_s) as response:
        return read_capped(response, limit)
