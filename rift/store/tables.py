"""The schema as SQLAlchemy Core tables. Migrations in ``alembic/`` create
exactly this; a test compares the two."""

from __future__ import annotations

from dataclasses import fields

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    false,
)

from rift.domain.builds import Build, OwnedImage
from rift.domain.code_contexts import CodeContext
from rift.domain.model import Event, Exec, Task, Vm
from rift.domain.pools import Pool, PoolVm
from rift.domain.records import Exposure, Snapshot
from rift.domain.sandboxes import Sandbox
from rift.domain.volumes import Attachment, Volume
from rift.store.timestamps import UtcDateTime

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_N_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)

# Integer keys that stay 64-bit on PostgreSQL but remain SQLite's rowid alias.
BigId = BigInteger().with_variant(Integer(), "sqlite")

users = Table(
    "users",
    metadata,
    Column("name", String, primary_key=True),
    Column("password_hash", String, nullable=True),
    Column("created_at", UtcDateTime, nullable=False),
)

api_tokens = Table(
    "api_tokens",
    metadata,
    Column("id", String, primary_key=True),
    Column("user", String, ForeignKey("users.name"), nullable=False, index=True),
    Column("label", String, nullable=False),
    Column("digest", String, nullable=False, unique=True),
    Column("created_at", UtcDateTime, nullable=False),
    Column("revoked_at", UtcDateTime, nullable=True),
    Column("operator", Boolean, nullable=False, server_default=false()),
)

