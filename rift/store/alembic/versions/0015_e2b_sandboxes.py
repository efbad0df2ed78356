"""E2B sandboxes (SPEC §16): the E2B door's settings of a VM (template, metadata,
envVars, its end, whether it is secured and reached in public, the traffic
token's digest, what its end does), so a restart or another replica knows them.
Never the envdAccessToken (the task's handle).

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # UtcDateTime as stored, frozen here: timestamptz, or an ISO string on SQLite.
    at = sa.DateTime(timezone=True).with_variant(sa.String(32), "sqlite")
    op.create_table(
        "e2b_sandboxes",
        sa.Column("vm_id", sa.String(), nullable=False),
        sa.Column("owner", sa.String(), nullable=False),
        sa.Column("task_id", sa.String(), nullable=False),
        sa.Column("template", sa.String(), nullable=False),
        sa.Column("started_at", at, nullable=False),
        sa.Column("end_at", at, nullable=True),
        sa.Column("metadata", sa.JSON(), nullable=False),
        sa.Column("envs", sa.JSON(), nullable=False),
        sa.Column("secure", sa.Boolean(), nullable=False),
        sa.Column("public_traffic", sa.Boolean(), nullable=False),
        sa.Column("traffic_digest", sa.String(), nullable=True),
        sa.Column("on_timeout", sa.String(), nullable=False),
        sa.Column("auto_resume", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("vm_id", name=op.f("pk_e2b_sandboxes")),
    )
    op.create_index("ix_e2b_sandboxes_owner_started_at", "e2b_sandboxes",
                    ["owner", "started_at"])
    op.create_index("ix_e2b_sandboxes_end_at", "e2b_sandboxes", ["end_at"])


def downgrade() -> None:
    op.drop_index("ix_e2b_sandboxes_end_at", table_name="e2b_sandboxes")
    op.drop_index("ix_e2b_sandboxes_owner_started_at", table_name="e2b_sandboxes")
    op.drop_table("e2b_sandboxes")
