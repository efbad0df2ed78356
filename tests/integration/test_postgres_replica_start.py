"""Replicas starting together on one fresh PostgreSQL database: what every
`rift serve` does after migrating and before it takes calls (the `local` host,
the first admin, the heartbeat), run by two "replicas" (two stores, two threads) released
at the same instant, round after round. Each step must have one winner and no
failure: a replica that loses a start-up race must still come up.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from rift.bootstrap import ensure_admin
from rift.catalog import StaticImages
from rift.domain.clock import SystemClock
from rift.services.background.heartbeat import HEARTBEAT, beat, resume
from rift.services.context import Deps
from rift.services.operator.hosts import ensure_local_host
from rift.store.migrate import upgrade
from rift.store.sql import SqlStore
from tests.support.databases import skip_without_postgres, wipe
from tests.support.engine import FakePool

ROUNDS = 5


def two_at_once(step: Callable[[Deps], Any], replicas: list[Deps]) -> list[Any]:
    """Run ``step`` on every replica at the same instant; answers each one's result."""
    barrier = threading.Barrier(len(replicas))

    def go(deps: Deps) -> Any:
        barrier.wait()
        return step(deps)

    with ThreadPoolExecutor(len(replicas)) as pool:
        return list(pool.map(go, replicas))


@pytest.fixture
def pg_url() -> str:
    return skip_without_postgres()


def replicas_on(url: str, n: int = 2) -> list[Deps]:
    return [Deps(store=SqlStore(url, pool_size=2), clock=SystemClock(), hosts=FakePool(),
                 images=StaticImages(["tiny"])) for _ in range(n)]


def test_replicas_starting_together_each_come_up_with_one_winner_per_step(pg_url: str) -> None:
    for _ in range(ROUNDS):
        wipe(pg_url)
        upgrade(pg_url)  # Alembic's context is process-global: two at once is the e2e test's
        replicas = replicas_on(pg_url)
        try:
            hosts = two_at_once(
                lambda deps: ensure_local_host(deps, "fake:///local", 8, 4096), replicas)
            assert {(h.name, h.uri) for h in hosts} == {("local", "fake:///local")}
            admins = two_at_once(ensure_admin, replicas)
            assert sum(a is not None for a in admins) == 1, admins
            shifted = two_at_once(lambda deps: resume(deps, 60), replicas)
            assert shifted == [0.0, 0.0]
            two_at_once(beat, replicas)
            with replicas[0].store.read() as tx:
                assert [h.name for h in tx.hosts.all()] == ["local"]
                assert [u.name for u in tx.users.all()] == ["admin"]
                assert tx.meta.get(HEARTBEAT) is not None
        finally:
            for deps in replicas:
                deps.store.close()
