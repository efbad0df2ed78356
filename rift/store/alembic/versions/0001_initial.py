"""The first schema: users, tokens, tasks, VMs, events, hosts.

Revision ID: 0001
Revises:
Create Date: 2026-01-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _ts(name: str, *, nullable: bool) -> sa.Column[object]:
    # rift.store.timestamps.UtcDateTime as stored: timestamptz on PostgreSQL,
    # a fixed-width ISO-8601 string on SQLite. Frozen here on purpose.
    kind = sa.DateTime(timezone=True).with_variant(sa.String(32), "sqlite")
    return sa.Column(name, kind, nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "users",
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("password_hash", sa.String(), nullable=True),
        _ts("created_at", nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_users"),
    )
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("user", sa.String(), nullable=False),
        sa.Column("label", sa.String(), nullable=False),
        sa.Column("digest", sa.String(), nullable=False),
        _ts("created_at", nullable=False),
        _ts("revoked_at", nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_api_tokens"),
        sa.ForeignKeyConstraint(["user"], ["users.name"], name="fk_api_tokens_user_users"),
        sa.UniqueConstraint("digest", name="uq_api_tokens_digest"),
    )
    op.create_index("ix_api_tokens_user", "api_tokens", ["user"])

    op.create_table(
        "tasks",
        sa.Column("seq", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("owner", sa.String(), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("lease_gen", sa.Integer(), nullable=False),
        sa.Column("secret_digest", sa.String(), nullable=True),
        sa.Column("holder", sa.String(), nullable=True),
        _ts("held_since", nullable=True),
        _ts("last_activity_at", nullable=False),
        _ts("created_at", nullable=False),
        _ts("closed_at", nullable=True),
        sa.Column("close_reason", sa.String(), nullable=True),
        sa.Column("idempotency_key", sa.String(), nullable=True),
        sa.Column("request_digest", sa.String(), nullable=True),
        sa.PrimaryKeyConstraint("seq", name="pk_tasks"),
        sa.UniqueConstraint("id", name="uq_tasks_id"),
        sqlite_autoincrement=True,
    )
    op.create_index(
        "ux_tasks_owner_idempotency_key", "tasks", ["owner", "idempotency_key"], unique=True
    )
    op.create_index("ix_tasks_status_last_activity_at", "tasks", ["status", "last_activity_at"])
    op.create_index("ix_tasks_status_closed_at", "tasks", ["status", "closed_at"])
    op.create_index("ix_tasks_owner_status_seq", "tasks", ["owner", "status", "seq"])

    op.create_table(
        "vms",
        sa.Column("seq", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("task_id", sa.String(), nullable=False),
        sa.Column("owner", sa.String(), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("image", sa.String(), nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("host", sa.String(), nullable=False),
        sa.Column("vcpus", sa.Integer(), nullable=False),
        sa.Column("memory_mib", sa.Integer(), nullable=False),
        _ts("created_at", nullable=False),
        _ts("ready_at", nullable=True),
        _ts("destroyed_at", nullable=True),
        sa.Column("error", sa.String(), nullable=True),
        sa.Column("ssh_host", sa.String(), nullable=True),
        sa.Column("ssh_port", sa.Integer(), nullable=True),
        sa.Column("idempotency_key", sa.String(), nullable=True),
        sa.Column("request_digest", sa.String(), nullable=True),
        sa.PrimaryKeyConstraint("seq", name="pk_vms"),
        sa.UniqueConstraint("id", name="uq_vms_id"),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"], name="fk_vms_task_id_tasks"),
        sqlite_autoincrement=True,
    )
    op.create_index(
        "ux_vms_owner_idempotency_key", "vms", ["owner", "idempotency_key"], unique=True
    )
    op.create_index("ix_vms_task_id", "vms", ["task_id"])
    op.create_index("ix_vms_status_host", "vms", ["status", "host"])
    op.create_index("ix_vms_owner_created_at", "vms", ["owner", "created_at"])

    op.create_table(
        "events",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("task_id", sa.String(), nullable=False),
        sa.Column("type", sa.String(), nullable=False),
        _ts("at", nullable=False),
        sa.Column("actor", sa.String(), nullable=False),
        sa.Column("details", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_events"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_events_task_id_id", "events", ["task_id", "id"])

    op.create_table(
        "hosts",
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("uri", sa.String(), nullable=False),
        sa.Column("vcpus", sa.Integer(), nullable=False),
        sa.Column("memory_mib", sa.Integer(), nullable=False),
        sa.Column("drained", sa.Boolean(), nullable=False),
        _ts("created_at", nullable=True),
        sa.PrimaryKeyConstraint("name", name="pk_hosts"),
    )


def downgrade() -> None:
    op.drop_table("hosts")
    op.drop_index("ix_events_task_id_id", table_name="events")
    op.drop_table("events")
    for index in ("ix_vms_owner_created_at", "ix_vms_status_host", "ix_vms_task_id",
                  "ux_vms_owner_idempotency_key"):
        op.drop_index(index, table_name="vms")
    op.drop_table("vms")
    for index in ("ix_tasks_owner_status_seq", "ix_tasks_status_closed_at",
                  "ix_tasks_status_last_activity_at", "ux_tasks_owner_idempotency_key"):
        op.drop_index(index, table_name="tasks")
    op.drop_table("tasks")
    op.drop_index("ix_api_tokens_user", table_name="api_tokens")
    op.drop_table("api_tokens")
    op.drop_table("users")
