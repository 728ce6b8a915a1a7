"""Rules the handlers enforce that the API document must state too, so that a client (or
schemathesis) generating from the document never sends a schema-valid body that is refused."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from inference_wrapper.server.route_table import openapi_document


def _body_schema(path: str) -> dict[str, Any]:
    operation = openapi_document()["paths"][path]["post"]
    schema: dict[str, Any] = operation["requestBody"]["content"]["application/json"]["schema"]
    return schema


def _valid(schema: dict[str, Any], body: dict[str, Any]) -> bool:
    return jsonschema.Draft202012Validator(schema).is_valid(body)


@pytest.mark.parametrize(("temperature", "valid"), [
    (0, True), (0.01, True), (1.5, True), (1.2771190139919257e-214, False), (0.005, False)])
def test_a_temperature_between_greedy_and_sampling_is_refused_by_the_document(
        temperature: float, valid: bool) -> None:
    """The handlers answer 0 < temperature < 0.01 with 422 (no defined distribution)."""
    assert _valid(_body_schema("/v1/generate"), {"prompt": "x", "temperature": temperature}) \
        is valid
    chat = {"model": "m", "messages": [{"role": "user", "content": "x"}],
            "temperature": temperature}
    assert _valid(_body_schema("/v1/chat/completions"), chat) is valid


def test_a_null_temperature_stays_valid_where_the_field_is_nullable() -> None:
    chat = {"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": None}
    assert _valid(_body_schema("/v1/chat/completions"), chat)


def test_stream_options_only_with_a_stream() -> None:
    base = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    options = {"stream_options": {"include_usage": True}}
    schema = _body_schema("/v1/chat/completions")
    assert _valid(schema, {**base, **options, "stream": True})
    assert not _valid(schema, {**base, **options})
    assert not _valid(schema, {**base, **options, "stream": False})
    assert _valid(schema, {**base, "stream_options": None})


@pytest.mark.parametrize(("prompt", "valid"), [
    ("a", True), (" a ", True), ("\u200b", True), ("", False), ("\u00a0", False),
    ("\x1c", False), (" \t\n\u3000", False)])
def test_a_prompt_of_only_whitespace_is_refused_by_the_document(prompt: str, valid: bool) -> None:
    """The handlers refuse a prompt that str.strip() empties (422 'must not be empty')."""
    assert _valid(_body_schema("/v1/generate"), {"prompt": prompt}) is valid
    assert _valid(_body_schema("/v1/completions"), {"model": "m", "prompt": prompt}) is valid


def test_every_path_parameter_is_defined() -> None:
    for path, methods in openapi_document()["paths"].items():
        named = {p["name"] for op in methods.values() for p in op.get("parameters", [])
                 if p["in"] == "path"}
        wanted = {part[1:-1] for part in path.split("/") if part.startswith("{")}
        assert wanted <= named, path
