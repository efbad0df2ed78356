"""Volumes (SPEC §18): a user's disks that outlive tasks (name unique per user, size,
host, state, the volume a clone came from), and their attachments to VMs (path
in the guest, read-only or not, the guest's disk name, state).

Revision ID: 0017
Revises: 0016
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # UtcDateTime as stored, frozen here: timestamptz, or an ISO string on SQLite.
    at = sa.DateTime(timezone=True).with_variant(sa.String(32), "sqlite")
    op.create_table(
        "volumes",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("owner", sa.String(), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("size_gib", sa.Integer(), nullable=False),
        sa.Column("host", sa.String(), nullable=False),
        sa.Column("state", sa.String(), nullable=False),
        sa.Column("created_at", at, nullable=False),
        sa.Column("parent_id", sa.String(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_volumes")),
    )
    op.create_index("ux_volumes_owner_name", "volumes", ["owner", "name"], unique=True)
    op.create_table(
        "volume_attachments",
        sa.Column("volume_id", sa.String(), nullable=False),
        sa.Column("vm_id", sa.String(), nullable=False),
        sa.Column("task_id", sa.String(), nullable=False),
        sa.Column("path", sa.String(), nullable=False),
        sa.Column("read_only", sa.Boolean(), nullable=False),
        sa.Column("target", sa.String(), nullable=False),
        sa.Column("state", sa.String(), nullable=False),
        sa.Column("created_at", at, nullable=False),
        sa.ForeignKeyConstraint(["volume_id"], ["volumes.id"],
                                name=op.f("fk_volume_attachments_volume_id_volumes")),
        sa.ForeignKeyConstraint(["vm_id"], ["vms.id"],
                                name=op.f("fk_volume_attachments_vm_id_vms")),
        sa.PrimaryKeyConstraint("volume_id", "vm_id", name=op.f("pk_volume_attachments")),
    )
    op.create_index("ix_volume_attachments_vm_id", "volume_attachments", ["vm_id"])


def downgrade() -> None:
    op.drop_index("ix_volume_attachments_vm_id", table_name="volume_attachments")
    op.drop_table("volume_attachments")
    op.drop_index("ux_volumes_owner_name", table_name="volumes")
    op.drop_table("volumes")
