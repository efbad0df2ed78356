"""The e2e suite's fixture: one real `rift serve` per module, on libvirt's test
driver (its helpers are tests/support/servers.py and tests/support/witnesses.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.servers import Server, start_server, stop_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    proc, srv = start_server(tmp_path_factory.mktemp("rift"))
    try:
        yield srv
    finally:
        stop_server(proc)
