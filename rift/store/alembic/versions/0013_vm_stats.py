"""What a VM uses (SPEC §14's `stats`): its latest sample and a short history, as JSON.

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("vms") as batch:
        batch.add_column(sa.Column("stats", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("vms") as batch:
        batch.drop_column("stats")
