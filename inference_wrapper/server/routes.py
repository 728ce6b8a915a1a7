"""Kept for imports from before the routes were split by audience (``route_table``,
``access``, ``routes_*``); new code imports from those modules."""

from inference_wrapper.server.access import (
    CLIENT_ROLES,
    READER_ROLES,
    authorize,
    readable_tenant,
)
from inference_wrapper.server.route_table import ROUTES, Route, openapi_document
from inference_wrapper.server.routes_generate import GENERATE_FIELDS, generate_fields
from inference_wrapper.server.routes_openai import (
    CHAT_FIELDS,
    COMPLETION_FIELDS,
    chat_fields,
    completion_fields,
)
from inference_wrapper.server.routes_ops import readiness_checks

__all__ = ["CHAT_FIELDS", "CLIENT_ROLES", "COMPLETION_FIELDS", "GENERATE_FIELDS",
           "READER_ROLES", "ROUTES", "Route", "authorize", "chat_fields", "completion_fields",
           "generate_fields", "openapi_document", "readable_tenant", "readiness_checks"]
