"""The audited generator: tokenize under the contract, ``model.generate``, decode, record.

Work is split in two so a server can overlap them: ``run_batch`` does the model work,
``seal`` turns its result into records (fingerprints, commitments, canonical bytes).
"""

from __future__ import annotations

import secrets
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from inference_wrapper.contract import TokenizationContract
from inference_wrapper.fingerprint.data import DataFingerprint, MaskPattern, token_ids_digest
from inference_wrapper.fingerprint.hardware import GpuProbe, HardwareFingerprint, capture_hardware
from inference_wrapper.fingerprint.software import SoftwareFingerprint, capture_software
from inference_wrapper.model import LoadedModel
from inference_wrapper.params import MAX_SEED, GenerationParams, Limits, validate_prompt
from ledger.canonical import Canonical
from ledger.digest import commit_text, new_salt
from ledger.record import AuditRecord, build_record


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
    stream_start_id: str | None = None  # a streamed request's start record


@dataclass(frozen=True)
class AuditedOutput:
    text: str
    record: AuditRecord
    input_salt: bytes
    output_salt: bytes
    output_token_ids: list[int]


@dataclass
class BatchResult:
    """What the model produced for one batch, before any audit work."""

    requests: Sequence[PreparedRequest]
    params: GenerationParams  # with the seed actually used
    input_ids: list[list[int]]
    attention_mask: list[list[int]]
    output_ids: list[list[int]]
    finish_reasons: list[str]
    texts: list[str]
    truncated: list[bool]
    timings_ms: dict[str, float]
    spans_ns: dict[str, tuple[int, int]] = field(default_factory=dict)  # wall clock


def _now_ms() -> float:
    return time.perf_counter() * 1000.0


