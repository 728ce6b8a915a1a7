"""Derived state out of rows: drop ``records.checkpoint_size`` and ``records.anchor_ref``.

Which checkpoint first covers a row and which anchor covers it follow from the sizes in
``checkpoints`` and ``anchors`` (decision 0029); an append writes each row once.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_records_unanchored", table_name="records")
    op.drop_index("ix_records_checkpoint_size", table_name="records")
    with op.batch_alter_table("records") as batch:
        batch.drop_column("anchor_ref")
        batch.drop_column("checkpoint_size")


def downgrade() -> None:
    # The columns come back filled from the sizes they were derived from.
    with op.batch_alter_table("records") as batch:
        batch.add_column(sa.Column("checkpoint_size", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("anchor_ref", sa.Text(), nullable=True))
    op.execute("UPDATE records SET checkpoint_size = (SELECT min(c.size) FROM checkpoints c"
               " WHERE c.size > records.leaf_index)")
    op.execute("UPDATE records SET anchor_ref = (SELECT a.ref FROM anchors a"
               " WHERE a.size > records.leaf_index ORDER BY a.size LIMIT 1)")
    op.create_index("ix_records_checkpoint_size", "records", ["checkpoint_size"])
    op.create_index("ix_records_unanchored", "records", ["leaf_index"],
                    sqlite_where=sa.text("anchor_ref IS NULL"),
                    postgresql_where=sa.text("anchor_ref IS NULL"))
