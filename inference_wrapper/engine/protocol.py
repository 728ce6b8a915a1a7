"""The engine boundary: what the audit pipeline asks of an engine, and what comes back.

An engine knows prompts (already chat-templated), generation parameters, stop strings and
truncation flags; it returns token ids, masks, texts, finish reasons, timings and a GPU
sample. It knows no tenants, salts, users, subjects or records: the audit pipeline
(``inference_wrapper.audit``) turns an ``EngineResult`` into records.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from inference_wrapper.engine.params import GenerationParams
from ledger.errors import LedgerError

# Called once per decoding step with one entry per row: the row's new token id, or None
# once the row has ended. Always called on the event loop that awaits ``generate``.
OnStep = Callable[[list[int | None]], None]


class EngineDownError(LedgerError):
    """The engine died or is not running: the batch it held produced nothing."""


@dataclass(frozen=True)
class EngineBatch:
    """One ``generate`` call: rows that share generation parameters."""

    prompts: tuple[str, ...]
    params: GenerationParams
    stops: tuple[tuple[str, ...], ...]  # per row: the output ends before the first of these
    truncate: tuple[bool, ...]  # per row: may the contract cut an over-long prompt
    min_length: int = 0  # pad to at least this many tokens (a replay of a recorded batch)

    def __post_init__(self) -> None:
        if not self.prompts:
            raise ValueError("a batch needs at least one prompt")
        if not len(self.prompts) == len(self.stops) == len(self.truncate):
            raise ValueError("prompts, stops and truncate need one entry per row")

    def to_wire(self) -> dict[str, Any]:
        return {"prompts": list(self.prompts), "params": _params_to_wire(self.params),
                "stops": [list(s) for s in self.stops], "truncate": list(self.truncate),
                "min_length": self.min_length}

    @classmethod
    def from_wire(cls, value: Mapping[str, Any]) -> EngineBatch:
        return cls(tuple(value["prompts"]), _params_from_wire(value["params"]),
                   tuple(tuple(s) for s in value["stops"]), tuple(value["truncate"]),
                   int(value["min_length"]))


@dataclass
class EngineResult:
    """What the model produced for one batch, row by row, before any audit work."""

    engine_id: str
    params: GenerationParams  # with the seed actually used
    input_ids: list[list[int]]
    attention_mask: list[list[int]]
    output_ids: list[list[int]]
    texts: list[str]
    finish_reasons: list[str]
    truncated: list[bool]
    timings_ms: dict[str, float]
    spans_ns: dict[str, tuple[int, int]] = field(default_factory=dict)  # wall clock
    gpu_sample: dict[str, Any] | None = None  # the engine GPU's state after the batch

    def to_wire(self) -> dict[str, Any]:
        return {"engine_id": self.engine_id, "params": _params_to_wire(self.params),
                "input_ids": self.input_ids, "attention_mask": self.attention_mask,
                "output_ids": self.output_ids, "texts": self.texts,
                "finish_reasons": self.finish_reasons, "truncated": self.truncated,
                "timings_ms": self.timings_ms,
                "spans_ns": {k: list(v) for k, v in self.spans_ns.items()},
                "gpu_sample": self.gpu_sample}

    @classmethod
    def from_wire(cls, value: Mapping[str, Any]) -> EngineResult:
        return cls(value["engine_id"], _params_from_wire(value["params"]),
                   value["input_ids"], value["attention_mask"], value["output_ids"],
                   value["texts"], value["finish_reasons"], value["truncated"],
                   value["timings_ms"],
                   {k: (int(v[0]), int(v[1])) for k, v in value["spans_ns"].items()},
                   value["gpu_sample"])


class EngineClient(Protocol):
    """One engine: a model on one device, in this process or another."""

    engine_id: str

    def environment(self) -> Mapping[str, Any]:
        """Captured inside the engine: ``model``, ``hardware``, ``software``,
        ``tokenization_contract``, ``generation_config_digest``."""
        ...

    async def generate(self, batch: EngineBatch, on_step: OnStep | None) -> EngineResult:
        """Raises ``EngineDownError`` when the engine dies while it holds the batch."""
        ...

    def alive(self) -> bool: ...

    async def close(self) -> None: ...


def _params_to_wire(params: GenerationParams) -> dict[str, Any]:
    return {"max_new_tokens": params.max_new_tokens, "temperature": params.temperature,
            "top_p": params.top_p, "seed": params.seed}


def _params_from_wire(value: Mapping[str, Any]) -> GenerationParams:
    return GenerationParams(int(value["max_new_tokens"]), float(value["temperature"]),
                            float(value["top_p"]),
                            None if value["seed"] is None else int(value["seed"]))
