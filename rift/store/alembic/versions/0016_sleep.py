"""Sleep and wake (SPEC §17): a task's `sleep_after_s` and `sleep`, a VM's last wake.

Revision ID: 0016
Revises: 0015
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.add_column(sa.Column("sleep_after_s", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("sleep", sa.String(), nullable=False,
                                   server_default="idle"))
    with op.batch_alter_table("vms") as batch:
        batch.add_column(sa.Column("woke_ms", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("vms") as batch:
        batch.drop_column("woke_ms")
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("sleep")
        batch.drop_column("sleep_after_s")
