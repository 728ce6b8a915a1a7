"""Initial schema: tree nodes, sequencer state, checkpoints, records mirror.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tree_nodes",
        sa.Column("level", sa.Integer(), nullable=False),
        sa.Column("idx", sa.BigInteger(), nullable=False),
        sa.Column("hash", sa.LargeBinary(32), nullable=False),
        sa.PrimaryKeyConstraint("level", "idx", name="pk_tree_nodes"),
    )
    op.create_table(
        "tree_state",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("root", sa.LargeBinary(32), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "checkpoints",
        sa.Column("size", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("root", sa.LargeBinary(32), nullable=False),
        sa.Column("note", sa.LargeBinary(), nullable=False),
        sa.Column("sealed_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("size"),
    )
    op.create_table(
        "records",
        sa.Column("leaf_index", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("record_id", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("model_name", sa.String(256)),
        sa.Column("model_digest", sa.String(80)),
        sa.Column("accelerator", sa.String(16)),
        sa.Column("accelerator_model", sa.String(128)),
        sa.Column("driver_version", sa.String(64)),
        sa.Column("torch_version", sa.String(64)),
        sa.Column("torch_commit", sa.String(64)),
        sa.Column("service_revision", sa.String(64)),
        sa.Column("input_commitment", sa.String(80)),
        sa.Column("output_commitment", sa.String(80)),
        sa.Column("checkpoint_size", sa.BigInteger()),
        sa.Column("anchor_ref", sa.Text()),
        sa.Column("canonical", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("leaf_index"),
        sa.UniqueConstraint("record_id"),
    )
    for name, columns in [
        ("ix_records_created_at", ["created_at"]),
        ("ix_records_tenant_created_at", ["tenant", "created_at"]),
        ("ix_records_model_digest", ["model_digest"]),
        ("ix_records_accelerator_model", ["accelerator_model"]),
        ("ix_records_driver_version", ["driver_version"]),
        ("ix_records_service_revision", ["service_revision"]),
        ("ix_records_checkpoint_size", ["checkpoint_size"]),
    ]:
        op.create_index(name, "records", columns)
    # The sequencer row: the empty tree, whose root is SHA-256 of the empty string.
    op.execute(
        sa.text("INSERT INTO tree_state (id, size, root) VALUES (1, 0, :root)").bindparams(
            sa.bindparam("root", bytes.fromhex(
                "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
                type_=sa.LargeBinary)
        )
    )


def downgrade() -> None:
    op.drop_table("records")
    op.drop_table("checkpoints")
    op.drop_table("tree_state")
    op.drop_table("tree_nodes")
