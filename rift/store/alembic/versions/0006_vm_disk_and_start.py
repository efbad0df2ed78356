"""VMs remember the size of their copy-on-write disk (`disk_gib`; rows made before
it had the 10 GiB that was then every overlay's size) and how they started:
`start_kind` (`boot`, later `pool`, `restore`, `fork`) and `start_ms`, the
milliseconds from the call to running (both null until a VM runs). A VM that ran
before this revision was cold-booted: it gets `boot` and the time from its row's
creation to `ready_at`.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("vms") as batch:
        batch.add_column(sa.Column("disk_gib", sa.Integer(), nullable=False,
                                   server_default="10"))
        batch.add_column(sa.Column("start_kind", sa.String(), nullable=True))
        batch.add_column(sa.Column("start_ms", sa.Integer(), nullable=True))
    # UtcDateTime as stored, frozen here: timestamptz, or an ISO string on SQLite.
    kind = sa.DateTime(timezone=True).with_variant(sa.String(32), "sqlite")
    vms = sa.table("vms", sa.column("id", sa.String()), sa.column("created_at", kind),
                   sa.column("ready_at", kind), sa.column("start_kind", sa.String()),
                   sa.column("start_ms", sa.Integer()))
    bind = op.get_bind()
    ran = bind.execute(sa.select(vms.c.id, vms.c.created_at, vms.c.ready_at)
                       .where(vms.c.ready_at.is_not(None))).all()
    for vm_id, created_at, ready_at in ran:
        ms = max(0, round((_at(ready_at) - _at(created_at)).total_seconds() * 1000))
        bind.execute(sa.update(vms).where(vms.c.id == vm_id)
                     .values(start_kind="boot", start_ms=ms))


def _at(value: Any) -> datetime:
    return datetime.fromisoformat(value) if isinstance(value, str) else value


def downgrade() -> None:
    with op.batch_alter_table("vms") as batch:
        batch.drop_column("start_ms")
        batch.drop_column("start_kind")
        batch.drop_column("disk_gib")
