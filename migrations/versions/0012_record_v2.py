"""Record v2: a v2 leaf's body beside its envelope, the environment it ran under, and the
environments' filter columns (decision record 0026).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None
FILTER_COLUMNS = ("model_digest", "accelerator_model", "driver_version", "service_revision")


def upgrade() -> None:
    # v1 rows keep NULL in both: their canonical bytes are the record itself.
    op.add_column("records", sa.Column("body", sa.LargeBinary(), nullable=True))
    op.add_column("records", sa.Column("environment_index", sa.BigInteger(), nullable=True))
    op.create_index("ix_records_environment_index", "records", ["environment_index"])
    # A v2 record's filter columns are NULL (its environment has them): index only the
    # rows that have a value, so v2 rows cost these indexes nothing.
    for column in FILTER_COLUMNS:
        op.drop_index(f"ix_records_{column}", table_name="records")
        op.create_index(f"ix_records_{column}", "records", [column],
                        sqlite_where=sa.text(f"{column} IS NOT NULL"),
                        postgresql_where=sa.text(f"{column} IS NOT NULL"))
    op.create_table(
        "environments",
        sa.Column("leaf_index", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("model_name", sa.String(256)),
        sa.Column("model_digest", sa.String(80)),
        sa.Column("accelerator", sa.String(16)),
        sa.Column("accelerator_model", sa.String(128)),
        sa.Column("driver_version", sa.String(64)),
        sa.Column("torch_version", sa.String(64)),
        sa.Column("torch_commit", sa.String(64)),
        sa.Column("service_revision", sa.String(64)),
        sa.PrimaryKeyConstraint("leaf_index"),
    )


def downgrade() -> None:
    for column in FILTER_COLUMNS:
        op.drop_index(f"ix_records_{column}", table_name="records")
        op.create_index(f"ix_records_{column}", "records", [column])
    op.drop_table("environments")
    with op.batch_alter_table("records") as batch:
        batch.drop_index("ix_records_environment_index")
        batch.drop_column("environment_index")
        batch.drop_column("body")
