"""Generation parameters and request limits, validated before any model work."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from ledger.errors import InvalidInputError

# Records are RFC 8785 JSON, whose integers must fit an IEEE double exactly.
MAX_SEED = 2**53 - 1
# Below this, logits / temperature overflow and sampling has no defined distribution.
MIN_SAMPLING_TEMPERATURE = 0.01


@dataclass(frozen=True)
class Limits:
    max_prompt_bytes: int = 16_384
    max_new_tokens: int = 512
    max_temperature: float = 2.0


@dataclass(frozen=True)
class GenerationParams:
    max_new_tokens: int = 32
    temperature: float = 0.0  # 0 means greedy decoding
    top_p: float = 1.0
    seed: int | None = None

    @property
    def do_sample(self) -> bool:
        return self.temperature > 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"do_sample": self.do_sample}

    def validate(self, limits: Limits) -> GenerationParams:
        _check_int("max_new_tokens", self.max_new_tokens, 1, limits.max_new_tokens)
        _check_float("temperature", self.temperature, 0.0, limits.max_temperature)
        if 0 < self.temperature < MIN_SAMPLING_TEMPERATURE:
            raise InvalidInputError(
                "temperature", f"must be 0 (greedy) or at least {MIN_SAMPLING_TEMPERATURE}"
            )
        _check_float("top_p", self.top_p, 0.0, 1.0)
        if self.top_p == 0.0:
            raise InvalidInputError("top_p", "must be greater than 0")
        if self.seed is not None:
            _check_int("seed", self.seed, 0, MAX_SEED)
        if isinstance(self.temperature, int) or isinstance(self.top_p, int):
            # JSON's 2 is a number like 2.0; transformers refuses an int temperature.
            return replace(self, temperature=float(self.temperature), top_p=float(self.top_p))
        return self


def _check_int(field: str, value: Any, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInputError(field, f"must be an integer, got {type(value).__name__}")
    if not low <= value <= high:
        raise InvalidInputError(field, f"must be between {low} and {high}, got {value}")


def _check_float(field: str, value: Any, low: float, high: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInputError(field, f"must be a number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise InvalidInputError(field, f"must be finite, got {value}")
    if not low <= value <= high:
        raise InvalidInputError(field, f"must be between {low} and {high}, got {value}")


def validate_prompt(prompt: Any, limits: Limits, field: str = "prompt") -> str:
    """Return the prompt as text; refuse empty, oversize or non-UTF-8 input."""
    if isinstance(prompt, (bytes, bytearray)):
        try:
            prompt = bytes(prompt).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidInputError(field, f"is not valid UTF-8 (byte {exc.start})") from exc
    if not isinstance(prompt, str):
        raise InvalidInputError(field, f"must be a string, got {type(prompt).__name__}")
    if not prompt.strip():
        raise InvalidInputError(field, "must not be empty")
    try:
        size = len(prompt.encode("utf-8"))
    except UnicodeEncodeError as exc:  # lone surrogates cannot be encoded
        raise InvalidInputError(field, "is not valid Unicode text") from exc
    if size > limits.max_prompt_bytes:
        raise InvalidInputError(
            field, f"is {size} bytes, the limit is {limits.max_prompt_bytes}"
        )
    return prompt
