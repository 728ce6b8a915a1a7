"""Cosignatures: witness cosignature lines (C2SP tlog-cosignature) per checkpoint size.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "cosignatures",
        sa.Column("checkpoint_size", sa.BigInteger(), nullable=False),
        sa.Column("witness", sa.String(255), nullable=False),
        sa.Column("line", sa.Text(), nullable=False),
        sa.Column("timestamp", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("checkpoint_size", "witness", name="pk_cosignatures"),
    )


def downgrade() -> None:
    op.drop_table("cosignatures")
