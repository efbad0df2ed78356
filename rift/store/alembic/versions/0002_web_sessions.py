"""The Boxes page: login sessions, failed-login counts, recently closed tasks.

Revision ID: 0002
Revises: 0001
Create Date: 2026-01-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _ts(name: str, *, nullable: bool) -> sa.Column[object]:
    # rift.store.timestamps.UtcDateTime as stored, frozen here as in 0001.
    kind = sa.DateTime(timezone=True).with_variant(sa.String(32), "sqlite")
    return sa.Column(name, kind, nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "web_sessions",
        sa.Column("digest", sa.String(), nullable=False),
        sa.Column("user", sa.String(), nullable=False),
        _ts("created_at", nullable=False),
        _ts("expires_at", nullable=False),
        sa.PrimaryKeyConstraint("digest", name="pk_web_sessions"),
        sa.ForeignKeyConstraint(["user"], ["users.name"], name="fk_web_sessions_user_users"),
    )
    op.create_index("ix_web_sessions_expires_at", "web_sessions", ["expires_at"])
    op.create_table(
        "login_failures",
        sa.Column("key", sa.String(), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        _ts("last_failed_at", nullable=False),
        sa.PrimaryKeyConstraint("key", name="pk_login_failures"),
    )
    op.create_index("ix_login_failures_last_failed_at", "login_failures", ["last_failed_at"])
    op.create_index("ix_tasks_owner_status_closed_at", "tasks",
                    ["owner", "status", "closed_at"])


def downgrade() -> None:
    op.drop_index("ix_tasks_owner_status_closed_at", table_name="tasks")
    op.drop_index("ix_login_failures_last_failed_at", table_name="login_failures")
    op.drop_table("login_failures")
    op.drop_index("ix_web_sessions_expires_at", table_name="web_sessions")
    op.drop_table("web_sessions")
