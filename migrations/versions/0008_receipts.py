"""Receipts: answers to requests sent with an Idempotency-Key, salts included, kept for a
short time (TTL) so that a retry gets the original answer. Never part of the log or the
mirror; rows are purged once they expire.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "receipts",
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("idempotency_key", sa.String(255), nullable=False),
        sa.Column("fingerprint", sa.LargeBinary(32), nullable=False),
        sa.Column("state", sa.String(8), nullable=False),
        sa.Column("response", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("tenant", "idempotency_key", name="pk_receipts"),
    )
    op.create_index("ix_receipts_expires_at", "receipts", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_receipts_expires_at", table_name="receipts")
    op.drop_table("receipts")
