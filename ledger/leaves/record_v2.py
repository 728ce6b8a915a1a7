"""The ``audit-record/v2`` body: what one generate call leaves, nothing guessable.

Content appears only as labelled HMAC commitments (``commitments``); every other member
is a disclosed fact about the call (counts, shape, padding, parameters, timings, the
batch it ran in), checked here to be numbers, booleans or fixed words, so that no free
text, and so no digest of content, can slip into a body. The engine's hardware and
software are not repeated: ``environment`` names the ``environment/v1`` leaf (index and
leaf hash) the call ran under. Decision record 0026 gives the field table.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ledger.canonical import Layout, LayoutError, canonical_bytes, encode_leaf, json_number
from ledger.errors import CanonicalFormError
from ledger.leaf_base import new_record_id, new_record_ids, utc_timestamp, validate_common
from ledger.leaves.commitments import validate_commitments
from ledger.leaves.envelope import BatchSealer, Leaf, is_timestamp, seal, tenant_tag

RECORD_KIND = "audit-record/v2"
RECORD_KEYS = frozenset(("schema", "record_id", "created_at", "tenant", "engine",
                         "environment", "commitments", "data", "batch", "timings_ms",
                         "gpu_sample"))
OPTIONAL_KEYS = frozenset(("stream",))
DATA_KEYS = frozenset(("input_token_count", "output_token_count", "truncated",
                       "finish_reason", "shape", "padding", "generation"))
FINISH_REASONS = frozenset(("stop", "length"))
PADDING_SIDES = frozenset(("left", "right"))
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")
_HEX32 = re.compile(r"[0-9a-f]{32}\Z")
_ENGINE = re.compile(r"[A-Za-z0-9._-]{1,64}\Z")


@dataclass(frozen=True)
class EnvironmentRef:
    """The environment leaf a record ran under: its index and leaf hash."""

    leaf_index: int
    leaf_hash: bytes

    def to_json(self) -> dict[str, Any]:
        return {"leaf_index": self.leaf_index, "leaf_hash": self.leaf_hash.hex()}


def row_data(*, input_token_count: int, output_token_count: int, truncated: bool,
             finish_reason: str, rows: int, padded_length: int, padding_side: str,
             padding_count: int, generation: Mapping[str, Any]) -> dict[str, Any]:
    """The disclosed facts of one row (``data``)."""
    return {
        "input_token_count": input_token_count,
        "output_token_count": output_token_count,
        "truncated": truncated,
        "finish_reason": finish_reason,
        "shape": [rows, padded_length],
        "padding": {"side": padding_side, "count": padding_count},
        "generation": {k: json_number(v) if isinstance(v, float) else v
                       for k, v in generation.items()},
    }


def build_record_v2(
    *,
    origin: str,
    tenant: str,
    engine: str,
    environment: EnvironmentRef,
    commitments: Mapping[str, str],
    data: Mapping[str, Any],
    batch: Mapping[str, Any],
    timings_ms: Mapping[str, int | float],
    gpu_sample: Mapping[str, Any] | None = None,
    stream_start_record_id: str | None = None,
    record_id: str | None = None,
    created_at: str | None = None,
) -> Leaf:
    """One call's leaf: body validated and canonicalized, envelope tagged for ``tenant``
    in the log ``origin``."""
    content: dict[str, Any] = {
        "schema": RECORD_KIND,
        "record_id": record_id or new_record_id(),
        "created_at": created_at or utc_timestamp(),
        "tenant": tenant,
        "engine": engine,
        "environment": environment.to_json(),
        "commitments": dict(commitments),
        "data": dict(data),
        "batch": dict(batch),
        "timings_ms": {k: json_number(round(float(v), 3)) for k, v in timings_ms.items()},
        "gpu_sample": None if gpu_sample is None else dict(gpu_sample),
    }
    if stream_start_record_id is not None:
        content["stream"] = {"start_record_id": stream_start_record_id}
    validate_record_v2(content)
    return seal(RECORD_KIND, content, canonical_bytes(content), tenant_tag(origin, tenant))


@dataclass(frozen=True)
class RowFacts:
    """What differs from row to row of one batch (``build_records_v2``)."""

    tenant: str
    commitments: Mapping[str, str]
    input_token_count: int
    output_token_count: int
    truncated: bool
    finish_reason: str
    padding_count: int
    parse_ms: float
    stream_start_record_id: str | None = None
    row: int | None = None  # its row in the batch; None: its place in ``rows``


# The leaves of a v2 body that change from row to row of a batch (optional ones, when
# present, too); every other leaf is the batch's.
ROW_LEAVES = ("record_id", "tenant", "commitments.input", "commitments.input_ids",
              "commitments.output", "commitments.output_ids", "data.input_token_count",
              "data.output_token_count", "data.truncated", "data.finish_reason",
              "data.padding.count", "batch.row", "timings_ms.parse")
OPTIONAL_LEAVES = ("commitments.stop", "commitments.user", "stream.start_record_id")


# Every leaf of a v2 body that its schema does not fix, in the order the bytes hold them
# (RFC 8785 sorts member names), then the optional ones: with all of them as slots, one
# ``Layout`` per kind (the optional members a body has) serves every batch, and a batch
# encodes its shared leaves once and each row its own (decision 0054).
BODY_SLOTS = ("batch.id", "batch.row", "batch.size", "commitments.input",
              "commitments.input_ids", "commitments.output", "commitments.output_ids",
              "created_at", "data.finish_reason", "data.generation",
              "data.input_token_count", "data.output_token_count", "data.padding.count",
              "data.padding.side", "data.shape", "data.truncated", "engine", "environment",
              "gpu_sample", "record_id", "tenant", "timings_ms")
_BODY_LAYOUTS: dict[tuple[str, ...], Layout] = {}  # by kind; compiled once per process
_BOOLEAN = {True: b"true", False: b"false"}


def build_records_v2(
    *,
    origin: str,
    engine: str,
    environment: EnvironmentRef,
    batch_id: str,
    padded_length: int,
    padding_side: str,
    generation: Mapping[str, Any],
    timings_ms: Mapping[str, float],
    rows: Sequence[RowFacts],
    gpu_sample: Mapping[str, Any] | None = None,
    created_at: str | None = None,
    batch_size: int | None = None,
    record_ids: Sequence[str] | None = None,
) -> list[Leaf]:
    """The leaves of one batch: the same bodies ``build_record_v2`` makes, row by row,
    each validated.

    The first body of each kind (the optional members it has) passes every rule and is
    encoded in full; the others pass the row rules (``validate_row_leaves``) and are
    their kind's layout (``BODY_SLOTS``, compiled once per process) joined with their
    own leaves and the batch's, which are encoded once. The layout must give the first
    body's bytes (else ``LayoutError``), and the last body of each kind is encoded in
    full again: a batch costs two full encodings per kind, not one per row.

    ``batch_size`` (default ``len(rows)``) and each row's ``row`` are the batch the
    engine ran, stated rather than counted: a caller can build some of a batch's rows
    (or one alone) and their records are the same as in the whole batch's.
    ``record_ids``: the rows' ids (fresh UUIDv7s by default)."""
    size = len(rows) if batch_size is None else batch_size
    created_at = created_at or utc_timestamp()
    ids = new_record_ids(len(rows)) if record_ids is None else list(record_ids)
    if len(ids) != len(rows):
        raise ValueError(f"{len(rows)} rows, {len(ids)} record ids")
    shared_timings = {k: json_number(round(float(v), 3)) for k, v in timings_ms.items()}
    shared_generation = {k: json_number(v) if isinstance(v, float) else v
                         for k, v in generation.items()}
    environment_json = environment.to_json()
    sample = None if gpu_sample is None else dict(gpu_sample)
    sealer = BatchSealer(RECORD_KIND, created_at)
    shared: _SharedLeaves | None = None  # at the second body of the batch
    firsts: dict[tuple[str, ...], tuple[dict[str, Any], bytes]] = {}
    checked: set[tuple[str, ...]] = set()
    lasts: dict[tuple[str, ...], tuple[dict[str, Any], bytes]] = {}
    leaves = []
    for place, (facts, record_id) in enumerate(zip(rows, ids, strict=True)):
        row = place if facts.row is None else facts.row
        commitments = dict(facts.commitments)
        content: dict[str, Any] = {
            "schema": RECORD_KIND, "record_id": record_id, "created_at": created_at,
            "tenant": facts.tenant, "engine": engine, "environment": environment_json,
            "commitments": commitments,
            "data": {"input_token_count": facts.input_token_count,
                     "output_token_count": facts.output_token_count,
                     "truncated": facts.truncated, "finish_reason": facts.finish_reason,
                     "shape": [size, padded_length],
                     "padding": {"side": padding_side, "count": facts.padding_count},
                     "generation": shared_generation},
            "batch": {"id": batch_id, "size": size, "row": row},
            "timings_ms": {**shared_timings, "parse": json_number(round(facts.parse_ms, 3))},
            "gpu_sample": sample,
        }
        optional = tuple(path for path, label in _OPTIONAL_COMMITMENTS if label in commitments)
        if facts.stream_start_record_id is not None:
            content["stream"] = {"start_record_id": facts.stream_start_record_id}
            optional += ("stream.start_record_id",)
        first = firsts.get(optional)
        if first is None:  # the first of its kind: every rule, encoded in full
            validate_record_v2(content)
            body = canonical_bytes(content)
            firsts[optional] = (content, body)
        else:  # the rest share all but the row's own leaves
            validate_row_leaves(content)
            if shared is None:
                shared = _SharedLeaves(first[0])
            layout = _body_layout(optional, first[0])
            if optional not in checked:  # the layout must give the first body's bytes
                if shared.body(layout, optional, first[0]) != first[1]:
                    raise LayoutError("a v2 record layout disagrees with the full encoding")
                checked.add(optional)
            body = shared.body(layout, optional, content)
            lasts[optional] = (content, body)
        leaves.append(sealer.seal(content, body, tenant_tag(origin, facts.tenant)))
    for content, body in lasts.values():  # a leaf the layout misses fails here
        if canonical_bytes(content) != body:
            raise LayoutError("a v2 record's bytes disagree with its body: a leaf that "
                              "varies from row to row is missing from the layout")
    return leaves


