"""Builds and the images they make (SPEC §19): a build's record and its log, and
who owns each image (or hidden layer) a build made, and whether it is published.

Revision ID: 0019
Revises: 0018
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # UtcDateTime as stored, frozen here: timestamptz, or an ISO string on SQLite.
    at = sa.DateTime(timezone=True).with_variant(sa.String(32), "sqlite")
    op.create_table(
        "builds",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("image", sa.String(), nullable=False),
        sa.Column("owner", sa.String(), nullable=False),
        sa.Column("host", sa.String(), nullable=False),
        sa.Column("state", sa.String(), nullable=False),
        sa.Column("recipe", sa.Text(), nullable=False),
        sa.Column("no_cache", sa.Boolean(), nullable=False),
        sa.Column("created_at", at, nullable=False),
        sa.Column("ended_at", at, nullable=True),
        sa.Column("log", sa.Text(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.Column("cached", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_builds_owner_created_at", "builds", ["owner", "created_at"])
    op.create_index("ix_builds_state", "builds", ["state"])
    op.create_table(
        "owned_images",
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("owner", sa.String(), nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("published", sa.Boolean(), nullable=False),
        sa.Column("build_id", sa.String(), nullable=True),
        sa.Column("layer_key", sa.String(), nullable=True),
        sa.Column("created_at", at, nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )


def downgrade() -> None:
    op.drop_table("owned_images")
    op.drop_index("ix_builds_state", table_name="builds")
    op.drop_index("ix_builds_owner_created_at", table_name="builds")
    op.drop_table("builds")
