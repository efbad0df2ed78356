"""No handle secret or token is ever written to the database file or the logs."""

from __future__ import annotations

import io
import logging
from pathlib import Path

from hypervisor import write_test_host_xml
from rift.bootstrap import build_deps, close_deps, ensure_admin
from rift.config import Settings
from rift.contract import tools as c
from rift.contract.base import command
from rift.domain.errors import RiftError
from rift.logs import setup_logging
from rift.services.access import accounts
from rift.services.context import Caller
from rift.services.lifecycle import leases, tasks, vms


def test_no_secret_appears_in_the_database_files_or_the_logs(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    uri = write_test_host_xml(str(tmp_path / "node.xml"), 16, 8192)
    deps = build_deps(Settings(data_dir=data_dir, hypervisor_uri=uri, log_level="DEBUG"))
    log = io.StringIO()
    setup_logging("DEBUG", log)
    secrets: list[str] = []
    try:
        first = ensure_admin(deps)
        assert first is not None
        secrets += [first.password, first.token]
        made = accounts.new_token(deps, "admin", "agent")
        secrets.append(made.token.value)
        _, caller = accounts.authenticate(deps, made.token.value)
        other = Caller("admin", "mcp:other")
        for _ in range(5):
            opened = tasks.new(deps, caller, command(c.TaskNewIn, name="secret keeping"))
            secrets.append(leases.parse_handle(opened.handle).secret)
            vms.new(deps, caller, command(c.VmNewIn, handle=str(opened.handle)))
            won = leases.attach(deps, other, command(c.TaskAttachIn, task_id=opened.task.id,
                      takeover=True))
            secrets.append(leases.parse_handle(won.handle).secret)
            try:  # a stale handle is logged as an event: with the holder, never the secret
                tasks.get(deps, caller, command(c.TaskGetIn, handle=str(opened.handle)))
            except RiftError as exc:
                assert exc.code == "lease_stale"
            leases.release(deps, other, command(c.TaskReleaseIn, handle=str(won.handle)))
        logging.getLogger("rift").info("a line that names a handle by mistake",
                                       extra={"handle": str(won.handle)})
    finally:
        close_deps(deps)
    files = [p for p in data_dir.rglob("*") if p.is_file()]
    assert any(p.name == "rift.db" for p in files)
    blobs = [p.read_bytes() for p in files] + [log.getvalue().encode()]
    assert "task opened" in log.getvalue()
    for secret in secrets:
        for blob in blobs:
            assert secret.encode() not in blob
