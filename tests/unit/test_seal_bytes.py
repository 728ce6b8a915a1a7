"""A batch's leaves are the same bytes however quickly they are built (decision 0054).

``build_records_v2`` joins a per-kind layout with each row's leaves, and the commitments
are HMAC spelt out over copied hash states; both only for speed. Here, for many shapes
of batch (sizes 1, 2 and 32, mixed optional members, unicode and escaped tenants, stop
strings, users, streamed rows, GPU samples, floats of every spelling), each leaf equals
the one-record reference path (``build_record_v2``: every rule, the full RFC 8785
encoding) with the standard library's HMAC, and all of them together hash to what the
code before the fast path (commit 16c6a1b) built from the same inputs.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

import pytest

from ledger.leaves import commitments
from ledger.leaves.envelope import Leaf
from ledger.leaves.kinds import open_leaf
from ledger.leaves.record_v2 import (
    EnvironmentRef,
    RowFacts,
    build_record_v2,
    build_records_v2,
    row_data,
)

ORIGIN = "seal.example/log"
# sha256 over every shape's (envelope, body) pairs, as the code of 16c6a1b built them.
BEFORE_THE_FAST_PATH = "3367963d8ad017db797bf19281694243e89660e6f045a833cc42d2d8f910ac53"
TENANTS = ("bench", "Zürich-银行", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 😀", 'quote"back\\slash', "tab\tnew\nline",
           "\u2028\u00e9\u0301", "a" * 128, "%s %b %%")
GENERATIONS = (
    {"do_sample": False, "max_new_tokens": 32, "seed": None, "temperature": 0.0,
     "top_p": 1.0},
    {"do_sample": True, "max_new_tokens": 7, "seed": 12345, "temperature": 0.7,
     "top_p": 0.9, "repetition_penalty": 1.00001, "tiny": 1e-05, "huge": 1.5e15},
)
TIMINGS = (
    {"tokenize": 0.51234, "forward": 120.123, "decode": 0.3},
    {"queue": 0.0, "forward": 1234567.891, "decode": 1e-07, "z": 2.0005},
    {},
)
SAMPLES = (None, {"memory_used_bytes": 123456789, "power_w": 71.25,
                  "utilization_pct": 99.0, "temperature_c": None})


def _record_ids(count: int, start: int) -> list[str]:
    return [f"0193a1b2-c3d4-7e5f-8a6b-{n:012x}" for n in range(start, start + count)]


def _row(shape: int, row: int, padded_length: int) -> RowFacts:
    salt = hashlib.sha256(b"%d/%d" % (shape, row)).digest()
    stop = (("\n\n", "END", "«fin»", "😀")[: row % 4] if row % 3 else ())
    user = (None, "user-42", "ユーザー", "")[row % 4]
    real = 1 + (row * 7 + shape) % padded_length
    return RowFacts(
        tenant=TENANTS[(row + shape) % len(TENANTS)],
        commitments=commitments.row_commitments(
            input_salt=salt, output_salt=salt[::-1], prompt=f"prompt {row} «{shape}» 🙂",
            input_ids=list(range(row, row + real)), output="out\u0000put" * (row % 5),
            output_ids=[2**40, -1, row][: 1 + row % 3], stop=stop, user=user,
            user_salt=salt[1:] + b"u"),
        input_token_count=real, output_token_count=1 + row % 3,
        truncated=row % 5 == 4, finish_reason=("stop", "length")[row % 2],
        padding_count=padded_length - real,
        parse_ms=(0.0, 0.0004, 12.3456, 1e6, 0.1 * row, 7.0)[row % 6],
        stream_start_record_id=(f"0193a1b2-c3d4-7e5f-8a6b-{row:012x}"
                                if row % 7 == 3 else None),
        row=None)


def shapes() -> list[dict[str, Any]]:
    """``build_records_v2``'s arguments for each shape (but ``record_ids``)."""
    result = []
    for shape, (size, padded_length) in enumerate(
            [(1, 9), (2, 16), (32, 24), (32, 40), (5, 3), (32, 16), (2, 1), (9, 64)]):
        rows = [_row(shape, row, padded_length) for row in range(size)]
        stated = None
        if shape == 4:  # some rows of a larger batch, numbered as they ran
            rows = [RowFacts(**{**vars(facts), "row": row * 2})
                    for row, facts in enumerate(rows)]
            stated = 11
        result.append({
            "origin": ORIGIN, "engine": ("engine-0", "gpu.node_7-a")[shape % 2],
            "environment": EnvironmentRef(shape * 1000, hashlib.sha256(b"%d" % shape).digest()),
            "batch_id": hashlib.md5(b"%d" % shape).hexdigest(),
            "padded_length": padded_length, "padding_side": ("left", "right")[shape % 2],
            "generation": GENERATIONS[shape % 2], "timings_ms": TIMINGS[shape % 3],
            "gpu_sample": SAMPLES[shape % 2],
            "created_at": f"2026-12-0{1 + shape % 9}T23:59:5{shape % 10}.{shape:03d}Z",
            "batch_size": stated, "rows": rows})
    return result


