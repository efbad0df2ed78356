"""Pools on a real server, for the e2e modules: set one and wait until it holds a
ready VM."""

from __future__ import annotations

import json

from tests.support.servers import Server, wait_until

FILL_S = 300  # a boot or a restore on a busy 2-core machine under TCG


def fill_pool(srv: Server, image: str, limit_s: float = FILL_S) -> None:
    """`rift pool set IMAGE --running 1`, then wait until its VM is ready."""
    made = srv.rift("pool", "set", image, "--running", "1")
    assert made.returncode == 0, made.stderr
    wait_until(lambda: any(row["image"] == image and row["running"]["ready"] == 1
                           for row in json.loads(srv.rift("pool", "list", "--json").stdout)),
               limit_s, f"the pool of {image} is filled", every_s=1)
