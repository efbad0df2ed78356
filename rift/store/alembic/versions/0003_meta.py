"""Facts about the installation: its id (so reconciliation touches only its own
domains on a shared libvirt host) and the heartbeat of the control plane.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import base64
import secrets

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    meta = op.create_table(
        "meta",
        sa.Column("key", sa.String(), nullable=False),
        sa.Column("value", sa.String(), nullable=False),
        sa.PrimaryKeyConstraint("key"),
    )
    install = "rift_" + base64.b32encode(secrets.token_bytes(10)).decode().lower()
    op.bulk_insert(meta, [{"key": "install_id", "value": install}])


def downgrade() -> None:
    op.drop_table("meta")
