"""A VM's egress (SPEC §13): what its guest may reach, `open` or `none`.

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("vms") as batch:
        batch.add_column(sa.Column("egress", sa.String(), nullable=False,
                                   server_default="open"))


def downgrade() -> None:
    with op.batch_alter_table("vms") as batch:
        batch.drop_column("egress")