tasks = Table(
    "tasks",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("id", String, nullable=False, unique=True),
    Column("owner", String, nullable=False),
    Column("name", String, nullable=False),
    Column("status", String, nullable=False),
    Column("lease_gen", Integer, nullable=False),
    Column("secret_digest", String, nullable=True),
    Column("holder", String, nullable=True),
    Column("held_since", UtcDateTime, nullable=True),
    Column("last_activity_at", UtcDateTime, nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    Column("closed_at", UtcDateTime, nullable=True),
    Column("close_reason", String, nullable=True),
    Column("idempotency_key", String, nullable=True),
    Column("request_digest", String, nullable=True),
    # When its quiet VMs sleep (migration 0016, SPEC §17).
    Column("sleep_after_s", Integer, nullable=True),
    Column("sleep", String, nullable=False, server_default="idle"),
    # A key is unique per owner; NULL keys are distinct on both databases.
    Index("ux_tasks_owner_idempotency_key", "owner", "idempotency_key", unique=True),
    # The idle sweep: an O(due) range scan over open tasks by last activity.
    Index("ix_tasks_status_last_activity_at", "status", "last_activity_at"),
    # The retention purge: closed tasks by when they closed.
    Index("ix_tasks_status_closed_at", "status", "closed_at"),
    # A user's list, newest first, by status.
    Index("ix_tasks_owner_status_seq", "owner", "status", "seq"),
    # The Boxes page's recently closed tasks (migration 0002).
    Index("ix_tasks_owner_status_closed_at", "owner", "status", "closed_at"),
    sqlite_autoincrement=True,
)

vms = Table(
    "vms",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("id", String, nullable=False, unique=True),
    Column("task_id", String, ForeignKey("tasks.id"), nullable=False),
    Column("owner", String, nullable=False),
    Column("name", String, nullable=False),
    Column("image", String, nullable=False),
    Column("status", String, nullable=False),
    Column("host", String, nullable=False),
    Column("vcpus", Integer, nullable=False),
    Column("memory_mib", Integer, nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    Column("ready_at", UtcDateTime, nullable=True),
    Column("destroyed_at", UtcDateTime, nullable=True),
    Column("error", String, nullable=True),
    Column("ssh_host", String, nullable=True),
    Column("ssh_port", Integer, nullable=True),
    Column("idempotency_key", String, nullable=True),
    Column("request_digest", String, nullable=True),
    # When a destroy was asked for, before libvirt was (migration 0005).
    Column("destroy_requested_at", UtcDateTime, nullable=True),
    # The overlay's size, and how and how fast the VM started (migration 0006).
    Column("disk_gib", Integer, nullable=False, server_default="10"),
    Column("start_kind", String, nullable=True),
    Column("start_ms", Integer, nullable=True),
    # A pause or resume under way, and since when (migration 0009).
    Column("change", String, nullable=True),
    Column("change_at", UtcDateTime, nullable=True),
    # What its guest may reach (migration 0012).
    Column("egress", String, nullable=False, server_default="open"),
    # What it uses: rift.domain.usage's JSON (migration 0013).
    Column("stats", Text, nullable=True),
    # How long its last wake took (migration 0016, SPEC §17).
    Column("woke_ms", Integer, nullable=True),
    Index("ux_vms_owner_idempotency_key", "owner", "idempotency_key", unique=True),
    Index("ix_vms_task_id", "task_id"),
    Index("ix_vms_status_host", "status", "host"),
    Index("ix_vms_owner_created_at", "owner", "created_at"),
    sqlite_autoincrement=True,
)

events = Table(
    "events",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("task_id", String, nullable=False),
    Column("type", String, nullable=False),
    Column("at", UtcDateTime, nullable=False),
    Column("actor", String, nullable=False),
    Column("details", JSON, nullable=False),
    Index("ix_events_task_id_id", "task_id", "id"),
    sqlite_autoincrement=True,
)

hosts = Table(
    "hosts",
    metadata,
    Column("name", String, primary_key=True),
    Column("uri", String, nullable=False),
    Column("vcpus", Integer, nullable=False),
    Column("memory_mib", Integer, nullable=False),
    Column("drained", Boolean, nullable=False),
    Column("created_at", UtcDateTime, nullable=True),
    Column("unreachable_since", UtcDateTime, nullable=True),
    Column("last_error", String, nullable=True),
)

# Boxes page logins (migration 0002): only the SHA-256 digest of a session id.
web_sessions = Table(
    "web_sessions",
    metadata,
    Column("digest", String, primary_key=True),
    Column("user", String, ForeignKey("users.name"), nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    Column("expires_at", UtcDateTime, nullable=False),
    Index("ix_web_sessions_expires_at", "expires_at"),
)

# Failed logins per key, so that every replica slows the same guesser down.
login_failures = Table(
    "login_failures",
    metadata,
    Column("key", String, primary_key=True),
    Column("failures", Integer, nullable=False),
    Column("last_failed_at", UtcDateTime, nullable=False),
    Index("ix_login_failures_last_failed_at", "last_failed_at"),
)

# The value columns of each table in the order of its domain dataclass's fields
# (the ``seq`` ordering keys stay inside the store): a row selected with them
# builds the value positionally, ``Task(*row)``.
TASK_COLUMNS = tuple(tasks.c[f.name] for f in fields(Task))
VM_COLUMNS = tuple(vms.c[f.name] for f in fields(Vm))
EVENT_COLUMNS = tuple(events.c[f.name] for f in fields(Event))


meta = Table(
    "meta",
    metadata,
    Column("key", String, primary_key=True),
    Column("value", String, nullable=False),
)

# Pools of ready VMs (migration 0007): what the operator asked for, and the VMs.
pools = Table(
    "pools",
    metadata,
    Column("id", String, primary_key=True),
    Column("image", String, nullable=False),
    Column("host", String, nullable=True),
    Column("vcpus", Integer, nullable=False),
    Column("memory_mib", Integer, nullable=False),
    Column("running", Integer, nullable=False),
    Column("saved", Integer, nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    Column("failures", Integer, nullable=False),
    Column("retry_at", UtcDateTime, nullable=True),
    Column("last_error", String, nullable=True),
    Column("filler", String, nullable=True),
    Column("fill_until", UtcDateTime, nullable=True),
    Index("ux_pools_image_host_vcpus_memory_mib", "image", "host", "vcpus", "memory_mib",
          unique=True),
)

pool_vms = Table(
    "pool_vms",
    metadata,
    Column("id", String, primary_key=True),
    Column("pool_id", String, ForeignKey("pools.id"), nullable=False),
    Column("goal", String, nullable=False),
    Column("state", String, nullable=False),
    Column("host", String, nullable=False),
    Column("image", String, nullable=False),
    Column("vcpus", Integer, nullable=False),
    Column("memory_mib", Integer, nullable=False),
    Column("key_id", String, nullable=False),
    Column("mark", String, nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    Column("ssh_port", Integer, nullable=True),
    Column("host_key", String, nullable=True),
    Column("ready_at", UtcDateTime, nullable=True),
    # A hand-out's lookup: ready VMs of an image and size.
    Index("ix_pool_vms_image_state", "image", "state"),
    Index("ix_pool_vms_pool_id", "pool_id"),
)

# Snapshots (migration 0010): a VM's memory and disk kept on its host for forks.
snapshots = Table(
    "snapshots",
    metadata,
    Column("id", String, primary_key=True),
    Column("task_id", String, ForeignKey("tasks.id"), nullable=False),
    Column("vm_id", String, nullable=False),
    Column("owner", String, nullable=False),
    Column("name", String, nullable=False),
    Column("host", String, nullable=False),
    Column("image", String, nullable=False),
    Column("vcpus", Integer, nullable=False),
    Column("memory_mib", Integer, nullable=False),
    Column("disk_gib", Integer, nullable=False),
    Column("state", String, nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    Column("bytes", BigInteger, nullable=False),
    Column("host_key", String, nullable=True),
    Index("ix_snapshots_task_id", "task_id"),
)

# Execs (migration 0008): commands run detached in guests; their output stays there.
execs = Table(
    "execs",
    metadata,
    Column("id", String, primary_key=True),
    Column("task_id", String, ForeignKey("tasks.id"), nullable=False),
    Column("vm_id", String, ForeignKey("vms.id"), nullable=False),
    Column("owner", String, nullable=False),
    Column("command", Text, nullable=False),
    Column("status", String, nullable=False),
    Column("timeout_s", Integer, nullable=False),
    Column("started_at", UtcDateTime, nullable=False),
    Column("ended_at", UtcDateTime, nullable=True),
    Column("exit_code", Integer, nullable=True),
    Column("signal", String, nullable=True),
    Column("timed_out", Boolean, nullable=False),
    Column("stdout_bytes", BigInteger, nullable=False),
    Column("stderr_bytes", BigInteger, nullable=False),
    Column("duration_ms", BigInteger, nullable=True),
    Index("ix_execs_task_id_started_at", "task_id", "started_at"),
    Index("ix_execs_status_started_at", "status", "started_at"),
)

# Exposures (migration 0011): guest ports reached through Rift, by their secret's digest.
exposures = Table(
    "exposures",
    metadata,
    Column("id", String, primary_key=True),
    Column("vm_id", String, ForeignKey("vms.id"), nullable=False),
    Column("task_id", String, ForeignKey("tasks.id"), nullable=False),
    Column("owner", String, nullable=False),
    Column("port", Integer, nullable=False),
    Column("digest", String, nullable=False, unique=True),
    Column("created_at", UtcDateTime, nullable=False),
    Index("ux_exposures_vm_id_port", "vm_id", "port", unique=True),
    Index("ix_exposures_task_id", "task_id"),
)

POOL_COLUMNS = tuple(pools.c[f.name] for f in fields(Pool))
POOL_VM_COLUMNS = tuple(pool_vms.c[f.name] for f in fields(PoolVm))
EXEC_COLUMNS = tuple(execs.c[f.name] for f in fields(Exec))
SNAPSHOT_COLUMNS = tuple(snapshots.c[f.name] for f in fields(Snapshot))
EXPOSURE_COLUMNS = tuple(exposures.c[f.name] for f in fields(Exposure))

# E2B sandboxes (migration 0015): the door's settings of a VM, by its id; no
# foreign key, so a purged VM's row waits for its end (rift.e2b.deadlines drops it).
e2b_sandboxes = Table(
    "e2b_sandboxes",
    metadata,
    Column("vm_id", String, primary_key=True),
    Column("owner", String, nullable=False),
    Column("task_id", String, nullable=False),
    Column("template", String, nullable=False),
    Column("started_at", UtcDateTime, nullable=False),
    Column("end_at", UtcDateTime, nullable=True),
    Column("metadata", JSON, nullable=False),
    Column("envs", JSON, nullable=False),
    Column("secure", Boolean, nullable=False),
    Column("public_traffic", Boolean, nullable=False),
    Column("traffic_digest", String, nullable=True),
    Column("on_timeout", String, nullable=False),
    Column("auto_resume", Boolean, nullable=False),
    Index("ix_e2b_sandboxes_owner_started_at", "owner", "started_at"),
    Index("ix_e2b_sandboxes_end_at", "end_at"),
)
E2B_SANDBOX_COLUMNS = tuple(e2b_sandboxes.c[f.name] for f in fields(Sandbox))

# Volumes (migration 0017, SPEC §18): a user's disks, outliving tasks, and which VM
# each is attached to. No foreign key from an attachment to its VM's task: the
# attachment goes in the transaction that ends its VM.
volumes = Table(
    "volumes",
    metadata,
    Column("id", String, primary_key=True),
    Column("owner", String, nullable=False),
    Column("name", String, nullable=False),
    Column("size_gib", Integer, nullable=False),
    Column("host", String, nullable=False),
    Column("state", String, nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    Column("parent_id", String, nullable=True),
    Column("used_bytes", BigInteger, nullable=True),  # migration 0018
    Index("ux_volumes_owner_name", "owner", "name", unique=True),
)
volume_attachments = Table(
    "volume_attachments",
    metadata,
    Column("volume_id", String, ForeignKey("volumes.id"), primary_key=True),
    Column("vm_id", String, ForeignKey("vms.id"), primary_key=True),
    Column("task_id", String, nullable=False),
    Column("path", String, nullable=False),
    Column("read_only", Boolean, nullable=False),
    Column("target", String, nullable=False),
    Column("state", String, nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    Index("ix_volume_attachments_vm_id", "vm_id"),
)
VOLUME_COLUMNS = tuple(volumes.c[f.name] for f in fields(Volume))
ATTACHMENT_COLUMNS = tuple(volume_attachments.c[f.name] for f in fields(Attachment))

# Builds (migration 0019, SPEC §19): one row per build with its log; the images
# (and hidden layers) builds made, with their owner and whether they are published.
builds = Table(
    "builds",
    metadata,
    Column("id", String, primary_key=True),
    Column("image", String, nullable=False),
    Column("owner", String, nullable=False),
    Column("host", String, nullable=False),
    Column("state", String, nullable=False),
    Column("recipe", Text, nullable=False),
    Column("no_cache", Boolean, nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    Column("ended_at", UtcDateTime, nullable=True),
    Column("log", Text, nullable=False),
    Column("error", Text, nullable=True),
    Column("steps", Integer, nullable=False),
    Column("cached", Integer, nullable=False),
    Index("ix_builds_owner_created_at", "owner", "created_at"),
    Index("ix_builds_state", "state"),
)
owned_images = Table(
    "owned_images",
    metadata,
    Column("name", String, primary_key=True),
    Column("owner", String, nullable=False),
    Column("kind", String, nullable=False),
    Column("published", Boolean, nullable=False),
    Column("build_id", String, nullable=True),
    Column("layer_key", String, nullable=True),
    Column("created_at", UtcDateTime, nullable=False),
)
BUILD_COLUMNS = tuple(builds.c[f.name] for f in fields(Build))
OWNED_IMAGE_COLUMNS = tuple(owned_images.c[f.name] for f in fields(OwnedImage))

# Code contexts (migration 0020, SPEC §20): a VM's kernels as the engine last knew
# them (language, last run, a run in flight); the rows go in the transaction that
# ends their VM, and with their task's tombstone.
code_contexts = Table(
    "code_contexts",
    metadata,
    Column("vm_id", String, ForeignKey("vms.id"), primary_key=True),
    Column("id", String, primary_key=True),
    Column("task_id", String, nullable=False),
    Column("language", String, nullable=False),
    Column("cwd", Text, nullable=True),
    Column("created_at", UtcDateTime, nullable=False),
    Column("last_run_at", UtcDateTime, nullable=True),
    Column("execution_count", Integer, nullable=True),
    Column("last_status", String, nullable=True),
    Column("run_id", String, nullable=True),
    Column("run_until", UtcDateTime, nullable=True),
    Index("ix_code_contexts_task_id", "task_id"),
)
CODE_CONTEXT_COLUMNS = tuple(code_contexts.c[f.name] for f in fields(CodeContext))
