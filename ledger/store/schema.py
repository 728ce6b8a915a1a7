"""Table definitions (SQLAlchemy Core). The schema itself is created only by the
Alembic migrations in ``migrations/``; a test checks the two agree.

- ``tree_nodes`` is the log: every perfect subtree hash (level 0 = leaf hashes), enough
  to serve any root or proof from O(log n) rows.
- ``tree_state`` is the sequencer: one row holding the size and root, locked by each
  appending transaction.
- ``checkpoints`` are the signed notes, one per sealed size.
- ``records`` is the auditors' mirror: typed, indexed columns and the exact canonical
  bytes that were hashed.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
)

metadata = MetaData()

tree_nodes = Table(
    "tree_nodes",
    metadata,
    Column("level", Integer, nullable=False),
    Column("idx", BigInteger, nullable=False),
    Column("hash", LargeBinary(32), nullable=False),
    PrimaryKeyConstraint("level", "idx", name="pk_tree_nodes"),
)

tree_state = Table(
    "tree_state",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("size", BigInteger, nullable=False),
    Column("root", LargeBinary(32), nullable=False),
)

checkpoints = Table(
    "checkpoints",
    metadata,
    Column("size", BigInteger, primary_key=True, autoincrement=False),
    Column("root", LargeBinary(32), nullable=False),
    Column("note", LargeBinary, nullable=False),
    Column("sealed_at", DateTime, nullable=False),
)

records = Table(
    "records",
    metadata,
    Column("leaf_index", BigInteger, primary_key=True, autoincrement=False),
    Column("record_id", String(64), nullable=False, unique=True),
    Column("created_at", DateTime, nullable=False),  # UTC, naive
    Column("tenant", String(128), nullable=False),
    Column("model_name", String(256)),
    Column("model_digest", String(80)),
    Column("accelerator", String(16)),
    Column("accelerator_model", String(128)),
    Column("driver_version", String(64)),
    Column("torch_version", String(64)),
    Column("torch_commit", String(64)),
    Column("service_revision", String(64)),
    Column("input_commitment", String(80)),
    Column("output_commitment", String(80)),
    Column("checkpoint_size", BigInteger),  # the first checkpoint that covered it
    Column("anchor_ref", Text),
    Column("canonical", LargeBinary, nullable=False),  # the exact bytes that were hashed
    Index("ix_records_created_at", "created_at"),
    Index("ix_records_tenant_created_at", "tenant", "created_at"),
    Index("ix_records_model_digest", "model_digest"),
    Index("ix_records_accelerator_model", "accelerator_model"),
    Index("ix_records_driver_version", "driver_version"),
    Index("ix_records_service_revision", "service_revision"),
    Index("ix_records_checkpoint_size", "checkpoint_size"),
)

api_keys = Table(
    "api_keys",
    metadata,
    Column("key_id", String(32), primary_key=True),
    Column("secret_hash", LargeBinary(32), nullable=False),  # SHA-256 of the secret
    Column("tenant", String(128), nullable=False),
    Column("role", String(16), nullable=False),  # client, auditor, admin
    Column("created_at", DateTime, nullable=False),
    Column("revoked_at", DateTime, nullable=True),
)

anchors = Table(
    "anchors",
    metadata,
    Column("size", BigInteger, primary_key=True, autoincrement=False),
    Column("note", LargeBinary, nullable=False),  # the anchored signed checkpoint
    Column("kind", String(16), nullable=False),  # "local" or "fabric"
    Column("ref", Text, nullable=False),  # "local:<size>" or "fabric:<channel>:<txid>:<block>"
    Column("anchored_at", DateTime, nullable=False),
)

# Short-lived answers to requests sent with an Idempotency-Key (salts included), so a
# retry gets the original receipt. Not part of the log or the mirror; purged by TTL.
receipts = Table(
    "receipts",
    metadata,
    Column("tenant", String(128), nullable=False),
    Column("idempotency_key", String(255), nullable=False),
    Column("fingerprint", LargeBinary(32), nullable=False),  # SHA-256 of route and body
    Column("state", String(8), nullable=False),  # "pending" or "done"
    Column("response", Text, nullable=True),  # the JSON answer once done
    Column("created_at", DateTime, nullable=False),
    Column("expires_at", DateTime, nullable=False),
    PrimaryKeyConstraint("tenant", "idempotency_key", name="pk_receipts"),
    Index("ix_receipts_expires_at", "expires_at"),
)
