"""VMs can be paused (SPEC §12): the status `paused`, and a change under way
(`change`: `pausing` or `resuming`, since `change_at`), recorded before libvirt
is asked so that reconciliation finishes or rolls back one a crash cut short.
Rows made before it have no change under way.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # UtcDateTime as stored, frozen here: timestamptz, or an ISO string on SQLite.
    at = sa.DateTime(timezone=True).with_variant(sa.String(32), "sqlite")
    with op.batch_alter_table("vms") as batch:
        batch.add_column(sa.Column("change", sa.String(), nullable=True))
        batch.add_column(sa.Column("change_at", at, nullable=True))


def downgrade() -> None:
    # A paused VM cannot be told from a running one without the status: before
    # this revision it is a running VM whose domain is shut off (reconciliation
    # then fails it and takes the domain down).
    vms = sa.table("vms", sa.column("status", sa.String()))
    op.get_bind().execute(sa.update(vms).where(vms.c.status == "paused")
                          .values(status="running"))
    with op.batch_alter_table("vms") as batch:
        batch.drop_column("change_at")
        batch.drop_column("change")
