"""Table definitions (SQLAlchemy Core). The schema itself is created only by the
Alembic migrations in ``migrations/``; a test checks the two agree.

- ``tree_nodes`` is the log: every perfect subtree hash (level 0 = leaf hashes), enough
  to serve any root or proof from O(log n) rows.
- ``tree_state`` is the sequencer: one row holding the size and root, locked by each
  appending transaction.
- ``checkpoints`` are the signed notes, one per sealed size.
- ``log_meta`` is the log's identity: its unique origin and the verifier key of its
  signing key, fixed when the log is created.
- ``records`` is the auditors' mirror: typed, indexed columns and the exact canonical
  bytes that were hashed (for a v2 leaf its envelope, with its body beside it), each row
  written once. Which checkpoint and which anchor cover a row is derived from the
  ``checkpoints`` and ``anchors`` sizes, never stored on it (decision 0029);
  ``environments`` holds the filter columns of each environment leaf.
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
    text,
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
    Column("sealed_by", String(128)),  # the replica that sealed it (not in the signed note)
)

# One row (id 1), written once when the log is created: its origin and verifier key.
log_meta = Table(
    "log_meta",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("origin", Text, nullable=False),
    Column("verifier_key", Text, nullable=False),
    Column("created_at", DateTime, nullable=False),
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
    Column("canonical", LargeBinary, nullable=False),  # the exact bytes that were hashed
    # v2 leaves (decision 0026): ``canonical`` is the envelope, ``body`` the body beside
    # it; a v2 record names the environment leaf it ran under. NULL for v1 leaves.
    Column("body", LargeBinary),
    Column("environment_index", BigInteger),
    Index("ix_records_created_at", "created_at"),
    Index("ix_records_tenant_created_at", "tenant", "created_at"),
    # Only rows with a value (migration 0012): a v2 record's are NULL, its environment's
    # are in ``environments``.
    *(Index(f"ix_records_{column}", column, sqlite_where=text(f"{column} IS NOT NULL"),
            postgresql_where=text(f"{column} IS NOT NULL"))
      for column in ("model_digest", "accelerator_model", "driver_version",
                     "service_revision")),
    Index("ix_records_environment_index", "environment_index"),
)

# The filter columns of each environment/v1 leaf (decision 0026): a v2 record's model,
# accelerator, driver, torch and service revision are its environment's, found through
# records.environment_index. Recomputed by ``audit`` from the leaf's bytes.
environments = Table(
    "environments",
    metadata,
    Column("leaf_index", BigInteger, primary_key=True, autoincrement=False),
    Column("model_name", String(256)),
    Column("model_digest", String(80)),
    Column("accelerator", String(16)),
    Column("accelerator_model", String(128)),
    Column("driver_version", String(64)),
    Column("torch_version", String(64)),
    Column("torch_commit", String(64)),
    Column("service_revision", String(64)),
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

cosignatures = Table(
    "cosignatures",
    metadata,
    Column("checkpoint_size", BigInteger, nullable=False),
    Column("witness", String(255), nullable=False),  # the witness's key name
    Column("line", Text, nullable=False),  # the C2SP cosignature line, verified when stored
    Column("timestamp", BigInteger, nullable=False),  # the cosignature's own time (POSIX)
    PrimaryKeyConstraint("checkpoint_size", "witness", name="pk_cosignatures"),
)

# --- retained content (issue 12; ledger.store.vault) -----------------------------------
# Ciphertexts only; each record's data key is stored wrapped by its tenant's KEK, which
# lives outside the database. Never part of the log or the mirror.
vault_content = Table(
    "vault_content",
    metadata,
    Column("record_id", String(64), primary_key=True),
    Column("tenant", String(128), nullable=False),
    Column("leaf_hash", LargeBinary(32), nullable=False),
    Column("created_at", DateTime, nullable=False),  # UTC, naive
    Column("expires_at", DateTime, nullable=False),  # end of the retention period
    Column("subject_hash", String(80)),  # HMAC of the data-subject id, or NULL
    Column("kek_id", String(64)),
    Column("wrapped_key", LargeBinary),  # NULL once erased
    Column("prompt_ct", LargeBinary),
    Column("output_ct", LargeBinary),
    Column("input_salt_ct", LargeBinary),
    Column("output_salt_ct", LargeBinary),
    Column("subject_ct", LargeBinary),  # the subject id, encrypted (for subject-key rotation)
    Column("erased_at", DateTime),
    Column("erasure_record_id", String(64)),
    Index("ix_vault_content_tenant_subject", "tenant", "subject_hash"),
    Index("ix_vault_content_expires_at", "expires_at"),
)

retention_policies = Table(
    "retention_policies",
    metadata,
    Column("tenant", String(128), primary_key=True),
    Column("mode", String(16), nullable=False),  # commitments | content
    Column("days", Integer),  # retention period for mode content
    Column("updated_at", DateTime, nullable=False),
)

legal_holds = Table(
    "legal_holds",
    metadata,
    Column("hold_id", String(32), primary_key=True),
    Column("tenant", String(128), nullable=False),
    Column("record_id", String(64)),  # NULL: the whole tenant
    Column("reason", Text, nullable=False),
    Column("created_at", DateTime, nullable=False),
    Column("released_at", DateTime),
    Index("ix_legal_holds_tenant", "tenant"),
)

# Short-lived answers to requests sent with an Idempotency-Key (salts included), so a
# retry gets the original receipt. Not part of the log or the mirror; purged by TTL.
receipts = Table(
    "receipts",
    metadata,
    Column("tenant", String(128), nullable=False),
    Column("idempotency_key", String(255), nullable=False),
    # HMAC of the route and body under a key-store key; NULL once erased (decision 0062).
    Column("fingerprint", LargeBinary(32), nullable=True),
    Column("state", String(8), nullable=False),  # "pending" or "done"
    # Legacy plaintext answer (before migration 0011); new answers go to response_ct.
    Column("response", Text, nullable=True),
    Column("created_at", DateTime, nullable=False),
    Column("expires_at", DateTime, nullable=False),
    # A random token per claim: only its holder may complete or release it (a stale
    # claim taken over by another request gets a new one).
    Column("owner", String(32), nullable=True),
    # The answer once done, encrypted under a key wrapped by the tenant's KEK (so an
    # erasure that destroys the KEK kills it), and the records it names (comma-joined).
    Column("record_ids", Text, nullable=True),
    Column("kek_id", String(64), nullable=True),
    Column("wrapped_key", LargeBinary, nullable=True),
    Column("response_ct", LargeBinary, nullable=True),
    PrimaryKeyConstraint("tenant", "idempotency_key", name="pk_receipts"),
    Index("ix_receipts_expires_at", "expires_at"),
)

# The service's own readiness over time (SLO availability): one row per span of one
# replica in one state; the open span's end is pushed forward as the state is sampled.
# Not part of the log; kept so downtime survives restarts.
readiness_history = Table(
    "readiness_history",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("replica", String(128), nullable=False),
    Column("ready", Integer, nullable=False),  # 1 ready, 0 not ready
    Column("started_at", DateTime, nullable=False),
    Column("ended_at", DateTime, nullable=False),
    Column("clean_stop", Integer, nullable=False, server_default=text("0")),
    Index("ix_readiness_history_ended_at", "ended_at"),
)
