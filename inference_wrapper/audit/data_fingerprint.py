"""Data fingerprint of one call: commitments, token digests, mask pattern, batch, params."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from ledger.digest import sha256_digest

SCHEMA = "data-fingerprint/v1"


@dataclass(frozen=True)
class MaskPattern:
    """This row's attention mask: how long, how much padding and where, and its digest."""

    length: int
    real_tokens: int
    padding: int
    padding_side: str
    digest: str


@dataclass(frozen=True)
class DataFingerprint:
    input_commitment: str
    input_bytes: int
    input_shape: list[int]  # the batch tensor: [rows, padded length]
    input_ids_digest: str  # this row, padding included
    input_token_count: int  # real tokens of this row after truncation
    truncated: bool
    attention_mask: MaskPattern
    output_ids_digest: str
    output_token_count: int
    output_commitment: str
    finish_reason: str  # "stop" (end of sequence) or "length"
    generation: dict[str, Any]
    batch: dict[str, Any]
    schema: str = SCHEMA

    def to_dict(self) -> dict[str, Any]:
        # Built by hand: dataclasses.asdict deep-copies every value (and even fields()
        # costs), and this runs for every request.
        result = dict(self.__dict__)
        result["attention_mask"] = dict(self.attention_mask.__dict__)
        return result


def token_ids_digest(ids: list[int]) -> str:
    """``sha256:`` over the ids as little-endian signed 64-bit integers (torch's int64)."""
    return sha256_digest(struct.pack(f"<{len(ids)}q", *ids))
