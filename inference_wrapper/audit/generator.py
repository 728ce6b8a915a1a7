"""The audited generator: admission checks, salts and record building around engines.

Work is split in two so a server can overlap them: an engine (``EngineClient``) does the
model work, ``seal`` turns its result into records (commitments, canonical bytes) with the
environment the engine captured. The model itself is never touched here.
"""

from __future__ import annotations

import functools
import itertools
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from inference_wrapper.audit.data_fingerprint import DataFingerprint, MaskPattern, token_ids_digest
from inference_wrapper.engine.contract import TokenizationContract
from inference_wrapper.engine.fingerprint.hardware import GpuProbe
from inference_wrapper.engine.inprocess import InProcessEngine
from inference_wrapper.engine.model import LoadedModel, ServedModel
from inference_wrapper.engine.params import GenerationParams, Limits, validate_prompt
from inference_wrapper.engine.protocol import EngineBatch, EngineClient, EngineResult
from ledger.canonical import Canonical, json_number
from ledger.digest import commit_text, new_salt
from ledger.errors import InvalidInputError
from ledger.leaves.commitments import INPUT, STOP, USER, commit, row_commitments, stop_bytes
from ledger.leaves.envelope import Leaf
from ledger.leaves.environment import build_environment, environment_sections
from ledger.leaves.record_v2 import EnvironmentRef, RowFacts, build_records_v2
from ledger.leaves.stream_start import build_stream_start_v2
from ledger.record import (
    AuditRecord,
    RecordFamily,
    build_stream_start,
    record_members,
    timings_json,
    utc_timestamp,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PreparedRequest:
    """A validated request, ready to join a batch."""

    prompt: str
    params: GenerationParams
    tenant: str
    parse_ms: float
    parse_span_ns: tuple[int, int] = (0, 0)  # wall clock, for tracing
    input_salt: bytes = field(default_factory=new_salt, repr=False)
    output_salt: bytes = field(default_factory=new_salt, repr=False)
    subject: str | None = field(default=None, repr=False)  # data-subject id, vault only
    stop: tuple[str, ...] = ()  # the output ends before the first of these (recorded)
    user: str | None = field(default=None, repr=False)  # recorded only as a commitment
    user_salt: bytes = field(default_factory=new_salt, repr=False)
    stream_start_id: str | None = None  # a streamed request's start record
    truncate: bool = False  # the caller allowed the contract to cut an over-long prompt


@dataclass(frozen=True)
class AuditedOutput:
    text: str
    record: AuditRecord | Leaf  # an audit-record/v2 leaf when sealed for a log
    input_salt: bytes
    output_salt: bytes
    output_token_ids: list[int]
    user_salt: bytes | None = None  # opens the record's user_commitment, when there is one

    @property
    def record_content(self) -> Mapping[str, Any]:
        """The record's members (a v2 leaf's body, a v1 record itself); both have
        ``data`` with the token counts, finish reason and generation parameters."""
        return self.record.content if isinstance(self.record, Leaf) else self.record.body


class RecordNotBuiltError(InvalidInputError):
    """This request's record could not be built (a value in it the record encoding
    cannot hold, which validation should have refused): it alone is answered with this,
    nothing is recorded for it, and its output is withheld. The text is fixed: the
    builder's own error may quote the value."""

    def __init__(self) -> None:
        super().__init__("body", "holds a value its audit record cannot encode: nothing "
                         "was recorded for this request and no output is returned")


@dataclass(frozen=True)
class RowNotRecorded:
    """A row of a sealed batch whose record could not be built; its batch mates'
    records are exactly what they would be without it."""

    row: int
    error: RecordNotBuiltError


Sealed = AuditedOutput | RowNotRecorded


def recorded(sealed: Sequence[Sealed]) -> list[AuditedOutput]:
    """Every row's output, or the first row's error that has none."""
    for item in sealed:
        if isinstance(item, RowNotRecorded):
            raise item.error
    return [item for item in sealed if isinstance(item, AuditedOutput)]


def _not_recorded(row: int, error: Exception) -> RowNotRecorded:
    # The builder's message may quote the row's content: only its class is logged.
    log.error("the record of row %d of a batch could not be built (%s); that row alone "
              "is refused", row, type(error).__name__)
    failed = RecordNotBuiltError()
    failed.__cause__ = error
    return RowNotRecorded(row, failed)


class EnvironmentNotLoggedError(LookupError):
    """A batch ran on an engine environment the log holds no leaf for yet: its
    ``environment/v1`` leaf must be appended first (``LogBinding.bind``)."""


@dataclass
class LogBinding:
    """The log records go to (decision 0026): its origin (tenant tags) and, per engine,
    the environment leaf it holds for that engine's current environment."""

    origin: str
    _environments: dict[str, tuple[dict[str, Any], EnvironmentRef]] = field(
        default_factory=dict)

    def ref_for(self, environment: Mapping[str, Any]) -> EnvironmentRef | None:
        """The leaf of this exact environment, or None (never logged, or changed since)."""
        known = self._environments.get(str(environment["engine"]))
        if known is None or known[0] != _environment_key(environment):
            return None
        return known[1]

    def bind(self, environment: Mapping[str, Any], ref: EnvironmentRef) -> None:
        self._environments[str(environment["engine"])] = (_environment_key(environment), ref)


def _environment_key(environment: Mapping[str, Any]) -> dict[str, Any]:
    return environment_sections(
        model=environment["model"], hardware=environment["hardware"],
        software=environment["software"],
        tokenization_contract=environment["tokenization_contract"],
        generation_config_digest=environment["generation_config_digest"])


def environment_leaf(environment: Mapping[str, Any]) -> Leaf:
    """An engine's ``environment/v1`` leaf, from what the engine captured."""
    return build_environment(
        engine=str(environment["engine"]), model=environment["model"],
        hardware=environment["hardware"], software=environment["software"],
        tokenization_contract=environment["tokenization_contract"],
        generation_config_digest=str(environment["generation_config_digest"]))


def start_commitments(request: PreparedRequest) -> dict[str, str]:
    """A stream start's commitments: the prompt and, when given, the stop strings and
    the user, under the request's own salts and labels (the completed record's values)."""
    result = {INPUT: commit(request.input_salt, INPUT, request.prompt.encode("utf-8"))}
    if request.stop:
        result[STOP] = commit(request.input_salt, STOP, stop_bytes(request.stop))
    if request.user is not None:
        result[USER] = commit(request.user_salt, USER, request.user.encode("utf-8"))
    return result


@dataclass
class BatchResult:
    """What an engine produced for a batch of prepared requests, before any audit work,
    with the environment of the engine that ran it."""

    requests: Sequence[PreparedRequest]
    result: EngineResult
    environment: Mapping[str, Any]

    @property
    def spans_ns(self) -> dict[str, tuple[int, int]]:
        return self.result.spans_ns

    @property
    def timings_ms(self) -> dict[str, float]:
        return self.result.timings_ms


def engine_batch(requests: Sequence[PreparedRequest], min_length: int = 0) -> EngineBatch:
    """What the engine sees of prepared requests: no tenant, salt, user or subject."""
    if not requests:
        raise ValueError("a batch needs at least one request")
    params = requests[0].params
    if any(r.params != params for r in requests):
        raise ValueError("all requests in a batch must share generation parameters")
    return EngineBatch(tuple(r.prompt for r in requests), params,
                       tuple(r.stop for r in requests), tuple(r.truncate for r in requests),
                       min_length)


def record_sections(environment: Mapping[str, Any]) -> dict[str, Canonical]:
    """An engine's environment as the record sections ``model``, ``hardware`` and
    ``software`` (which names the tokenization contract), canonicalized once."""
    return {
        "model": Canonical.of(dict(environment["model"])),
        "hardware": Canonical.of(dict(environment["hardware"])),
        "software": Canonical.of(dict(environment["software"]) | {
            "tokenization_contract": dict(environment["tokenization_contract"])}),
    }


def _now_ms() -> float:
    return time.perf_counter() * 1000.0


# The leaves of a record that change from row to row of one batch (optional members,
# when present, too); every other leaf is the same for the whole batch.
ROW_LEAVES = (
    "record_id", "tenant", "timings_ms.parse",
    "data.input_commitment", "data.input_bytes", "data.input_ids_digest",
    "data.input_token_count", "data.truncated", "data.attention_mask.real_tokens",
    "data.attention_mask.padding", "data.attention_mask.digest", "data.output_ids_digest",
    "data.output_token_count", "data.output_commitment", "data.finish_reason",
    "data.batch.row", "data.batch.padding_applied",
)


class AuditedGenerator:
    """Prepares requests, runs them on an engine and returns each output with its record.

    ``loaded`` is what the API side knows of the model (its tokenizer for admission,
    chat templates and streaming). Without ``engines`` the model runs in this process
    (``InProcessEngine``, which needs a ``LoadedModel``).
    """

    def __init__(
        self,
        loaded: LoadedModel | ServedModel,
        contract: TokenizationContract | None = None,
        limits: Limits | None = None,
        probe: GpuProbe | None = None,
        *,
        engines: Sequence[EngineClient] | None = None,
    ) -> None:
        self.loaded = loaded
        self.contract = contract or TokenizationContract(tokenizer_digest=loaded.tokenizer_digest)
        if self.contract.tokenizer_digest != loaded.tokenizer_digest:
            raise ValueError(
                f"tokenization contract pins tokenizer {self.contract.tokenizer_digest}, "
                f"the model directory has {loaded.tokenizer_digest}"
            )
        self.contract.apply(loaded.tokenizer)
        if engines is None:
            if not isinstance(loaded, LoadedModel):
                raise ValueError("an in-process engine needs the loaded model")
            engines = [InProcessEngine(loaded, self.contract, probe=probe)]
        self.engines: list[EngineClient] = list(engines)
        for engine in self.engines:
            if engine.alive():  # a process engine is checked when it starts (and restarts)
                self.check_environment(engine.environment())
        self.limits = limits or Limits()
        # Canonicalized once per engine environment; every record splices these bytes.
        self._sections: dict[str, tuple[Mapping[str, Any], dict[str, Canonical]]] = {}

    def check_environment(self, environment: Mapping[str, Any]) -> None:
        """Refuse an engine that runs another model or another tokenization contract than
        the one requests are admitted under here."""
        if environment["model"]["digest"] != self.loaded.digest:
            raise ValueError(f"engine {environment['engine']} runs model "
                             f"{environment['model']['digest']}, not {self.loaded.digest}")
        if dict(environment["tokenization_contract"]) != self.contract.to_dict():
            raise ValueError(f"engine {environment['engine']} runs another tokenization "
                             "contract")

    def sections(self, environment: Mapping[str, Any]) -> dict[str, Canonical]:
        cached = self._sections.get(environment["engine"])
        if cached is None or cached[0] is not environment:
            cached = (environment, record_sections(environment))
            self._sections[environment["engine"]] = cached
        return cached[1]

    def environment(self) -> Mapping[str, Any]:
        """The first engine's environment (the only one for an in-process generator)."""
        return self.engines[0].environment()

    @property
    def hardware(self) -> dict[str, Any]:
        return dict(self.environment()["hardware"])

    @property
    def software(self) -> dict[str, Any]:
        return dict(self.environment()["software"])

    # --- the steps ------------------------------------------------------------------

    def prepare(
        self, prompt: Any, params: GenerationParams | None = None, tenant: str = "local",
        started: float | None = None, *, truncate: bool = False, stop: tuple[str, ...] = (),
        user: str | None = None, subject: str | None = None,
    ) -> PreparedRequest:
        """Validate everything before any model work; raises ``InvalidInputError``
        (``ContextLengthError`` for a prompt over the contract's length, unless
        ``truncate``).

        ``started`` (``time.perf_counter()`` in ms) lets a server count its own body
        parsing into the parse phase.
        """
        start = _now_ms() if started is None else started
        text = validate_prompt(prompt, self.limits)
        checked = (params or GenerationParams()).validate(self.limits)
        self.contract.check_length(self.loaded.tokenizer, text, truncate=truncate)
        parse_ms = _now_ms() - start
        end_ns = time.time_ns()
        return PreparedRequest(text, checked, tenant, parse_ms=parse_ms,
                               parse_span_ns=(end_ns - int(parse_ms * 1e6), end_ns),
                               stop=tuple(stop), user=user,
                               subject=subject, truncate=truncate)

    def run_batch(
        self, requests: Sequence[PreparedRequest], min_length: int = 0,
        on_step: Callable[[list[int | None]], None] | None = None,
    ) -> BatchResult:
        """The batch on the in-process engine, on the calling thread."""
        engine = self.engines[0]
        if not isinstance(engine, InProcessEngine):
            raise TypeError("run_batch needs an in-process engine; use an EngineClient")
        result = engine.run(engine_batch(requests, min_length), on_step)
        return BatchResult(requests, result, engine.environment())

    def environment_leaf(self) -> Leaf:
        """The first engine's ``environment/v1`` leaf, to append before its first record."""
        return environment_leaf(self.environment())

    def seal(self, batch: BatchResult, log: LogBinding | None = None) -> list[Sealed]:
        """Turn a batch's results into one record per request: ``audit-record/v2`` leaves
        for the log ``log`` names (decision 0026), v1 records without one.

        A row whose record cannot be built is ``RowNotRecorded`` in its place; it never
        fails or changes another row's record (``recorded`` raises it instead)."""
        if log is None:
            return self._seal_v1(batch)
        environment = log.ref_for(batch.environment)
        if environment is None:
            raise EnvironmentNotLoggedError(
                f"engine {batch.environment['engine']}: its environment has no leaf in the "
                "log yet")
        return self._seal_v2(batch, log.origin, environment)

    def _seal_v2(self, batch: BatchResult, origin: str,
                 environment: EnvironmentRef) -> list[Sealed]:
        result = batch.result
        padded_length = len(result.input_ids[0])
        size = len(batch.requests)
        facts: dict[int, RowFacts] = {}
        sealed: dict[int, Sealed] = {}
        for row, request in enumerate(batch.requests):
            try:
                facts[row] = self._row_facts(result, row, request, padded_length)
            except Exception as exc:  # a value the commitments cannot encode
                sealed[row] = _not_recorded(row, exc)
        build = functools.partial(
            build_records_v2, origin=origin, engine=str(batch.environment["engine"]),
            environment=environment,
            batch_id=uuid.uuid4().hex,  # lets an auditor regroup the records of one generate
            padded_length=padded_length, padding_side=self.contract.padding_side,
            generation=result.params.to_dict(), timings_ms=result.timings_ms,
            gpu_sample=result.gpu_sample, created_at=utc_timestamp(), batch_size=size)
        try:
            leaves = dict(zip(facts, build(rows=list(facts.values())), strict=True))
        except Exception:
            # Some row's record cannot be built: each row alone, so that row alone fails;
            # the others' records are the same bodies (stated batch size and row numbers).
            leaves = {}
            for row, row_facts in facts.items():
                try:
                    (leaves[row],) = build(rows=[row_facts])
                except Exception as exc:
                    sealed[row] = _not_recorded(row, exc)
        for row, leaf in leaves.items():
            request = batch.requests[row]
            sealed[row] = AuditedOutput(
                result.texts[row], leaf, request.input_salt, request.output_salt,
                result.output_ids[row],
                request.user_salt if request.user is not None else None)
        return [sealed[row] for row in range(size)]

    @staticmethod
    def _row_facts(result: EngineResult, row: int, request: PreparedRequest,
                   padded_length: int) -> RowFacts:
        mask, ids = result.attention_mask[row], result.input_ids[row]
        if len(mask) != len(ids):
            raise ValueError(f"row {row}: {len(ids)} input ids, a mask of {len(mask)}")
        real = list(itertools.compress(ids, mask))
        return RowFacts(
            tenant=request.tenant,
            commitments=row_commitments(
                input_salt=request.input_salt, output_salt=request.output_salt,
                prompt=request.prompt, input_ids=real, output=result.texts[row],
                output_ids=result.output_ids[row], stop=request.stop, user=request.user,
                user_salt=request.user_salt),
            input_token_count=len(real), output_token_count=len(result.output_ids[row]),
            truncated=result.truncated[row], finish_reason=result.finish_reasons[row],
            padding_count=padded_length - len(real), parse_ms=request.parse_ms,
            stream_start_record_id=request.stream_start_id, row=row)

    def _seal_v1(self, batch: BatchResult) -> list[Sealed]:
        """``audit-record/v1`` records (a generator not sealing for a log).

        The rows' records share every leaf but those in ``ROW_LEAVES`` (and the optional
        ones), so they are canonicalized through one layout (``RecordFamily``) instead
        of one full encoding each.
        """
        rows = len(batch.requests)
        sections = self.sections(batch.environment)
        request_list, result = batch.requests, batch.result
        padded_length = len(result.input_ids[0])
        batch_id = uuid.uuid4().hex  # lets an auditor regroup the records of one generate
        created_at = utc_timestamp()  # the records of one batch are sealed together
        generation = {k: json_number(v) if isinstance(v, float) else v
                      for k, v in result.params.to_dict().items()}  # same bytes, fast path
        timings = timings_json(result.timings_ms)
        family = RecordFamily(sections, ROW_LEAVES)
        model, hardware, software = (sections["model"].value, sections["hardware"].value,
                                     sections["software"].value)
        results: list[Sealed] = []
        for row, request in enumerate(request_list):
            try:
                results.append(self._v1_row(
                    family, request, result, row, rows, padded_length, batch_id, created_at,
                    generation, timings, (model, hardware, software)))
            except Exception as exc:  # this row alone: the family keeps no state of it
                results.append(_not_recorded(row, exc))
        family.check_last()  # a per-row leaf missing from ROW_LEAVES fails loudly here
        return results

    def _v1_row(self, family: RecordFamily, request: PreparedRequest, result: EngineResult,
                row: int, rows: int, padded_length: int, batch_id: str, created_at: str,
                generation: dict[str, Any], timings: dict[str, Any],
                environment: tuple[Any, Any, Any]) -> AuditedOutput:
        """One row's v1 record, through the batch's ``family``."""
        model, hardware, software = environment
        padding_side, multiple = self.contract.padding_side, self.contract.pad_to_multiple_of
        mask = result.attention_mask[row]
        real = sum(mask)
        padding = padded_length - real
        text = result.texts[row]
        output_ids = result.output_ids[row]
        data = DataFingerprint(
            input_commitment=commit_text(request.input_salt, request.prompt),
            input_bytes=len(request.prompt.encode("utf-8")),
            input_shape=[rows, padded_length],
            input_ids_digest=token_ids_digest(result.input_ids[row]),
            input_token_count=real,
            truncated=result.truncated[row],
            attention_mask=MaskPattern(
                length=padded_length,
                real_tokens=real,
                padding=padding,
                padding_side=padding_side,
                digest=token_ids_digest(mask),
            ),
            output_ids_digest=token_ids_digest(output_ids),
            output_token_count=len(output_ids),
            output_commitment=commit_text(request.output_salt, text),
            finish_reason=result.finish_reasons[row],
            generation=generation,
            batch={
                "id": batch_id,
                "size": rows,
                "row": row,
                "padded_length": padded_length,
                "pad_to_multiple_of": multiple,
                "padding_applied": padding,
                "engine": result.engine_id,
            },
        )
        data_members = data.to_dict()
        # Present only when asked for, so records without them keep their old shape.
        optional: tuple[str, ...] = ()
        if request.stop:
            data_members["stop"] = list(request.stop)
            optional += ("data.stop",)
        if request.user is not None:
            data_members["user_commitment"] = commit_text(request.user_salt, request.user)
            optional += ("data.user_commitment",)
        if result.gpu_sample is not None:  # a GPU engine: the batch's NVML sample
            data_members["gpu_sample"] = result.gpu_sample
            optional += ("data.gpu_sample",)
        if request.stream_start_id is not None:
            data_members["stream_start_record_id"] = request.stream_start_id
            optional += ("data.stream_start_record_id",)
        body = record_members(
            tenant=request.tenant, model=model, hardware=hardware, software=software,
            data=data_members, created_at=created_at,
            timings_ms={**timings, **timings_json({"parse": request.parse_ms})})
        return AuditedOutput(text, family.record(body, optional), request.input_salt,
                             request.output_salt, output_ids,
                             request.user_salt if request.user is not None else None)

    def stream_start(self, request: PreparedRequest, route: str,
                     log: LogBinding | None = None) -> AuditRecord | Leaf:
        """The start leaf of a streamed request, committed before any of its tokens
        leaves the server: an ``audit-stream-start/v2`` naming the first engine's
        environment leaf in the log ``log`` names (raises ``EnvironmentNotLoggedError``
        while it has none), commitments under the request's salts and the parameters.
        Without a log, the ``audit-stream-start/v1`` record of before (tests, vectors)."""
        if log is not None:
            environment = self.environment()
            ref = log.ref_for(environment)
            if ref is None:
                raise EnvironmentNotLoggedError(
                    f"engine {environment['engine']}: its environment has no leaf in the "
                    "log yet")
            return build_stream_start_v2(
                origin=log.origin, tenant=request.tenant, engine=str(environment["engine"]),
                environment=ref, commitments=start_commitments(request),
                generation=request.params.to_dict(), route=route)
        return build_stream_start(
            tenant=request.tenant, **self.sections(self.environment()),
            input_commitment=commit_text(request.input_salt, request.prompt),
            input_bytes=len(request.prompt.encode("utf-8")),
            generation=request.params.to_dict(), route=route)

    # --- conveniences ---------------------------------------------------------------

    def generate_batch(self, requests: Sequence[PreparedRequest]) -> list[AuditedOutput]:
        return recorded(self.seal(self.run_batch(requests)))

    def generate(
        self, prompt: Any, params: GenerationParams | None = None, tenant: str = "local"
    ) -> AuditedOutput:
        return self.generate_batch([self.prepare(prompt, params, tenant)])[0]
