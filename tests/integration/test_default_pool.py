"""`RIFT_DEFAULT_POOL` (SPEC §17): `rift serve` makes the pool it names when its image
has none, says so, and leaves a pool an operator set as it is across restarts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.support.servers import Server, restart_server, start_server, stop_server


def _pools(server: Server) -> list[tuple[str, int, int]]:
    """(image, running wanted, saved wanted) of each pool."""
    listed = server.rift("pool", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows: list[dict[str, Any]] = json.loads(listed.stdout)
    return [(r["image"], r["running"]["want"], r["saved"]["want"]) for r in rows]


def test_serve_makes_the_default_pool_once_and_keeps_an_operators_size(
        tmp_path: Path) -> None:
    proc, server = start_server(tmp_path, RIFT_DEFAULT_POOL="tiny:1:0")
    try:
        assert _pools(server) == [("tiny", 1, 0)]
        resized = server.rift("pool", "set", "tiny", "--running", "2")
        assert resized.returncode == 0, resized.stderr
    finally:
        stop_server(proc)
    proc, server = restart_server(server)
    try:
        assert _pools(server) == [("tiny", 2, 0)]
    finally:
        stop_server(proc)


def test_a_default_pool_of_an_image_not_built_is_said_and_the_server_starts(
        tmp_path: Path) -> None:
    proc, server = start_server(tmp_path, RIFT_DEFAULT_POOL="nosuchimage:1:2")
    try:
        assert _pools(server) == []
    finally:
        stop_server(proc)
    assert "RIFT_DEFAULT_POOL: no pool of nosuchimage" in server.log.read_text()
