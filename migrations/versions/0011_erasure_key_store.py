"""Erasure that erases (issue 25): stored answers are encrypted under a key wrapped by
the tenant's KEK and name their records; a record's data-subject id is kept encrypted
beside its content so the subject key can be rotated.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("receipts", sa.Column("record_ids", sa.Text, nullable=True))
    op.add_column("receipts", sa.Column("kek_id", sa.String(64), nullable=True))
    op.add_column("receipts", sa.Column("wrapped_key", sa.LargeBinary, nullable=True))
    op.add_column("receipts", sa.Column("response_ct", sa.LargeBinary, nullable=True))
    op.add_column("vault_content", sa.Column("subject_ct", sa.LargeBinary, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("vault_content") as batch:
        batch.drop_column("subject_ct")
    with op.batch_alter_table("receipts") as batch:
        for name in ("response_ct", "wrapped_key", "kek_id", "record_ids"):
            batch.drop_column(name)
