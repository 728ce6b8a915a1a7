"""Receipts: an owner token per claim, so that a request whose stale claim was taken over
cannot complete or release its successor's claim when it finishes late.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Rows from before (no owner) can only be taken over, never completed: they are
    # short-lived answers, and a pending one older than the stale limit is taken over.
    op.add_column("receipts", sa.Column("owner", sa.String(32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("receipts") as batch:
        batch.drop_column("owner")
