"""Cosignatures: witness cosignature lines (C2SP tlog-cosignature) per checkpoint size.

Revision ID: 0002_cosignatures
Revises: 0003
Create Date: 2026-11-30

The task named this revision "0002" with down_revision "0001", but this branch already has
revisions 0002 and 0003; a second "0002" would break Alembic's chain, so it takes a unique
id and hangs off the current head. The lead re-chains migrations when merging.
"""

import sqlalchemy as sa
from alembic import op

revision = "0002_cosignatures"
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
