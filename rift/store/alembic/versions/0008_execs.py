"""Execs (SPEC §10): each command started in a guest, its status and its end.
The output stays in the guest; rows go with their task's tombstone.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # UtcDateTime as stored, frozen here: timestamptz, or an ISO string on SQLite.
    at = sa.DateTime(timezone=True).with_variant(sa.String(32), "sqlite")
    op.create_table(
        "execs",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("task_id", sa.String(), nullable=False),
        sa.Column("vm_id", sa.String(), nullable=False),
        sa.Column("owner", sa.String(), nullable=False),
        sa.Column("command", sa.Text(), nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("timeout_s", sa.Integer(), nullable=False),
        sa.Column("started_at", at, nullable=False),
        sa.Column("ended_at", at, nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("signal", sa.String(), nullable=True),
        sa.Column("timed_out", sa.Boolean(), nullable=False),
        sa.Column("stdout_bytes", sa.BigInteger(), nullable=False),
        sa.Column("stderr_bytes", sa.BigInteger(), nullable=False),
        sa.Column("duration_ms", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"],
                                name=op.f("fk_execs_task_id_tasks")),
        sa.ForeignKeyConstraint(["vm_id"], ["vms.id"], name=op.f("fk_execs_vm_id_vms")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_execs")),
    )
    op.create_index("ix_execs_task_id_started_at", "execs", ["task_id", "started_at"])
    op.create_index("ix_execs_status_started_at", "execs", ["status", "started_at"])


def downgrade() -> None:
    op.drop_index("ix_execs_status_started_at", table_name="execs")
    op.drop_index("ix_execs_task_id_started_at", table_name="execs")
    op.drop_table("execs")