def _body_layout(optional: tuple[str, ...], content: dict[str, Any]) -> Layout:
    """The layout of a kind of body (``content``: one of that kind), compiled once."""
    layout = _BODY_LAYOUTS.get(optional)
    if layout is None:
        layout = _BODY_LAYOUTS[optional] = Layout(content, [*BODY_SLOTS, *optional])
    return layout


class _SharedLeaves:
    """The leaves every body of one batch shares, encoded once (from a body that passed
    every rule), and its ``timings_ms`` as a layout of which ``parse`` varies."""

    def __init__(self, content: Mapping[str, Any]) -> None:
        data = content["data"]
        self.batch_id = encode_leaf(content["batch"]["id"])
        self.size = encode_leaf(content["batch"]["size"])
        self.created_at = encode_leaf(content["created_at"])
        self.generation = canonical_bytes(data["generation"])
        self.side = encode_leaf(data["padding"]["side"])
        self.shape = canonical_bytes(data["shape"])
        self.engine = encode_leaf(content["engine"])
        self.environment = canonical_bytes(content["environment"])
        self.gpu_sample = canonical_bytes(content["gpu_sample"])
        self.timings = Layout(dict(content["timings_ms"]), ["parse"])

    def body(self, layout: Layout, optional: tuple[str, ...], content: Mapping[str, Any]
             ) -> bytes:
        """The bytes of a body of this batch that passed the row rules (so each
        commitment is ``hmac-sha256:`` and hex digits, needing no escape)."""
        commitments, data = content["commitments"], content["data"]
        return layout.join([  # BODY_SLOTS, then the optional leaves
            self.batch_id, encode_leaf(content["batch"]["row"]), self.size,
            _quoted(commitments["input"]), _quoted(commitments["input_ids"]),
            _quoted(commitments["output"]), _quoted(commitments["output_ids"]),
            self.created_at, encode_leaf(data["finish_reason"]), self.generation,
            encode_leaf(data["input_token_count"]), encode_leaf(data["output_token_count"]),
            encode_leaf(data["padding"]["count"]), self.side, self.shape,
            _BOOLEAN[data["truncated"]], self.engine, self.environment, self.gpu_sample,
            encode_leaf(content["record_id"]), encode_leaf(content["tenant"]),
            self.timings.join([encode_leaf(content["timings_ms"]["parse"])]),
            *(_optional_leaf(content, path) for path in optional)])


