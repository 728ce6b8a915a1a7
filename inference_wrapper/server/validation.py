"""Request bodies: strict JSON parsing and field specs that also feed the OpenAPI document."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from inference_wrapper.server.problems import Problem, invalid


@dataclass(frozen=True)
class Field:
    kind: str  # string, integer, number, boolean, array, object, null-or-string
    required: bool = False
    description: str = ""
    nullable: bool = False
    only: tuple[Any, ...] | None = None  # the values this server supports


JSON_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool,
              "array": list, "object": dict}


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise invalid(key, f"duplicate key {key!r}", status=400)
        result[key] = value
    return result


def _no_constants(name: str) -> Any:
    raise invalid("body", f"{name} is not valid JSON", status=400)


def parse_json_body(raw: bytes) -> dict[str, Any]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise invalid("body", f"request body is not valid UTF-8 (byte {exc.start})",
                      status=400) from exc
    try:
        value = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constants)
    except json.JSONDecodeError as exc:
        raise invalid("body", f"request body is not valid JSON: {exc.msg} at "
                      f"line {exc.lineno} column {exc.colno}", status=400) from exc
    if not isinstance(value, dict):
        raise invalid("body", "request body must be a JSON object", status=400)
    return value


def check_fields(body: dict[str, Any], spec: dict[str, Field]) -> dict[str, Any]:
    """Refuse unknown fields, missing required ones, wrong types and unsupported values."""
    for name in body:
        if name not in spec:
            raise invalid(name, f"unknown field {name!r}")
    for name, field in spec.items():
        if name not in body:
            if field.required:
                raise invalid(name, "is required")
            continue
        value = body[name]
        if value is None and field.nullable:
            continue
        expected = JSON_TYPES[field.kind]
        if isinstance(value, bool) and field.kind in ("integer", "number"):
            raise invalid(name, f"must be a {field.kind}, got a boolean")
        if not isinstance(value, expected):  # type: ignore[arg-type]
            raise invalid(name, f"must be a {field.kind}, got {type(value).__name__}")
        if isinstance(value, float) and not math.isfinite(value):
            raise invalid(name, "must be finite")
        if field.only is not None and value not in field.only:
            raise invalid(name, f"this server supports only {list(field.only)}")
    return body


def openapi_schema(spec: dict[str, Field]) -> dict[str, Any]:
    properties: dict[str, Any] = {}
    for name, field in spec.items():
        prop: dict[str, Any] = {"type": [field.kind, "null"] if field.nullable else field.kind}
        if field.description:
            prop["description"] = field.description
        if field.only is not None:
            prop["enum"] = list(field.only) + ([None] if field.nullable else [])
        if field.kind == "array":
            prop["items"] = {}
        properties[name] = prop
    return {"type": "object", "additionalProperties": False, "properties": properties,
            "required": [n for n, f in spec.items() if f.required]}


__all__ = ["Field", "Problem", "check_fields", "openapi_schema", "parse_json_body"]
