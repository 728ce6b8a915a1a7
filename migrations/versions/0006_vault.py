"""Retained content: the vault of encrypted prompts and outputs, retention policies and
legal holds (issue 12).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "vault_content",
        sa.Column("record_id", sa.String(64), nullable=False),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("leaf_hash", sa.LargeBinary(32), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=False),
        sa.Column("subject_hash", sa.String(80), nullable=True),
        sa.Column("kek_id", sa.String(64), nullable=True),
        sa.Column("wrapped_key", sa.LargeBinary(), nullable=True),
        sa.Column("prompt_ct", sa.LargeBinary(), nullable=True),
        sa.Column("output_ct", sa.LargeBinary(), nullable=True),
        sa.Column("input_salt_ct", sa.LargeBinary(), nullable=True),
        sa.Column("output_salt_ct", sa.LargeBinary(), nullable=True),
        sa.Column("erased_at", sa.DateTime(), nullable=True),
        sa.Column("erasure_record_id", sa.String(64), nullable=True),
        sa.PrimaryKeyConstraint("record_id"),
    )
    op.create_index("ix_vault_content_tenant_subject", "vault_content",
                    ["tenant", "subject_hash"])
    op.create_index("ix_vault_content_expires_at", "vault_content", ["expires_at"])
    op.create_table(
        "retention_policies",
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("mode", sa.String(16), nullable=False),
        sa.Column("days", sa.Integer(), nullable=True),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("tenant"),
    )
    op.create_table(
        "legal_holds",
        sa.Column("hold_id", sa.String(32), nullable=False),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("record_id", sa.String(64), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("released_at", sa.DateTime(), nullable=True),
        sa.PrimaryKeyConstraint("hold_id"),
    )
    op.create_index("ix_legal_holds_tenant", "legal_holds", ["tenant"])


def downgrade() -> None:
    op.drop_index("ix_legal_holds_tenant", table_name="legal_holds")
    op.drop_table("legal_holds")
    op.drop_table("retention_policies")
    op.drop_index("ix_vault_content_expires_at", table_name="vault_content")
    op.drop_index("ix_vault_content_tenant_subject", table_name="vault_content")
    op.drop_table("vault_content")
