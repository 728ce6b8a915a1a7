"""The v2 leaf format: envelope, record and environment bodies, labelled commitments.

The stored vectors (``tests/vectors/leaves_v2.json``) pin the exact bytes: the format
is forever, so a builder that changes a byte fails here.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ledger import merkle
from ledger.canonical import canonical_bytes
from ledger.errors import CanonicalFormError, InvalidInputError, LeafBindingError
from ledger.leaves import body_codec, commitments
from ledger.leaves.envelope import is_envelope, tenant_tag
from ledger.leaves.environment import build_environment, environment_columns
from ledger.leaves.kinds import open_leaf
from ledger.leaves.record_v2 import EnvironmentRef, build_record_v2, row_data
from tests.vectors.make_leaf_vectors import build

VECTORS = json.loads((Path(__file__).resolve().parents[1] / "vectors" /
                      "leaves_v2.json").read_text())
ORIGIN = VECTORS["inputs"]["origin"]
DICTIONARY_1_SHA256 = "85f248b00ab5f4b640893fe95d4cddb934a1b70cf3b9fe428adb613754fe2099"


def _hmac_by_hand(key: bytes, message: bytes) -> bytes:
    """RFC 2104 spelled out, so the commitment is shown to be HMAC-SHA256 itself."""
    block = key.ljust(64, b"\0")
    inner = hashlib.sha256(bytes(b ^ 0x36 for b in block) + message).digest()
    return hashlib.sha256(bytes(b ^ 0x5C for b in block) + inner).digest()


def test_vectors_rebuild_byte_for_byte() -> None:
    assert build(VECTORS["inputs"]) == VECTORS["leaves"]


def test_vector_leaves_open_and_hash_as_rfc9162_leaves() -> None:
    for name in ("environment", "record"):
        stored = VECTORS["leaves"][name]
        envelope, body = stored["envelope"].encode(), stored["body"].encode()
        leaf = open_leaf(envelope, body, ORIGIN, strict=True)
        assert leaf.leaf_hash.hex() == stored["leaf_hash"]
        assert leaf.leaf_hash == hashlib.sha256(b"\x00" + envelope).digest()
        assert json.loads(envelope)["body"] == "sha256:" + hashlib.sha256(body).hexdigest()
        assert is_envelope(envelope) and not is_envelope(body)


def test_record_envelope_carries_the_tenant_tag_and_nothing_of_the_body() -> None:
    record = VECTORS["leaves"]["record"]
    envelope = json.loads(record["envelope"])
    expected_tag = hashlib.sha256(
        f"audit-ledger tenant-tag/v1\n{ORIGIN}\nacme".encode()).hexdigest()
    assert envelope == {"schema": "audit-leaf/v2", "kind": "audit-record/v2",
                        "created_at": "2026-12-02T01:02:04.000Z",
                        "tenant_tag": "sha256:" + expected_tag,
                        "body": envelope["body"]}
    assert tenant_tag("other/log", "acme") != envelope["tenant_tag"]
    environment = json.loads(VECTORS["leaves"]["environment"]["envelope"])
    assert environment["tenant_tag"] is None and environment["kind"] == "environment/v1"


def test_commitments_are_labelled_hmac_sha256() -> None:
    inputs = VECTORS["inputs"]["record"]
    body = json.loads(VECTORS["leaves"]["record"]["body"])
    salt = bytes.fromhex(inputs["input_salt"])
    by_hand = _hmac_by_hand(salt, b"input\x00" + inputs["prompt"].encode())
    assert body["commitments"]["input"] == "hmac-sha256:" + by_hand.hex()
    ids = b"".join(i.to_bytes(8, "little", signed=True) for i in inputs["input_ids"])
    assert body["commitments"]["input_ids"] == "hmac-sha256:" + _hmac_by_hand(
        salt, b"input_ids\x00" + ids).hex()
    out_salt = bytes.fromhex(inputs["output_salt"])
    assert commitments.opens(body["commitments"]["output"], out_salt, "output", b"42.")
    # The label separates fields under one salt: the input commitment never opens as
    # another label, nor with the output's salt.
    assert not commitments.opens(body["commitments"]["input"], salt, "stop",
                                 inputs["prompt"].encode())
    assert not commitments.opens(body["commitments"]["input"], out_salt, "input",
                                 inputs["prompt"].encode())
    assert commitments.opens(body["commitments"]["stop"], salt, "stop",
                             canonical_bytes(["\n\n"]))
    user_salt = bytes.fromhex(inputs["user_salt"])
    assert commitments.opens(body["commitments"]["user"], user_salt, "user",
                             b"alice@example.com")


def test_commit_refuses_a_short_salt_and_an_unknown_label() -> None:
    with pytest.raises(InvalidInputError, match="a salt has 32 bytes"):
        commitments.commit(b"short", "input", b"x")
    with pytest.raises(InvalidInputError, match="unknown commitment label 'prompt'"):
        commitments.commit(bytes(32), "prompt", b"x")


def _stored(name: str) -> tuple[bytes, bytes]:
    leaf = VECTORS["leaves"][name]
    return leaf["envelope"].encode(), leaf["body"].encode()


def _rebody(name: str, change: Any) -> tuple[bytes, bytes]:
    """A body changed by ``change`` with an envelope rebuilt to match its digest."""
    envelope, body = _stored(name)
    content = json.loads(body)
    change(content)
    new_body = canonical_bytes(content)
    fields = json.loads(envelope)
    fields["body"] = "sha256:" + hashlib.sha256(new_body).hexdigest()
    return canonical_bytes(fields), new_body


def test_a_changed_body_fails_its_envelope_digest() -> None:
    envelope, body = _stored("record")
    with pytest.raises(LeafBindingError, match="the body hashes to sha256:"):
        open_leaf(envelope, body.replace(b'"row":1', b'"row":0'), ORIGIN)


def test_a_body_of_another_tenant_fails_the_tag() -> None:
    envelope, body = _rebody("record", lambda c: c.update(tenant="globex"))
    with pytest.raises(LeafBindingError, match="not the tag of tenant 'globex'"):
        open_leaf(envelope, body, ORIGIN)
    with pytest.raises(LeafBindingError, match="tenant tag"):
        open_leaf(*_stored("record"), "another/log")


def test_envelope_and_body_times_must_agree() -> None:
    envelope, body = _rebody("record", lambda c: c.update(
        created_at="2026-12-02T01:02:05.000Z"))
    with pytest.raises(LeafBindingError, match="the envelope's time"):
        open_leaf(envelope, body, ORIGIN)


def test_a_log_wide_leaf_carries_no_tenant_tag() -> None:
    envelope, body = _stored("environment")
    fields = json.loads(envelope)
    fields["tenant_tag"] = tenant_tag(ORIGIN, "acme")
    with pytest.raises(LeafBindingError, match="null"):
        open_leaf(canonical_bytes(fields), body, ORIGIN)


@pytest.mark.parametrize(("change", "field"), [
    # An unsalted digest of content has no place to go: unknown members are refused.
    (lambda c: c["data"].update(input_ids_digest="sha256:" + "0" * 64), "record.data"),
    (lambda c: c.update(input_bytes=14), "record."),
    (lambda c: c["data"]["generation"].update(note="my PIN is 7236"), "record.data.generation"),
    (lambda c: c["commitments"].update(input="sha256:" + "0" * 64), "record.commitments.input"),
    (lambda c: c["commitments"].pop("output_ids"), "record.commitments"),
    (lambda c: c["gpu_sample"].update(name="x"), "record.gpu_sample"),
    (lambda c: c["data"]["padding"].update(count=3), "record.data.padding.count"),
    (lambda c: c["data"].update(finish_reason="eos"), "record.data.finish_reason"),
    (lambda c: c["batch"].update(row=2), "record.batch.row"),
    (lambda c: c["environment"].update(leaf_hash="00"), "record.environment.leaf_hash"),
    (lambda c: c["timings_ms"].update(forward=-1), "record.timings_ms"),
])
def test_record_body_rules_name_the_field(change: Any, field: str) -> None:
    with pytest.raises(CanonicalFormError) as caught:
        open_leaf(*_rebody("record", change), ORIGIN)
    assert caught.value.field == field


def test_environment_rules_name_the_field() -> None:
    with pytest.raises(CanonicalFormError) as caught:
        open_leaf(*_rebody("environment", lambda c: c["model"].update(digest="x")), ORIGIN)
    assert caught.value.field == "environment.model.digest"
    with pytest.raises(CanonicalFormError) as caught:
        open_leaf(*_rebody("environment", lambda c: c.update(tenant="acme")), ORIGIN)
    assert caught.value.field == "environment"


def test_kind_and_schema_must_agree() -> None:
    envelope, body = _stored("environment")
    fields = json.loads(envelope)
    fields["kind"] = "audit-record/v2"
    with pytest.raises(LeafBindingError, match="the body's schema is environment/v1"):
        open_leaf(canonical_bytes(fields), body, ORIGIN)
    fields["kind"] = "audit-record/v9"
    with pytest.raises(CanonicalFormError) as caught:
        open_leaf(canonical_bytes(fields), body, ORIGIN)
    assert caught.value.field == "envelope.kind"


def test_strict_opening_refuses_non_canonical_bytes() -> None:
    envelope, body = _stored("record")
    spaced = json.dumps(json.loads(body), sort_keys=True).encode()
    fields = json.loads(envelope)
    fields["body"] = "sha256:" + hashlib.sha256(spaced).hexdigest()
    open_leaf(canonical_bytes(fields), spaced, ORIGIN)  # one meaning: verify accepts
    with pytest.raises(CanonicalFormError, match="not in RFC 8785 canonical form"):
        open_leaf(canonical_bytes(fields), spaced, ORIGIN, strict=True)


def test_builders_default_ids_times_and_columns() -> None:
    environment = build_environment(**{**VECTORS["inputs"]["environment"],
                                       "record_id": None, "created_at": None})
    assert environment.tenant is None and environment.leaf_hash == merkle.hash_leaf(
        environment.envelope)
    assert environment_columns(environment.content) == {
        "model_name": "tiny-llama", "model_digest": "sha256:" + "ab" * 32,
        "accelerator": "cuda", "accelerator_model": "NVIDIA H200",
        "driver_version": "560.35.03", "torch_version": "2.5.1",
        "torch_commit": "a" * 40, "service_revision": "b" * 40}
    salts = bytes(32)
    record = build_record_v2(
        origin=ORIGIN, tenant="acme", engine="engine-0",
        environment=EnvironmentRef(0, environment.leaf_hash),
        commitments=commitments.row_commitments(
            input_salt=salts, output_salt=salts, prompt="p", input_ids=[1], output="o",
            output_ids=[2]),
        data=row_data(input_token_count=1, output_token_count=1, truncated=False,
                      finish_reason="length", rows=1, padded_length=1,
                      padding_side="left", padding_count=0, generation={"top_p": 1.0}),
        batch={"id": "a" * 32, "size": 1, "row": 0}, timings_ms={"forward": 2.0})
    opened = open_leaf(record.envelope, record.body, ORIGIN, strict=True)
    assert opened.record_id == record.record_id and opened.tenant == "acme"
    assert "stream" not in opened.content and opened.content["gpu_sample"] is None
    assert opened.content["timings_ms"] == {"forward": 2}


def test_kind_modules_import_without_the_record_module() -> None:
    """The stream start kind's rules no longer import ``ledger.record`` (the old cycle):
    importing them alone loads neither ``ledger.record`` nor a builder."""
    code = ("import sys, ledger.stream_record, ledger.leaves.kinds; "
            "print('ledger.record' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "False"


def test_stored_bodies_unpack_byte_for_byte_and_the_dictionary_never_changes() -> None:
    # Rows stored with format 1 are read with this dictionary forever.
    assert hashlib.sha256(body_codec.DICTIONARY_1).hexdigest() == DICTIONARY_1_SHA256
    for name in ("record", "environment"):
        body = VECTORS["leaves"][name]["body"].encode()
        stored = body_codec.pack_body(body)
        assert stored[:1] == b"\x01" and len(stored) < len(body) // 2
        assert body_codec.unpack_body(stored) == body
    stored = body_codec.pack_body(VECTORS["leaves"]["record"]["body"].encode())
    with pytest.raises(CanonicalFormError, match="unknown stored body format"):
        body_codec.unpack_body(b"\x02" + stored[1:])
    with pytest.raises(CanonicalFormError, match="cut short"):
        body_codec.unpack_body(stored[:-5])
    with pytest.raises(CanonicalFormError, match="trailing bytes"):
        body_codec.unpack_body(stored + b"x")


def test_packing_from_the_primed_stream_stores_what_a_fresh_stream_stores() -> None:
    """Bodies are packed and unpacked from copies of one stream that has taken the
    dictionary; the stored bytes must be those of a stream made for each body (rows
    stored before and after must agree), however many bodies, of whatever size, from
    however many threads."""
    import zlib
    from concurrent.futures import ThreadPoolExecutor

    def fresh(body: bytes) -> bytes:
        packer = zlib.compressobj(1, zlib.DEFLATED, -12, 4, zlib.Z_DEFAULT_STRATEGY,
                                  body_codec.DICTIONARY_1)
        return b"\x01" + packer.compress(body) + packer.flush()

    record = VECTORS["leaves"]["record"]["body"].encode()
    bodies = [record, b"", b"{}", record * 9,
              *(record.replace(b"0", bytes([48 + n % 10])) + b" " * n for n in range(300))]
    with ThreadPoolExecutor(4) as pool:
        stored = list(pool.map(body_codec.pack_body, bodies))
        back = list(pool.map(body_codec.unpack_body, stored))
    assert stored == [fresh(body) for body in bodies]
    assert back == bodies


@pytest.mark.parametrize("tag", [None, "sha256:" + "ab" * 32])
def test_the_written_out_envelope_is_the_encoders(tag: str | None) -> None:
    from ledger.leaves.envelope import envelope_bytes, envelope_members

    body = b'{"x":1}'
    for kind in ("audit-record/v2", 'odd"kind'):
        created_at = "2026-12-02T01:02:03.456Z"
        assert envelope_bytes(kind, created_at, tag, body) == canonical_bytes(
            envelope_members(kind, created_at, tag, body))
    # A time that is not one is the writer's format error, not an envelope.
    with pytest.raises(CanonicalFormError, match="envelope.created_at"):
        envelope_bytes("environment/v1", "not a time", tag, body)


@pytest.mark.parametrize("tag", [None, "sha256:" + "ab" * 32])
def test_the_envelope_read_without_the_parser_is_the_parsers(tag: str | None) -> None:
    from ledger.leaves.envelope import canonical_envelope, envelope_bytes, parse_envelope

    body = b'{"x":1}'
    for kind in ("audit-record/v2", "environment/v1"):
        envelope = envelope_bytes(kind, "2026-12-02T01:02:03.456Z", tag, body)
        assert canonical_envelope(envelope) == parse_envelope(envelope)
    written = envelope_bytes("audit-record/v2", "2026-12-02T01:02:03.456Z", tag, body)
    for other in (written.replace(b'","kind"', b'", "kind"'),  # not canonical: the parser
                  written + b" ", written.replace(b"audit-record/v2", b"Audit-record/v2"),
                  written.replace(b'"schema":"audit-leaf/v2"', b'"schema":"audit-leaf/v3"')):
        assert canonical_envelope(other) is None


def _facts(row: int, **change: Any) -> Any:
    from ledger.leaves.record_v2 import RowFacts

    salt = bytes([row]) * 32
    facts = {"tenant": f"tenant-{row % 3}", "commitments": commitments.row_commitments(
        input_salt=salt, output_salt=salt, prompt=f"p{row}", input_ids=[row] * (row + 1),
        output="o", output_ids=[1], stop=("x",) if row % 2 else (),
        user="u" if row % 3 == 0 else None, user_salt=salt),
        "input_token_count": row + 1, "output_token_count": 1, "truncated": row == 4,
        "finish_reason": "stop" if row % 2 else "length", "padding_count": 8 - row - 1,
        "parse_ms": 0.1 * row, "stream_start_record_id": "s" if row == 5 else None}
    return RowFacts(**{**facts, **change})


def test_a_batch_is_the_same_bytes_as_its_records_built_one_by_one() -> None:
    from ledger.leaves.record_v2 import build_records_v2

    shared = {"origin": ORIGIN, "engine": "engine-0",
              "environment": EnvironmentRef(0, bytes(32)), "created_at":
              "2026-12-02T01:02:03.456Z"}
    rows = [_facts(row) for row in range(7)]
    leaves = build_records_v2(**shared, batch_id="d" * 32, padded_length=8,
                              padding_side="left", generation={"temperature": 0.0},
                              timings_ms={"forward": 2.5}, rows=rows)
    for row, (facts, leaf) in enumerate(zip(rows, leaves, strict=True)):
        alone = build_record_v2(
            **shared, tenant=facts.tenant, commitments=facts.commitments,
            data=row_data(input_token_count=facts.input_token_count,
                          output_token_count=1, truncated=facts.truncated,
                          finish_reason=facts.finish_reason, rows=7, padded_length=8,
                          padding_side="left", padding_count=facts.padding_count,
                          generation={"temperature": 0.0}),
            batch={"id": "d" * 32, "size": 7, "row": row},
            timings_ms={"forward": 2.5, "parse": facts.parse_ms},
            stream_start_record_id=facts.stream_start_record_id, record_id=leaf.record_id)
        assert (leaf.envelope, leaf.body) == (alone.envelope, alone.body)
        assert open_leaf(leaf.envelope, leaf.body, ORIGIN, strict=True).content == leaf.content
    # A bad row later in the batch is refused by name, like a first one.
    for change, field in (({"finish_reason": "eos"}, "record.data.finish_reason"),
                          ({"tenant": ""}, "record.tenant"),
                          ({"padding_count": 0}, "record.data.padding.count")):
        bad = [*rows[:3], _facts(3, **change)]
        with pytest.raises(CanonicalFormError) as caught:
            build_records_v2(**shared, batch_id="d" * 32, padded_length=8,
                             padding_side="left", generation={}, timings_ms={}, rows=bad)
        assert caught.value.field == field