_OPTIONAL_COMMITMENTS = (("commitments.stop", "stop"), ("commitments.user", "user"))


def _quoted(commitment: str) -> bytes:
    """A commitment's JSON text: validated as ``hmac-sha256:`` and hex digits, so it
    needs no escape (``validate_commitments``)."""
    return b'"' + commitment.encode("ascii") + b'"'


def _optional_leaf(content: Mapping[str, Any], path: str) -> bytes:
    holder, name = path.split(".")
    value = content[holder][name]
    return _quoted(value) if holder == "commitments" else encode_leaf(value)


def validate_row_leaves(body: Mapping[str, Any]) -> None:
    """``validate_record_v2``'s rules for the leaves in ``ROW_LEAVES`` and the optional
    ones: a body whose other leaves are a validated body's passes exactly when the full
    rules would pass it."""
    if not isinstance(body["tenant"], str) or not body["tenant"]:
        raise _fail("tenant", "must be a non-empty string")
    if not isinstance(body["record_id"], str) or not body["record_id"]:
        raise _fail("record_id", "must be a non-empty string")
    validate_commitments(body["commitments"])
    data = body["data"]
    _count(data["input_token_count"], "data.input_token_count")
    _count(data["output_token_count"], "data.output_token_count")
    if type(data["truncated"]) is not bool:
        raise _fail("data.truncated", "must be a boolean")
    if data["finish_reason"] not in FINISH_REASONS:
        raise _fail("data.finish_reason", f"must be one of {sorted(FINISH_REASONS)}")
    _count(data["padding"]["count"], "data.padding.count")
    if data["input_token_count"] + data["padding"]["count"] != data["shape"][1]:
        raise _fail("data.padding.count", "input tokens and padding must fill the row")
    _count(body["batch"]["row"], "batch.row")
    if not body["batch"]["row"] < body["batch"]["size"]:
        raise _fail("batch.row", "must be less than batch.size")
    parse = body["timings_ms"]["parse"]
    if not _number(parse) or parse < 0:
        raise _fail("timings_ms", "must map phase names to non-negative numbers")
    stream = body.get("stream")
    if stream is not None and (not isinstance(stream["start_record_id"], str)
                               or not stream["start_record_id"]):
        raise _fail("stream", "must hold exactly a non-empty start_record_id")


