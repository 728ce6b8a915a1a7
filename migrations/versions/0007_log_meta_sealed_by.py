"""Log identity and who sealed each checkpoint.

- ``log_meta``: one row, written once when the log is created: its unique origin and the
  verifier key of the key that signs it. Every replica that joins the log reads it.
- ``checkpoints.sealed_by``: the replica that sealed the checkpoint (operators' view; it
  is not part of the signed note).

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "log_meta",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("origin", sa.Text(), nullable=False),
        sa.Column("verifier_key", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.add_column("checkpoints", sa.Column("sealed_by", sa.String(128), nullable=True))


def downgrade() -> None:
    # batch mode: SQLite cannot drop a column in place
    with op.batch_alter_table("checkpoints") as batch:
        batch.drop_column("sealed_by")
    op.drop_table("log_meta")
