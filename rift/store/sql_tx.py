"""The SQL unit of work: one transaction on one connection, and the repositories
that reach its rows (``tx.tasks``, ``tx.vms``, …), one module each."""

from __future__ import annotations

from sqlalchemy.engine import Connection

from rift.store.sql_accounts import SqlTokens, SqlUsers
from rift.store.sql_builds import SqlBuilds, SqlOwnedImages
from rift.store.sql_code_contexts import SqlCodeContexts
from rift.store.sql_events import SqlEvents
from rift.store.sql_execs import SqlExecs
from rift.store.sql_exposures import SqlExposures
from rift.store.sql_fleet import SqlFleet
from rift.store.sql_hosts import SqlHosts
from rift.store.sql_meta import SqlMeta
from rift.store.sql_pool_vms import SqlPoolVms
from rift.store.sql_pools import SqlPools
from rift.store.sql_rates import SqlRates
from rift.store.sql_sandboxes import SqlSandboxes
from rift.store.sql_snapshots import SqlSnapshots
from rift.store.sql_tasks import SqlTasks
from rift.store.sql_vms import SqlVms
from rift.store.sql_volumes import SqlVolumes
from rift.store.sql_web import SqlWeb


class SqlTx:
    """Implements the engine's ``Tx`` port over one SQLAlchemy connection;
    ``writable`` is False inside ``store.read()``."""

    __slots__ = ("builds", "code_contexts", "events", "execs", "exposures", "fleet", "hosts",
                 "meta", "owned_images", "pool_vms", "pools", "rates", "sandboxes", "snapshots",
                 "tasks", "tokens", "users", "vms", "volumes", "web")

    def __init__(self, conn: Connection, *, writable: bool) -> None:
        self.tasks = SqlTasks(conn, writable=writable)
        self.vms = SqlVms(conn, writable=writable)
        self.fleet = SqlFleet(conn, writable=writable)
        self.events = SqlEvents(conn, writable=writable)
        self.rates = SqlRates(conn, writable=writable)
        self.users = SqlUsers(conn, writable=writable)
        self.tokens = SqlTokens(conn, writable=writable)
        self.hosts = SqlHosts(conn, writable=writable)
        self.meta = SqlMeta(conn, writable=writable)
        self.web = SqlWeb(conn, writable=writable)
        self.pools = SqlPools(conn, writable=writable)
        self.pool_vms = SqlPoolVms(conn, writable=writable)
        self.execs = SqlExecs(conn, writable=writable)
        self.snapshots = SqlSnapshots(conn, writable=writable)
        self.exposures = SqlExposures(conn, writable=writable)
        self.sandboxes = SqlSandboxes(conn, writable=writable)
        self.volumes = SqlVolumes(conn, writable=writable)
        self.builds = SqlBuilds(conn, writable=writable)
        self.owned_images = SqlOwnedImages(conn, writable=writable)
        self.code_contexts = SqlCodeContexts(conn, writable=writable)