def _fail(field: str, message: str) -> CanonicalFormError:
    return CanonicalFormError(message, field=f"record.{field}")


def _count(value: Any, field: str) -> None:
    if type(value) is not int or value < 0:
        raise _fail(field, "must be a non-negative integer")


def _number(value: Any) -> bool:
    return type(value) in (int, float)


def validate_record_v2(body: Mapping[str, Any]) -> None:
    """An ``audit-record/v2`` body's rules: exact members, each of its kind."""
    keys = set(body)
    if not RECORD_KEYS <= keys or not keys <= RECORD_KEYS | OPTIONAL_KEYS:
        wrong = sorted((RECORD_KEYS - keys) | (keys - RECORD_KEYS - OPTIONAL_KEYS))
        raise _fail("", f"an audit-record/v2 body has exactly {sorted(RECORD_KEYS)} "
                    f"(and optionally stream); wrong: {wrong}")
    if body["schema"] != RECORD_KIND:
        raise _fail("schema", f"must be {RECORD_KIND!r}")
    validate_common(body)
    if not is_timestamp(body["created_at"]):
        raise _fail("created_at", "must be RFC 3339 UTC with milliseconds")
    if not isinstance(body["engine"], str) or not _ENGINE.match(body["engine"]):
        raise _fail("engine", "must be 1-64 letters, digits, '.', '_' or '-'")
    validate_environment_ref(body["environment"])
    validate_commitments(body["commitments"])
    _validate_data(body["data"])
    batch = body["batch"]
    if not isinstance(batch, Mapping) or set(batch) != {"id", "size", "row"}:
        raise _fail("batch", "must hold exactly id, size, row")
    if not isinstance(batch["id"], str) or not _HEX32.match(batch["id"]):
        raise _fail("batch.id", "must be 32 hex digits")
    _count(batch["size"], "batch.size")
    _count(batch["row"], "batch.row")
    if not batch["row"] < batch["size"]:
        raise _fail("batch.row", "must be less than batch.size")
    timings = body["timings_ms"]
    if not isinstance(timings, Mapping) or not all(
            isinstance(k, str) and _number(v) and v >= 0 for k, v in timings.items()):
        raise _fail("timings_ms", "must map phase names to non-negative numbers")
    sample = body["gpu_sample"]
    if sample is not None and not (isinstance(sample, Mapping) and all(
            isinstance(k, str) and (v is None or _number(v)) for k, v in sample.items())):
        raise _fail("gpu_sample", "must be null or map names to numbers (or null)")
    if "stream" in body:
        stream = body["stream"]
        if (not isinstance(stream, Mapping) or set(stream) != {"start_record_id"}
                or not isinstance(stream["start_record_id"], str)
                or not stream["start_record_id"]):
            raise _fail("stream", "must hold exactly a non-empty start_record_id")


