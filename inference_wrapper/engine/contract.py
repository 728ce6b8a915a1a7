"""The tokenization contract: how text becomes tensors, pinned and checked.

A record names the contract it was tokenized under, so a replay or an auditor knows
exactly which tokenizer, padding, truncation and length rules applied.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from inference_wrapper.engine.modelfiles import file_sha256
from ledger.canonical import canonical_bytes
from ledger.digest import sha256_digest
from ledger.errors import InvalidInputError, ModelIntegrityError

SCHEMA = "tokenization-contract/v1"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja")


def tokenizer_digest(model_dir: Path) -> str:
    """Digest of the files that define tokenization (order-independent manifest)."""
    files = {n: file_sha256(model_dir / n) for n in TOKENIZER_FILES if (model_dir / n).is_file()}
    if "tokenizer.json" not in files:
        raise ModelIntegrityError("tokenizer.json", "a fast tokenizer file is required")
    return sha256_digest(canonical_bytes({"schema": "tokenizer-files/v1", "files": files}))


class ContextLengthError(InvalidInputError):
    """A prompt longer than the contract's ``max_length``, and no truncation asked for."""

    def __init__(self, field: str, tokens: int, max_length: int) -> None:
        super().__init__(field, f"is {tokens} tokens, the tokenization contract allows "
                                f"{max_length}; shorten it, or ask for truncation explicitly "
                                '("truncate": "left")')
        self.tokens, self.max_length = tokens, max_length


@dataclass(frozen=True)
class TokenizationContract:
    tokenizer_digest: str
    padding_side: str = "left"  # decoder-only generation continues from the right edge
    truncation_side: str = "left"  # keep the end of an over-long prompt, nearest the answer
    max_length: int = 1024
    pad_to_multiple_of: int = 8
    add_special_tokens: bool = False
    schema: str = SCHEMA

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def digest(self) -> str:
        return sha256_digest(canonical_bytes(self.to_dict()))

    def apply(self, tokenizer: Any) -> None:
        """Configure a tokenizer to follow this contract."""
        if self.padding_side not in ("left", "right") or self.truncation_side not in (
            "left", "right",
        ):
            raise ValueError("padding_side and truncation_side are 'left' or 'right'")
        tokenizer.padding_side = self.padding_side
        tokenizer.truncation_side = self.truncation_side
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token

    def count(self, tokenizer: Any, text: str) -> int:
        """Tokens ``text`` becomes under this contract, before any truncation."""
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is not None and backend.truncation is None:
            # The fast tokenizer's own encoder: the same ids as calling the tokenizer,
            # without the Python wrapper's per-call cost (about 5x on short prompts).
            return len(backend.encode(text, add_special_tokens=self.add_special_tokens))
        return len(tokenizer(text, add_special_tokens=self.add_special_tokens)["input_ids"])

    def check_length(self, tokenizer: Any, text: str, *, truncate: bool,
                     field: str = "prompt") -> int:
        """Refuse a prompt over ``max_length`` unless the caller asked for truncation, so no
        prompt is ever cut silently. Returns its token count."""
        tokens = self.count(tokenizer, text)
        if tokens > self.max_length and not truncate:
            raise ContextLengthError(field, tokens, self.max_length)
        return tokens

    def encode(
        self, tokenizer: Any, texts: list[str], min_length: int = 0
    ) -> tuple[Any, list[bool]]:
        """Tokenize a batch under the contract, in one tokenizer pass.

        ``min_length`` pads further (a replay reproducing a recorded batch's padding).
        Returns a BatchEncoding of torch tensors and, per row, whether it was truncated.
        """
        ids = tokenizer(texts, add_special_tokens=self.add_special_tokens)["input_ids"]
        truncated = [len(row) > self.max_length for row in ids]
        if self.truncation_side == "left":
            ids = [row[-self.max_length :] for row in ids]
        else:
            ids = [row[: self.max_length] for row in ids]
        longest = max(len(row) for row in ids)
        multiple = self.pad_to_multiple_of
        target = max(min_length, -(-longest // multiple) * multiple)
        encoded = tokenizer.pad(
            {"input_ids": ids}, padding="max_length", max_length=target, return_tensors="pt"
        )
        return encoded, truncated
