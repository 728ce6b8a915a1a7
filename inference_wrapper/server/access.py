"""Who may use a route: bearer API keys, checked by one middleware from the route table.

Each route in the table names its roles; ``access_middleware`` authenticates the caller
and checks the role before the handler runs, and leaves the key on the request
(``caller(request)``). Handlers never check roles themselves. Routes outside the table
(the console, the tiles) call ``authorize`` with their own roles.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web
from aiohttp.typedefs import Middleware

from inference_wrapper.server.appkeys import KEYS
from inference_wrapper.server.problems import Problem
from ledger.store.apikeys import ApiKey

CLIENT_ROLES = ("client", "admin")


READER_ROLES = ("client", "auditor", "admin")
AUDITOR_ROLES = ("auditor",)
ADMIN_ROLES = ("admin",)
API_KEY = web.RequestKey("api_key", ApiKey)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def authorize(request: web.Request, roles: tuple[str, ...]) -> ApiKey:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise Problem(401, "Unauthorized", "a bearer API key is required",
                      headers={"WWW-Authenticate": 'Bearer realm="audit-ledger"'})
    key = request.app[KEYS].authenticate(token.strip())
    if key is None:
        raise Problem(401, "Unauthorized", "the API key is unknown or revoked",
                      headers={"WWW-Authenticate": 'Bearer error="invalid_token"'})
    if key.role not in roles:
        raise Problem(403, "Forbidden", f"role {key.role!r} may not use this route")
    return key


def readable_tenant(key: ApiKey) -> str | None:
    """The one tenant a key may read, or None for every tenant.

    Auditors read every tenant; an admin only its own, unless it was created for all
    tenants (``keys create --role admin --all-tenants``).
    """
    if key.role == "auditor" or (key.role == "admin" and key.all_tenants):
        return None
    return key.tenant


def caller(request: web.Request) -> ApiKey:
    """The key the access middleware authenticated for this request."""
    return request[API_KEY]


def access_middleware(roles: Mapping[tuple[str, str], tuple[str, ...] | None]
                      ) -> Middleware:
    """``roles`` maps (method, route path) to the roles that may call it (None: no key)."""

    @web.middleware
    async def check_access(request: web.Request, handler: Handler) -> web.StreamResponse:
        resource = request.match_info.route.resource
        if resource is not None:
            allowed = roles.get((request.method, resource.canonical))
            if allowed:
                request[API_KEY] = authorize(request, allowed)
        return await handler(request)

    return check_access
