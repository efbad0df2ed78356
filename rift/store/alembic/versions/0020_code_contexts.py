"""Code contexts (SPEC §20): a VM's kernels as the engine last knew them (language,
cwd, last run, execution count, a run in flight and the latest it can end).

Revision ID: 0020
Revises: 0019
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # UtcDateTime as stored, frozen here: timestamptz, or an ISO string on SQLite.
    at = sa.DateTime(timezone=True).with_variant(sa.String(32), "sqlite")
    op.create_table(
        "code_contexts",
        sa.Column("vm_id", sa.String(), nullable=False),
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("task_id", sa.String(), nullable=False),
        sa.Column("language", sa.String(), nullable=False),
        sa.Column("cwd", sa.Text(), nullable=True),
        sa.Column("created_at", at, nullable=False),
        sa.Column("last_run_at", at, nullable=True),
        sa.Column("execution_count", sa.Integer(), nullable=True),
        sa.Column("last_status", sa.String(), nullable=True),
        sa.Column("run_id", sa.String(), nullable=True),
        sa.Column("run_until", at, nullable=True),
        sa.ForeignKeyConstraint(["vm_id"], ["vms.id"],
                                name=op.f("fk_code_contexts_vm_id_vms")),
        sa.PrimaryKeyConstraint("vm_id", "id", name=op.f("pk_code_contexts")),
    )
    op.create_index("ix_code_contexts_task_id", "code_contexts", ["task_id"])


def downgrade() -> None:
    op.drop_index("ix_code_contexts_task_id", table_name="code_contexts")
    op.drop_table("code_contexts")
