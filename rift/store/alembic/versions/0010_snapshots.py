"""Snapshots (SPEC §12): a VM's memory and disk kept on its host, for forks; each
belongs to a task and goes with it.

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # UtcDateTime as stored, frozen here: timestamptz, or an ISO string on SQLite.
    at = sa.DateTime(timezone=True).with_variant(sa.String(32), "sqlite")
    op.create_table(
        "snapshots",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("task_id", sa.String(), nullable=False),
        sa.Column("vm_id", sa.String(), nullable=False),
        sa.Column("owner", sa.String(), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("host", sa.String(), nullable=False),
        sa.Column("image", sa.String(), nullable=False),
        sa.Column("vcpus", sa.Integer(), nullable=False),
        sa.Column("memory_mib", sa.Integer(), nullable=False),
        sa.Column("disk_gib", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(), nullable=False),
        sa.Column("created_at", at, nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("host_key", sa.String(), nullable=True),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_snapshots_task_id", "snapshots", ["task_id"])


def downgrade() -> None:
    op.drop_index("ix_snapshots_task_id", table_name="snapshots")
    op.drop_table("snapshots")
