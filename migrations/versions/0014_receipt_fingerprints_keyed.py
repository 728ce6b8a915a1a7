"""Receipts: the fingerprint becomes a keyed MAC, NULL once erased (decision 0062).

Fingerprints written before were a plain SHA-256 of route and body: anyone with the
database could test guesses of a prompt against them, erased ones included. They cannot
be re-keyed (the bodies are not kept), so every one is removed, live ones too: such a
receipt then answers its stored answer (or its 410) to any body until it expires, at
most one receipt TTL after the upgrade.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("receipts") as batch:
        batch.alter_column("fingerprint", existing_type=sa.LargeBinary(32), nullable=True)
    op.execute("UPDATE receipts SET fingerprint = NULL")


def downgrade() -> None:
    # The old code needs a value: one that matches no body (a retry then gets 422, never
    # an answer to another body, and nothing can be guessed from it).
    op.get_bind().execute(sa.text("UPDATE receipts SET fingerprint = :zero WHERE "
                                  "fingerprint IS NULL"), {"zero": bytes(32)})
    with op.batch_alter_table("receipts") as batch:
        batch.alter_column("fingerprint", existing_type=sa.LargeBinary(32), nullable=False)
