"""VMs remember when a destroy was asked for, before libvirt was: a crash between
the domain's destroy and the row's update is then finished as a destroy by
reconciliation, not taken for a domain lost outside Rift.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("vms") as batch:
        # UtcDateTime as stored, frozen here: timestamptz, or an ISO string on SQLite.
        kind = sa.DateTime(timezone=True).with_variant(sa.String(32), "sqlite")
        batch.add_column(sa.Column("destroy_requested_at", kind, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("vms") as batch:
        batch.drop_column("destroy_requested_at")
