"""E2B's own SDK (`e2b`, pinned in pyproject's dev extras) pointed at a `rift serve`:
the two settings of SPEC §16 (`E2B_API_URL=E2B_SANDBOX_URL=<rift>/e2b`,
`E2B_API_KEY=<a Rift token>`), passed per call rather than through the
environment, so tests in one process can talk to several servers as several users."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.support.servers import Server, cached_tiny, start_server, stop_server


def e2b_opts(url: str, token: str) -> dict[str, Any]:
    """The SDK's connection options for `rift serve` at `url` as the token's user."""
    return {"api_url": url + "/e2b", "sandbox_url": url + "/e2b", "api_key": token,
            "request_timeout": 120}


def own_tiny(data_dir: Path) -> Path:
    """Give a data dir a copy of the cached `tiny` (not a link): libvirt's DAC driver
    refuses a kernel file another domain, started under other QEMU user settings,
    still holds; a copy is this server's alone."""
    images = data_dir / "images"
    images.mkdir(parents=True, exist_ok=True)
    target = images / "tiny"
    if not target.exists():
        shutil.copytree(cached_tiny(), target)
    return images


@dataclass
class Door:
    """A `rift serve` on libvirt's test driver and the SDK's options for it, with
    Rift's own REST views of what a sandbox is underneath."""

    srv: Server
    opts: dict[str, Any]

    def rest(self, path: str) -> dict[str, Any]:
        answer = httpx.get(f"{self.srv.url}/api/v1/{path}", timeout=30,
                           headers={"Authorization": f"Bearer {self.srv.token}"})
        assert answer.status_code == 200, answer.text
        found: dict[str, Any] = answer.json()
        return found

    def vm(self, sandbox: Any) -> dict[str, Any]:
        """The VM view of a sandbox (the SDK's object, or its id)."""
        sandbox_id = sandbox if isinstance(sandbox, str) else sandbox.sandbox_id
        vm: dict[str, Any] = self.rest(f"vms/vm_{sandbox_id}")["vm"]
        return vm

    def task(self, sandbox: Any) -> dict[str, Any]:
        task: dict[str, Any] = self.rest(f"tasks/{self.vm(sandbox)['task_id']}")["task"]
        return task


@contextmanager
def door(tmp: Path, **env: str) -> Iterator[Door]:
    """A door served from a fresh data dir in `tmp`, `env` its extra settings."""
    proc, srv = start_server(tmp, **env)
    try:
        yield Door(srv, e2b_opts(srv.url, srv.token))
    finally:
        stop_server(proc)