class AuditedGenerator:
    """Runs generate calls and returns each output with its audit record."""

    def __init__(
        self,
        loaded: LoadedModel,
        contract: TokenizationContract | None = None,
        limits: Limits | None = None,
        probe: GpuProbe | None = None,
    ) -> None:
        self.loaded = loaded
        self.contract = contract or TokenizationContract(tokenizer_digest=loaded.tokenizer_digest)
        if self.contract.tokenizer_digest != loaded.tokenizer_digest:
            raise ValueError(
                f"tokenization contract pins tokenizer {self.contract.tokenizer_digest}, "
                f"the model directory has {loaded.tokenizer_digest}"
            )
        self.contract.apply(loaded.tokenizer)
        self.limits = limits or Limits()
        # Hardware and software do not change while a model is loaded: capture once.
        self.hardware: HardwareFingerprint = capture_hardware(
            probe, device_index=loaded.device.index or 0
        )
        self.software: SoftwareFingerprint = capture_software(
            model_digest=loaded.digest,
            tokenizer_digest=loaded.tokenizer_digest,
            generation_config_digest=loaded.generation_config_digest,
        )
        # Canonicalized once; every record splices in these exact bytes.
        self._hardware = Canonical.of(self.hardware.to_dict())
        self._software = Canonical.of(
            self.software.to_dict() | {"tokenization_contract": self.contract.to_dict()}
        )
        self._model = Canonical.of(
            {"name": loaded.name, "digest": loaded.digest, "pinned": loaded.pinned}
        )

    # --- the steps ------------------------------------------------------------------

    def prepare(
        self, prompt: Any, params: GenerationParams | None = None, tenant: str = "local",
        started: float | None = None,
    ) -> PreparedRequest:
        """Validate everything before any model work; raises ``InvalidInputError``.

        ``started`` (``time.perf_counter()`` in ms) lets a server count its own body
        parsing into the parse phase.
        """
        start = _now_ms() if started is None else started
        text = validate_prompt(prompt, self.limits)
        checked = (params or GenerationParams()).validate(self.limits)
        parse_ms = _now_ms() - start
        end_ns = time.time_ns()
        return PreparedRequest(text, checked, tenant, parse_ms=parse_ms,
                               parse_span_ns=(end_ns - int(parse_ms * 1e6), end_ns))

    def run_batch(
        self, requests: Sequence[PreparedRequest], min_length: int = 0
    ) -> BatchResult:
        """One ``model.generate`` call for requests that share generation parameters."""
        import torch

        if not requests:
            raise ValueError("a batch needs at least one request")
        params = requests[0].params
        if any(r.params != params for r in requests):
            raise ValueError("all requests in a batch must share generation parameters")
        if params.do_sample and params.seed is None:
            params = GenerationParams(
                params.max_new_tokens, params.temperature, params.top_p,
                secrets.randbelow(MAX_SEED),
            )
        tokenizer, model = self.loaded.tokenizer, self.loaded.model
        timings: dict[str, float] = {}
        spans: dict[str, tuple[int, int]] = {}
        mark = time.time_ns()

        start = _now_ms()
        encoded, truncated = self.contract.encode(
            tokenizer, [r.prompt for r in requests], min_length=min_length
        )
        input_ids = encoded["input_ids"].to(self.loaded.device)
        attention = encoded["attention_mask"].to(self.loaded.device)
        timings["tokenize"] = _now_ms() - start
        spans["tokenize"], mark = (mark, time.time_ns()), time.time_ns()

        start = _now_ms()
        if params.do_sample:
            torch.manual_seed(params.seed)
        sampling = (
            {"do_sample": True, "temperature": params.temperature, "top_p": params.top_p}
            if params.do_sample
            else {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
        )
        with torch.inference_mode():
            generated = model.generate(
                input_ids=input_ids,
                attention_mask=attention,
                max_new_tokens=params.max_new_tokens,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
                **sampling,
            )
        if self.loaded.device.type == "cuda":
            torch.cuda.synchronize(self.loaded.device)
        timings["forward"] = _now_ms() - start
        spans["forward"], mark = (mark, time.time_ns()), time.time_ns()

        start = _now_ms()
        new_tokens = generated[:, input_ids.shape[1]:].cpu().tolist()
        outputs, reasons = [], []
        for row in new_tokens:
            if tokenizer.eos_token_id in row:
                outputs.append(row[: row.index(tokenizer.eos_token_id)])
                reasons.append("stop")
            else:
                outputs.append(row)
                reasons.append("length")
        texts = tokenizer.batch_decode(outputs, skip_special_tokens=True)
        timings["decode"] = _now_ms() - start
        spans["decode"] = (mark, time.time_ns())
        return BatchResult(
            requests=requests,
            params=params,
            input_ids=input_ids.cpu().tolist(),
            attention_mask=attention.cpu().tolist(),
            output_ids=outputs,
            finish_reasons=reasons,
            texts=texts,
            truncated=truncated,
            timings_ms=timings,
            spans_ns=spans,
        )

    def seal(self, batch: BatchResult) -> list[AuditedOutput]:
        """Turn a batch's results into one record per request."""
        rows = len(batch.requests)
        padded_length = len(batch.input_ids[0])
        batch_id = uuid.uuid4().hex  # lets an auditor regroup the records of one generate
        generation = batch.params.to_dict()
        results = []
        for row, request in enumerate(batch.requests):
            mask = batch.attention_mask[row]
            real = sum(mask)
            padding = padded_length - real
            text = batch.texts[row]
            data = DataFingerprint(
                input_commitment=commit_text(request.input_salt, request.prompt),
                input_bytes=len(request.prompt.encode("utf-8")),
                input_shape=[rows, padded_length],
                input_ids_digest=token_ids_digest(batch.input_ids[row]),
                input_token_count=real,
                truncated=batch.truncated[row],
                attention_mask=MaskPattern(
                    length=padded_length,
                    real_tokens=real,
                    padding=padding,
                    padding_side=self.contract.padding_side,
                    digest=token_ids_digest(mask),
                ),
                output_ids_digest=token_ids_digest(batch.output_ids[row]),
                output_token_count=len(batch.output_ids[row]),
                output_commitment=commit_text(request.output_salt, text),
                finish_reason=batch.finish_reasons[row],
                generation=generation,
                batch={
                    "id": batch_id,
                    "size": rows,
                    "row": row,
                    "padded_length": padded_length,
                    "pad_to_multiple_of": self.contract.pad_to_multiple_of,
                    "padding_applied": padding,
                },
            )
            data_members = data.to_dict()
            if request.stream_start_id is not None:
                data_members["stream_start_record_id"] = request.stream_start_id
            record = build_record(
                tenant=request.tenant,
                model=self._model,
                hardware=self._hardware,
                software=self._software,
                data=data_members,
                timings_ms={"parse": request.parse_ms, **batch.timings_ms},
            )
            results.append(
                AuditedOutput(text, record, request.input_salt, request.output_salt,
                              batch.output_ids[row])
            )
        return results

    def stream_start(self, request: PreparedRequest, route: str) -> AuditRecord:
        """The start record of a streamed request: input commitment, fingerprints and
        parameters, committed before any of its tokens leaves the server."""
        from ledger.stream_record import build_stream_start

        return build_stream_start(
            tenant=request.tenant, model=self._model, hardware=self._hardware,
            software=self._software,
            input_commitment=commit_text(request.input_salt, request.prompt),
            input_bytes=len(request.prompt.encode("utf-8")),
            generation=request.params.to_dict(), route=route)

    # --- conveniences ---------------------------------------------------------------

    def generate_batch(self, requests: Sequence[PreparedRequest]) -> list[AuditedOutput]:
        return self.seal(self.run_batch(requests))

    def generate(
        self, prompt: Any, params: GenerationParams | None = None, tenant: str = "local"
    ) -> AuditedOutput:
        return self.generate_batch([self.prepare(prompt, params, tenant)])[0]
