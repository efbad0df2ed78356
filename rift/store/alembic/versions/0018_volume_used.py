"""A volume's used bytes (SPEC §18): what its file, and the frozen parents it
reads, take on its host, as last sampled (the Boxes page shows it).

Revision ID: 0018
Revises: 0017
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("volumes") as batch:
        batch.add_column(sa.Column("used_bytes", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("volumes") as batch:
        batch.drop_column("used_bytes")
