"""Exposures (SPEC §13): guest ports reached through Rift at a secret URL; only the
secret's SHA-256 digest is kept.

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # UtcDateTime as stored, frozen here: timestamptz, or an ISO string on SQLite.
    at = sa.DateTime(timezone=True).with_variant(sa.String(32), "sqlite")
    op.create_table(
        "exposures",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("vm_id", sa.String(), nullable=False),
        sa.Column("task_id", sa.String(), nullable=False),
        sa.Column("owner", sa.String(), nullable=False),
        sa.Column("port", sa.Integer(), nullable=False),
        sa.Column("digest", sa.String(), nullable=False),
        sa.Column("created_at", at, nullable=False),
        sa.ForeignKeyConstraint(["vm_id"], ["vms.id"], name=op.f("fk_exposures_vm_id_vms")),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"],
                                name=op.f("fk_exposures_task_id_tasks")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_exposures")),
        sa.UniqueConstraint("digest", name="uq_exposures_digest"),
    )
    op.create_index("ux_exposures_vm_id_port", "exposures", ["vm_id", "port"], unique=True)
    op.create_index("ix_exposures_task_id", "exposures", ["task_id"])


def downgrade() -> None:
    op.drop_index("ix_exposures_task_id", table_name="exposures")
    op.drop_index("ux_exposures_vm_id_port", table_name="exposures")
    op.drop_table("exposures")
