"""Request input: bounded JSON parsing, field specs that also feed the OpenAPI document,
and query integers parsed as ASCII decimals with bounds."""

from __future__ import annotations

import asyncio
import json
import math
import re
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from inference_wrapper.engine.params import MIN_SAMPLING_TEMPERATURE
from inference_wrapper.server.problems import Problem, invalid

# Nesting deeper than this is refused before parsing: the parser recurses per level.
MAX_JSON_DEPTH = 32
# Longest number literal accepted: far beyond any bound a field has, far below the cost
# of converting a 5,000-digit literal (and Python's 4,300-digit conversion limit).
MAX_NUMBER_CHARS = 64
# Query integers: JSON-safe (records are RFC 8785 JSON) and within SQL's 64-bit integers.
MAX_QUERY_INT = 2**53 - 1
# Sampling below this temperature has no defined distribution (engine.params).
TEMPERATURE_GAP = (0.0, MIN_SAMPLING_TEMPERATURE)
# A prompt holds at least one character that str.strip() keeps (its whitespace, listed).
NOT_ONLY_WHITESPACE = ("[^\\t-\\r\\x1c-\\x20\\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029"
                       "\\u202f\\u205f\\u3000]")
TEMPERATURE_GAP_REASON = f"must be 0 (greedy) or at least {MIN_SAMPLING_TEMPERATURE}"


@dataclass(frozen=True)
class Field:
    """One body field: its JSON type, bounds and supported values.

    ``kind`` is string, integer, number, boolean, array, object or string-or-array.
    Bounds follow JSON Schema: ``minimum``/``maximum`` inclusive, ``exclusive_minimum``
    strict; ``min_length``/``max_length`` count characters of a string or items of an array.
    """

    kind: str
    required: bool = False
    description: str = ""
    nullable: bool = False
    only: tuple[Any, ...] | None = None  # the values this server supports
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: float | None = None
    # (low, high): numbers strictly between them are refused (0 < temperature < 0.01)
    gap: tuple[float, float] | None = None
    gap_reason: str = ""
    min_length: int | None = None
    max_length: int | None = None
    pattern: str | None = None  # a string must contain a match (JSON Schema's pattern)
    pattern_reason: str = ""
    # JSON Schema of an array's items, of an object field itself (documented; the route
    # checks the members)
    items: dict[str, Any] | None = None
    only_reason: str = ""  # why other values are refused, for the error message


JSON_TYPES: dict[str, type | tuple[type, ...]] = {
    "string": str, "integer": int, "number": (int, float), "boolean": bool, "array": list,
    "object": dict, "string-or-array": (str, list)}


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise invalid(key, f"duplicate key {key!r}", status=400)
        result[key] = value
    return result


def _no_constants(name: str) -> Any:
    raise invalid("body", f"{name} is not valid JSON", status=400)


def _bounded_int(text: str) -> int:
    if len(text) > MAX_NUMBER_CHARS:
        raise invalid("body", f"a number has {len(text)} characters, more than "
                      f"{MAX_NUMBER_CHARS}", status=400)
    return int(text)


def _bounded_float(text: str) -> float:
    if len(text) > MAX_NUMBER_CHARS:
        raise invalid("body", f"a number has {len(text)} characters, more than "
                      f"{MAX_NUMBER_CHARS}", status=400)
    value = float(text)
    if not math.isfinite(value):
        raise invalid("body", f"the number {text} is too large", status=400)
    return value


# A JSON string (escapes included) or a bracket: enough to measure nesting.
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)


def _check_depth(text: str) -> None:
    # Fast path: fewer brackets than the limit cannot nest beyond it.
    if text.count("[") + text.count("{") <= MAX_JSON_DEPTH:
        return
    depth = 0
    for match in _TOKENS.finditer(text):
        token = match.group()
        if token in ("[", "{"):
            depth += 1
            if depth > MAX_JSON_DEPTH:
                raise invalid("body", f"JSON nests deeper than {MAX_JSON_DEPTH} levels",
                              status=400)
        elif token in ("]", "}"):
            depth -= 1


def parse_json_body(raw: bytes) -> dict[str, Any]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise invalid("body", f"request body is not valid UTF-8 (byte {exc.start})",
                      status=400) from exc
    _check_depth(text)
    try:
        value = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constants,
                           parse_int=_bounded_int, parse_float=_bounded_float)
    except json.JSONDecodeError as exc:
        raise invalid("body", f"request body is not valid JSON: {exc.msg} at "
                      f"line {exc.lineno} column {exc.colno}", status=400) from exc
    except RecursionError as exc:  # a second guard; _check_depth should stop it first
        raise invalid("body", "JSON nests too deeply", status=400) from exc
    if not isinstance(value, dict):
        raise invalid("body", "request body must be a JSON object", status=400)
    if _SURROGATE_ESCAPE.search(text):  # only an escape can make a lone surrogate
        check_encodable(value, "")
    return value


