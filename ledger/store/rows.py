"""A leaf's mirror row, the same for every driver (SQL and the in-memory twin), and the
size check every driver applies before it writes a leaf."""

from __future__ import annotations

from typing import Any

from ledger.leaves.body_codec import pack_body
from ledger.leaves.envelope import Leaf
from ledger.leaves.mirror import leaf_columns
from ledger.record import mirror_columns
from ledger.store.log_api import LogLeaf
from ledger.tiles import check_entry_sizes

RECORD_INSERT_COLUMNS = (
    "leaf_index", "record_id", "created_at", "tenant", "model_name", "model_digest",
    "accelerator", "accelerator_model", "driver_version", "torch_version", "torch_commit",
    "service_revision", "input_commitment", "output_commitment", "canonical", "body",
    "environment_index",
)


def row_columns(leaf: LogLeaf) -> dict[str, Any]:
    """A leaf's mirror row, but for its index (``created_at`` as RFC 3339 text)."""
    if isinstance(leaf, Leaf):
        return {**leaf_columns(leaf), "canonical": leaf.envelope, "body": pack_body(leaf.body)}
    return {**mirror_columns(leaf), "canonical": leaf.canonical, "body": None,
            "environment_index": None}


def stored_bytes(value: Any) -> bytes:
    """A binary column's value as bytes. Text a tampering UPDATE left there (SQLite keeps
    it) is read as its UTF-8 bytes: it then fails the hash it stands for, a finding,
    instead of crashing the reader."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    return str(value).encode("utf-8", "surrogatepass")


def check_publishable(leaf: LogLeaf) -> None:
    """Raise LeafTooLargeError for a leaf its tiles could never publish (decision 0061):
    every driver asks before it gives the leaf an index."""
    check_entry_sizes(leaf.canonical, leaf.body if isinstance(leaf, Leaf) else None)
