"""Hosts remember when they stopped answering (reconciliation sets and clears it),
so placement skips them on every replica.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("hosts") as batch:
        # UtcDateTime as stored, frozen here: timestamptz, or an ISO string on SQLite.
        kind = sa.DateTime(timezone=True).with_variant(sa.String(32), "sqlite")
        batch.add_column(sa.Column("unreachable_since", kind, nullable=True))
        batch.add_column(sa.Column("last_error", sa.String(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("hosts") as batch:
        batch.drop_column("last_error")
        batch.drop_column("unreachable_since")