# A \uD800-\uDFFF escape: a lone one survives json.loads as a lone surrogate, which
# neither UTF-8 nor the records' canonical JSON can encode.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF]")


def check_encodable(value: Any, path: str) -> None:
    """Refuse a string (a value or a key, at any depth) that is not valid Unicode, naming
    its field (``messages[0].name``): such a string would fail later, in the record of a
    whole batch, or in the idempotency fingerprint."""
    if isinstance(value, str):
        _encodable(value, path or "body")
    elif isinstance(value, dict):
        for key, item in value.items():
            shown = key.encode("utf-8", "backslashreplace").decode("utf-8")
            where = f"{path}.{shown}" if path else shown
            _encodable(key, where)
            check_encodable(item, where)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_encodable(item, f"{path}[{i}]")


def _encodable(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise invalid(where, f"holds a lone surrogate (\\u{ord(text[exc.start]):04x} at "
                      f"character {exc.start}), which is not valid Unicode") from exc


# What aiohttp decodes; anything else would reach the JSON parser still compressed.
CONTENT_ENCODINGS = ("identity", "gzip", "deflate")


async def read_json_body(request: web.Request, spec: dict[str, Field],
                         timeout_s: float) -> dict[str, Any]:
    """The checked JSON body: 415 for another media type or an unknown Content-Encoding,
    400 for a body that does not decompress, 408 for a body not received within
    ``timeout_s`` (a stalled upload must not hold a request slot or the shutdown)."""
    if request.content_type != "application/json":
        raise invalid("Content-Type", "must be application/json", status=415)
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in CONTENT_ENCODINGS:
        raise invalid("Content-Encoding", "must be one of " + ", ".join(CONTENT_ENCODINGS),
                      status=415)
    try:
        async with asyncio.timeout(timeout_s):
            raw = await request.read()
    except TimeoutError:
        raise Problem(408, "Request Timeout", f"the request body was not received within "
                      f"{timeout_s:g} s", field="body",
                      headers={"Connection": "close"}) from None
    except (HttpProcessingError, RequestPayloadError) as exc:  # a body that does not decode
        field = "Content-Encoding" if encoding != "identity" else "body"
        # The connection's byte stream is in an unknown state: it is not reused.
        raise Problem(400, "Invalid request", f"the body could not be read as {encoding} "
                      "data", field=field, headers={"Connection": "close"}) from exc
    return check_fields(parse_json_body(raw), spec)


def _coerce(name: str, field: Field, value: Any) -> Any:
    """JSON Schema's view of numbers: 5.0 is an integer, and an integer is a number."""
    if isinstance(value, bool) and field.kind in ("integer", "number"):
        raise invalid(name, f"must be a {field.kind}, got a boolean")
    if field.kind == "integer" and isinstance(value, float):
        if not value.is_integer():
            raise invalid(name, f"must be an integer, got {value}")
        return int(value)
    if field.kind == "number" and isinstance(value, int):
        return float(value)  # ints must not reach code that expects floats
    return value


def _check_bounds(name: str, field: Field, value: Any) -> None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        low, high = field.minimum, field.maximum
        if field.exclusive_minimum is not None and value <= field.exclusive_minimum:
            raise invalid(name, f"must be greater than {field.exclusive_minimum:g}, "
                          f"got {value}")
        if (low is not None and value < low) or (high is not None and value > high):
            raise invalid(name, f"must be between {_show(low)} and {_show(high)}, "
                          f"got {value}")
        if field.gap is not None and field.gap[0] < value < field.gap[1]:
            raise invalid(name, field.gap_reason or f"must not lie between "
                          f"{field.gap[0]:g} and {field.gap[1]:g}, got {value}")
    if isinstance(value, str) and field.kind == "string-or-array":
        return  # the bounds count the array's items; a lone string is checked as an item
    if isinstance(value, (str, list)):
        size, unit = len(value), "characters" if isinstance(value, str) else "items"
        if field.min_length is not None and size < field.min_length:
            raise invalid(name, "must not be empty" if field.min_length == 1 else
                          f"must have at least {field.min_length} {unit}")
        if field.max_length is not None and size > field.max_length:
            raise invalid(name, f"has {size} {unit}, at most {field.max_length} allowed")
    if isinstance(value, str) and field.pattern is not None \
            and not re.search(field.pattern, value):
        raise invalid(name, field.pattern_reason or f"must match {field.pattern}")


def _show(bound: float | None) -> str:
    if bound is None:
        return "unbounded"
    return str(int(bound)) if float(bound).is_integer() else str(bound)


def check_fields(body: dict[str, Any], spec: dict[str, Field]) -> dict[str, Any]:
    """Refuse unknown fields, missing required ones, wrong types, values out of bounds and
    unsupported values; return the body with numbers converted to their field's kind."""
    for name in body:
        if name not in spec:
            raise invalid(name, f"unknown field {name!r}")
    checked: dict[str, Any] = {}
    for name, field in spec.items():
        if name not in body:
            if field.required:
                raise invalid(name, "is required")
            continue
        value = body[name]
        if value is None and field.nullable:
            checked[name] = None
            continue
        value = _coerce(name, field, value)
        expected = JSON_TYPES[field.kind]
        if not isinstance(value, expected):
            article = "an" if field.kind[0] in "aeio" else "a"
            raise invalid(name, f"must be {article} {field.kind}, got {_json_type(value)}")
        if isinstance(value, float) and not math.isfinite(value):
            raise invalid(name, "must be finite")
        _check_bounds(name, field, value)
        if field.only is not None and value not in field.only:
            supported = ", ".join(json.dumps(v) for v in field.only)
            raise invalid(name, f"this server supports only {supported}"
                          + (f": {field.only_reason}" if field.only_reason else ""))
        checked[name] = value
    return checked


def _json_type(value: Any) -> str:
    return {str: "string", int: "integer", float: "number", bool: "boolean", list: "array",
            dict: "object", type(None): "null"}.get(type(value), type(value).__name__)


def field_schema(field: Field) -> dict[str, Any]:
    """The JSON Schema of one field, from the same spec the server checks with."""
    if field.kind == "string-or-array":
        item = field.items or {}
        variants: list[dict[str, Any]] = [
            {"type": "string", **{k: v for k, v in item.items()
                                  if k in ("minLength", "maxLength")}},
            {"type": "array", "items": field.items or {},
             **({"maxItems": field.max_length} if field.max_length is not None else {})}]
        if field.nullable:
            variants.append({"type": "null"})
        prop: dict[str, Any] = {"anyOf": variants}
    else:
        prop = {"type": [field.kind, "null"] if field.nullable else field.kind}
        if field.kind == "array":
            prop["items"] = field.items or {}
        elif field.kind == "object" and field.items:  # an object field's own schema
            prop.update({k: v for k, v in field.items.items() if k != "type"})
        if field.minimum is not None:
            prop["minimum"] = field.minimum
        if field.maximum is not None:
            prop["maximum"] = field.maximum
        if field.exclusive_minimum is not None:
            prop["exclusiveMinimum"] = field.exclusive_minimum
        if field.gap is not None:  # typed, so that a null still passes a nullable field
            prop["not"] = {"type": "number", "exclusiveMinimum": field.gap[0],
                           "exclusiveMaximum": field.gap[1]}
        length = ("minLength", "maxLength") if field.kind == "string" else ("minItems",
                                                                            "maxItems")
        if field.min_length is not None:
            prop[length[0]] = field.min_length
        if field.max_length is not None:
            prop[length[1]] = field.max_length
        if field.pattern is not None:
            prop["pattern"] = field.pattern
    if field.description:
        prop["description"] = field.description
    if field.only is not None:
        prop["enum"] = list(field.only) + ([None] if field.nullable else [])
    return prop


def openapi_schema(spec: dict[str, Field]) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": False,
            "properties": {name: field_schema(field) for name, field in spec.items()},
            "required": [n for n, f in spec.items() if f.required]}


_ASCII_DECIMAL = re.compile(r"[0-9]{1,20}")


def query_int(raw: str | None, name: str, *, default: int | None = None, low: int = 0,
              high: int = MAX_QUERY_INT) -> int:
    """A query integer: ASCII decimal digits only (``str.isdigit`` accepts '²' and other
    scripts' digits), within [low, high]."""
    if raw is None:
        if default is None:
            raise invalid(name, "is required", status=400)
        return default
    if not _ASCII_DECIMAL.fullmatch(raw):
        raise invalid(name, f"must be a decimal integer between {low} and {high}", status=400)
    value = int(raw)
    if not low <= value <= high:
        raise invalid(name, f"must be between {low} and {high}, got {value}", status=400)
    return value


__all__ = ["Field", "Problem", "check_fields", "read_json_body", "field_schema", "openapi_schema",
           "parse_json_body", "query_int"]
