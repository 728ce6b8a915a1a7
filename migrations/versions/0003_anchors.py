"""Anchors: where each checkpoint was anchored (local table or a Fabric transaction).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "anchors",
        sa.Column("size", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("note", sa.LargeBinary(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("ref", sa.Text(), nullable=False),
        sa.Column("anchored_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("size"),
    )


def downgrade() -> None:
    op.drop_table("anchors")
