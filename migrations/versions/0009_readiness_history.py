"""Readiness history: the service's own ready / not-ready spans per replica, kept so that
SLO availability (downtime minutes, longest outage) survives restarts. Not part of the log.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "readiness_history",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("replica", sa.String(128), nullable=False),
        sa.Column("ready", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("ended_at", sa.DateTime(), nullable=False),
        sa.Column("clean_stop", sa.Integer(), nullable=False, server_default=sa.text("0")),
    )
    op.create_index("ix_readiness_history_ended_at", "readiness_history", ["ended_at"])


def downgrade() -> None:
    op.drop_index("ix_readiness_history_ended_at", table_name="readiness_history")
    op.drop_table("readiness_history")