def validate_environment_ref(ref: Any) -> None:
    """A body's ``environment``: the leaf index and leaf hash of an environment leaf."""
    if not isinstance(ref, Mapping) or set(ref) != {"leaf_index", "leaf_hash"}:
        raise _fail("environment", "must hold exactly leaf_index and leaf_hash")
    _count(ref["leaf_index"], "environment.leaf_index")
    if not isinstance(ref["leaf_hash"], str) or not _HEX64.match(ref["leaf_hash"]):
        raise _fail("environment.leaf_hash", "must be 64 hex digits")


def _validate_data(data: Any) -> None:
    if not isinstance(data, Mapping) or set(data) != DATA_KEYS:
        raise _fail("data", f"must hold exactly {sorted(DATA_KEYS)}")
    _count(data["input_token_count"], "data.input_token_count")
    _count(data["output_token_count"], "data.output_token_count")
    if type(data["truncated"]) is not bool:
        raise _fail("data.truncated", "must be a boolean")
    if data["finish_reason"] not in FINISH_REASONS:
        raise _fail("data.finish_reason", f"must be one of {sorted(FINISH_REASONS)}")
    shape = data["shape"]
    if not isinstance(shape, Sequence) or len(shape) != 2:
        raise _fail("data.shape", "must be [rows, padded_length]")
    _count(shape[0], "data.shape[0]")
    _count(shape[1], "data.shape[1]")
    padding = data["padding"]
    if not isinstance(padding, Mapping) or set(padding) != {"side", "count"}:
        raise _fail("data.padding", "must hold exactly side and count")
    if padding["side"] not in PADDING_SIDES:
        raise _fail("data.padding.side", "must be 'left' or 'right'")
    _count(padding["count"], "data.padding.count")
    if data["input_token_count"] + padding["count"] != shape[1]:
        raise _fail("data.padding.count", "input tokens and padding must fill the row")
    generation = data["generation"]
    if not isinstance(generation, Mapping) or not all(
            isinstance(k, str) and (v is None or type(v) is bool or _number(v))
            for k, v in generation.items()):
        raise _fail("data.generation", "must map parameter names to numbers, booleans "
                    "or null")
