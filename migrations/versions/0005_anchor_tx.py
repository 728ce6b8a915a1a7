"""Unanchored rows: a partial index over the mirror rows that have no anchor reference.

Recording an anchor gives EVERY row below its size still without a reference the new
reference (rows a lost commit status left behind included); this index keeps that update
proportional to the rows still waiting instead of to the size of the log.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_records_unanchored", "records", ["leaf_index"],
                    sqlite_where=sa.text("anchor_ref IS NULL"),
                    postgresql_where=sa.text("anchor_ref IS NULL"))


def downgrade() -> None:
    op.drop_index("ix_records_unanchored", table_name="records")