def _built() -> list[list[Leaf]]:
    built, start = [], 0
    for arguments in shapes():
        ids = _record_ids(len(arguments["rows"]), start)
        start += len(ids)
        built.append(build_records_v2(**arguments, record_ids=ids))
    return built


def digest_of(batches: list[list[Leaf]]) -> str:
    hashed = hashlib.sha256()
    for leaves in batches:
        for leaf in leaves:
            hashed.update(leaf.envelope + b"\n" + leaf.body + b"\n")
    return hashed.hexdigest()


def test_the_batches_are_the_bytes_built_before_the_fast_path() -> None:
    assert digest_of(_built()) == BEFORE_THE_FAST_PATH


def test_each_leaf_is_the_one_record_reference_with_the_library_hmac() -> None:
    for arguments, leaves in zip(shapes(), _built(), strict=True):
        rows, stated = arguments["rows"], arguments["batch_size"]
        size = len(rows) if stated is None else stated
        for place, (facts, leaf) in enumerate(zip(rows, leaves, strict=True)):
            alone = build_record_v2(
                origin=ORIGIN, tenant=facts.tenant, engine=arguments["engine"],
                environment=arguments["environment"], commitments=facts.commitments,
                data=row_data(
                    input_token_count=facts.input_token_count,
                    output_token_count=facts.output_token_count, truncated=facts.truncated,
                    finish_reason=facts.finish_reason, rows=size,
                    padded_length=arguments["padded_length"],
                    padding_side=arguments["padding_side"],
                    padding_count=facts.padding_count, generation=arguments["generation"]),
                batch={"id": arguments["batch_id"], "size": size,
                       "row": place if facts.row is None else facts.row},
                timings_ms={**arguments["timings_ms"], "parse": facts.parse_ms},
                gpu_sample=arguments["gpu_sample"],
                stream_start_record_id=facts.stream_start_record_id,
                record_id=leaf.record_id, created_at=arguments["created_at"])
            assert (leaf.envelope, leaf.body, leaf.leaf_hash) == \
                (alone.envelope, alone.body, alone.leaf_hash)
            assert leaf.content == alone.content
            assert open_leaf(leaf.envelope, leaf.body, ORIGIN, strict=True).content \
                == leaf.content


@pytest.mark.parametrize("size", [1, 2, 32])
def test_commitments_in_a_batch_open_with_the_library_hmac(size: int) -> None:
    """What a caller holding the salts checks: the library's HMAC of each value."""
    for row in range(size):
        salt, output_salt, user_salt = (hashlib.sha256(b"%d%s" % (row, x)).digest()
                                        for x in (b"i", b"o", b"u"))
        prompt, output = f"é{row}😀", "ok\n" * row
        made = commitments.row_commitments(
            input_salt=salt, output_salt=output_salt, prompt=prompt, input_ids=[row, 5],
            output=output, output_ids=[7] * row, stop=("x", "ÿ"), user="u", user_salt=user_salt)

        def library(key: bytes, label: str, value: bytes) -> str:
            return "hmac-sha256:" + hmac.new(key, label.encode() + b"\x00" + value,
                                             "sha256").hexdigest()

        assert made == {
            "input": library(salt, "input", prompt.encode()),
            "input_ids": library(salt, "input_ids", commitments.token_ids_bytes([row, 5])),
            "output": library(output_salt, "output", output.encode()),
            "output_ids": library(output_salt, "output_ids",
                                  commitments.token_ids_bytes([7] * row)),
            "stop": library(salt, "stop", commitments.stop_bytes(("x", "ÿ"))),
            "user": library(user_salt, "user", b"u")}


