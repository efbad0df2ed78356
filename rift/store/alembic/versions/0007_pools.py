"""Pools of ready VMs (SPEC §11): what the operator asked for (`pools`) and the
VMs kept ready (`pool_vms`), so every replica shares one view of them.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # UtcDateTime as stored, frozen here: timestamptz, or an ISO string on SQLite.
    at = sa.DateTime(timezone=True).with_variant(sa.String(32), "sqlite")
    op.create_table(
        "pools",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("image", sa.String(), nullable=False),
        sa.Column("host", sa.String(), nullable=True),
        sa.Column("vcpus", sa.Integer(), nullable=False),
        sa.Column("memory_mib", sa.Integer(), nullable=False),
        sa.Column("running", sa.Integer(), nullable=False),
        sa.Column("saved", sa.Integer(), nullable=False),
        sa.Column("created_at", at, nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("retry_at", at, nullable=True),
        sa.Column("last_error", sa.String(), nullable=True),
        sa.Column("filler", sa.String(), nullable=True),
        sa.Column("fill_until", at, nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_pools")),
    )
    op.create_index("ux_pools_image_host_vcpus_memory_mib", "pools",
                    ["image", "host", "vcpus", "memory_mib"], unique=True)
    op.create_table(
        "pool_vms",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("pool_id", sa.String(), nullable=False),
        sa.Column("goal", sa.String(), nullable=False),
        sa.Column("state", sa.String(), nullable=False),
        sa.Column("host", sa.String(), nullable=False),
        sa.Column("image", sa.String(), nullable=False),
        sa.Column("vcpus", sa.Integer(), nullable=False),
        sa.Column("memory_mib", sa.Integer(), nullable=False),
        sa.Column("key_id", sa.String(), nullable=False),
        sa.Column("mark", sa.String(), nullable=False),
        sa.Column("created_at", at, nullable=False),
        sa.Column("ssh_port", sa.Integer(), nullable=True),
        sa.Column("host_key", sa.String(), nullable=True),
        sa.Column("ready_at", at, nullable=True),
        sa.ForeignKeyConstraint(["pool_id"], ["pools.id"],
                                name=op.f("fk_pool_vms_pool_id_pools")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_pool_vms")),
    )
    op.create_index("ix_pool_vms_image_state", "pool_vms", ["image", "state"])
    op.create_index("ix_pool_vms_pool_id", "pool_vms", ["pool_id"])


def downgrade() -> None:
    op.drop_index("ix_pool_vms_pool_id", table_name="pool_vms")
    op.drop_index("ix_pool_vms_image_state", table_name="pool_vms")
    op.drop_table("pool_vms")
    op.drop_index("ux_pools_image_host_vcpus_memory_mib", table_name="pools")
    op.drop_table("pools")
