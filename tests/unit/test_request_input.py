"""Request input rules in isolation: nesting depth, number size, query integers, JSON
Schema number semantics, and the stop-sequence cut."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from inference_wrapper.server.problems import Problem
from inference_wrapper.server.validation import (
    MAX_JSON_DEPTH,
    Field,
    check_fields,
    parse_json_body,
    query_int,
)


def refused(call: Any) -> Problem:
    with pytest.raises(Problem) as info:
        call()
    return info.value


def test_depth_at_the_limit_parses_and_one_more_is_refused() -> None:
    at_limit = "[" * (MAX_JSON_DEPTH - 1) + "]" * (MAX_JSON_DEPTH - 1)
    assert parse_json_body(f'{{"a": {at_limit}}}'.encode())["a"]
    over = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    problem = refused(lambda: parse_json_body(f'{{"a": {over}}}'.encode()))
    assert (problem.status, problem.field) == (400, "body")
    assert "deeper than 32" in problem.detail


def test_brackets_inside_strings_are_not_nesting() -> None:
    text = "[{" * 5000 + '\\"' + "]}" * 10
    body = parse_json_body(json.dumps({"prompt": text}).encode())
    assert body["prompt"] == text


def test_long_number_literals_are_refused_before_conversion() -> None:
    for literal in ("9" * 65, "1." + "0" * 70, "1e400"):
        problem = refused(lambda lit=literal: parse_json_body(f'{{"n": {lit}}}'.encode()))
        assert (problem.status, problem.field) == (400, "body")
    assert parse_json_body(b'{"n": 12345678901234567890}')["n"] == 12345678901234567890


def test_json_schema_number_semantics() -> None:
    spec = {"count": Field("integer", minimum=1, maximum=10),
            "ratio": Field("number", maximum=2)}
    checked = check_fields({"count": 5.0, "ratio": 2}, spec)
    assert checked == {"count": 5, "ratio": 2.0}
    assert type(checked["count"]) is int and type(checked["ratio"]) is float
    assert refused(lambda: check_fields({"count": 5.5}, spec)).field == "count"
    assert "between 1 and 10" in refused(lambda: check_fields({"count": 11.0}, spec)).detail
    assert "boolean" in refused(lambda: check_fields({"ratio": True}, spec)).detail


@pytest.mark.parametrize("raw", ["²", "٣", "+1", "-1", " 1", "1 ", "0x10", "", "1" * 21,
                                 "1_000"])
def test_query_integers_are_ascii_decimal(raw: str) -> None:
    problem = refused(lambda: query_int(raw, "limit"))
    assert (problem.status, problem.field) == (400, "limit")


def test_query_integer_bounds() -> None:
    assert query_int("0", "from") == 0
    assert query_int(None, "limit", default=100) == 100
    assert query_int(str(2**53 - 1), "to") == 2**53 - 1
    assert "between 0 and" in refused(lambda: query_int(str(2**53), "to")).detail
    assert refused(lambda: query_int(None, "from")).detail == "is required"


def test_stop_cut_keeps_tokens_up_to_the_completing_one(tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    from inference_wrapper.engine.generate import apply_stop

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir, local_files_only=True)
    ids = tokenizer("abcXYdefXYg", add_special_tokens=False)["input_ids"]
    text = tokenizer.decode(ids)
    assert apply_stop(tokenizer, ids, text, ("nope",)) is None
    cut = apply_stop(tokenizer, ids, text, ("XY", "f"))
    assert cut is not None
    kept, visible = cut
    assert visible == "abc"  # before the first stop sequence, which spans two tokens
    assert tokenizer.decode(kept) == "abcXY"


def test_contract_count_matches_the_tokenizer_even_with_backend_truncation(
    tiny_model_dir: Path
) -> None:
    from transformers import AutoTokenizer

    from inference_wrapper.engine.contract import ContextLengthError, TokenizationContract

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir, local_files_only=True)
    contract = TokenizationContract(tokenizer_digest="sha256:unused", max_length=16)
    for text in ("Hello ledger", "<s>user\nhi</s>\n<s>assistant\n", "é" * 40):
        expected = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        assert contract.count(tokenizer, text) == expected
    tokenizer.backend_tokenizer.enable_truncation(8)  # must not make a prompt look short
    assert contract.count(tokenizer, "y" * 40) == 40
    with pytest.raises(ContextLengthError) as info:
        contract.check_length(tokenizer, "y" * 40, truncate=False)
    assert (info.value.field, info.value.tokens, info.value.max_length) == ("prompt", 40, 16)
    assert contract.check_length(tokenizer, "y" * 40, truncate=True) == 40