def test_a_sealed_batch_is_the_reference_bytes(tiny_generator: Any) -> None:
    """``AuditedGenerator.seal`` end to end on the tiny model: each leaf is the reference
    record of its request, with commitments made by the library's HMAC from the salts."""
    from dataclasses import replace

    from inference_wrapper.audit.generator import LogBinding, recorded
    from inference_wrapper.engine.params import GenerationParams

    environment = tiny_generator.environment_leaf()
    ref = EnvironmentRef(3, environment.leaf_hash)
    log = LogBinding(ORIGIN)
    log.bind(tiny_generator.environment(), ref)
    requests = [tiny_generator.prepare(
        f"row {row} «é» 😀" * (1 + row), GenerationParams(max_new_tokens=3),
        TENANTS[row % len(TENANTS)], stop=("\n", "«") if row % 2 else (),
        user="u-é" if row % 3 == 0 else None) for row in range(5)]
    requests[4] = replace(requests[4], stream_start_id="0193a1b2-c3d4-7e5f-8a6b-00000000000a")
    batch = tiny_generator.run_batch(requests)
    outputs = recorded(tiny_generator.seal(batch, log))

    def library(key: bytes, label: str, value: bytes) -> str:
        return "hmac-sha256:" + hmac.new(key, label.encode() + b"\x00" + value,
                                         "sha256").hexdigest()

    result = batch.result
    for row, (request, output) in enumerate(zip(requests, outputs, strict=True)):
        real = [token for token, kept in zip(result.input_ids[row], result.attention_mask[row],
                                             strict=True) if kept]
        expected = {
            "input": library(request.input_salt, "input", request.prompt.encode()),
            "input_ids": library(request.input_salt, "input_ids",
                                 commitments.token_ids_bytes(real)),
            "output": library(request.output_salt, "output", result.texts[row].encode()),
            "output_ids": library(request.output_salt, "output_ids",
                                  commitments.token_ids_bytes(result.output_ids[row]))}
        if request.stop:
            expected["stop"] = library(request.input_salt, "stop",
                                       commitments.stop_bytes(request.stop))
        if request.user is not None:
            expected["user"] = library(request.user_salt, "user", request.user.encode())
        leaf = output.record
        assert isinstance(leaf, Leaf)
        content = leaf.content
        alone = build_record_v2(
            origin=ORIGIN, tenant=request.tenant, engine=content["engine"], environment=ref,
            commitments=expected, data=content["data"], batch=content["batch"],
            timings_ms=content["timings_ms"], gpu_sample=content["gpu_sample"],
            stream_start_record_id=request.stream_start_id, record_id=leaf.record_id,
            created_at=leaf.created_at)
        assert (leaf.envelope, leaf.body, leaf.leaf_hash) == \
            (alone.envelope, alone.body, alone.leaf_hash)
        assert content["batch"]["row"] == row and content["data"]["input_token_count"] == len(real)


@pytest.mark.parametrize("where", ["generation", "timings_ms"])
def test_a_number_no_reader_could_open_is_never_written(where: str) -> None:
    """An integral float from 2**53 up is written by RFC 8785 as bare digits, which read
    back as an integer without canonical bytes: such a leaf could never be opened again.
    The batch refuses to build (the seal then refuses each row alone) instead."""
    from ledger.errors import CanonicalFormError

    arguments = shapes()[0]
    arguments[where] = {**arguments[where], "huge": 1.5e16}
    with pytest.raises(CanonicalFormError, match="integer beyond 2\\*\\*53"):
        build_records_v2(**arguments, record_ids=_record_ids(1, 0))
