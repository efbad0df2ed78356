"""Forks, snapshots and network rules through the E2B door on real `tiny` guests (SPEC
§12, §13, §16), driven by E2B's own SDK: each fork of a sandbox is a sandbox of its
own task whose guest has its source's files, runs commands (its guest was handed
over to its own task's key) and changes nothing of its source's; a sandbox made
from a snapshot after its source was killed has the files the snapshot kept; an
allowlisted sandbox's commands are told Rift's egress proxy. No traffic leaves the
guests. The door's answers and refusals: tests/e2e/test_e2b_snapshots.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from e2b import Sandbox, SandboxNetworkOpts

from tests.support.e2b import e2b_opts, own_tiny
from tests.support.real_guests import RealSettings, Rig
from tests.support.servers import Server, real_vms_missing

pytestmark = [
    pytest.mark.skipif(real_vms_missing() is not None, reason=real_vms_missing() or ""),
    pytest.mark.slow,
]

REAL = RealSettings(env={"RIFT_DEFAULT_IMAGE": "tiny", "RIFT_VM_BOOT_TIMEOUT_S": "120"},
                    prepare=own_tiny)
STATE = "/root/state.txt"


@pytest.fixture(scope="module")
def srv(rig: Rig) -> Iterator[Server]:
    yield rig.server


def test_forks_have_their_sources_files_run_commands_and_change_nothing_of_it(
        srv: Server) -> None:
    opts = e2b_opts(srv.url, srv.token)
    sbx = Sandbox.create(timeout=300, **opts)
    made: list[Sandbox] = []
    try:
        sbx.files.write(STATE, "before the fork")
        forks = sbx.fork(count=2, timeout=120)
        made = [f for f in forks if isinstance(f, Sandbox)]
        assert len(made) == 2, forks
        for n, fork in enumerate(made):
            assert fork.files.read(STATE) == "before the fork"
            assert fork.commands.run(f"echo fork {n} > {STATE}; cat {STATE}").stdout == \
                f"fork {n}\n"
        assert sbx.files.read(STATE) == "before the fork" and sbx.is_running()
        assert made[0].files.read(STATE) == "fork 0\n"  # and not each other's
    finally:
        for fork in made:
            fork.kill()
        sbx.kill()


def test_a_snapshot_outlives_its_sandbox_and_starts_sandboxes_with_its_files(
        srv: Server) -> None:
    opts = e2b_opts(srv.url, srv.token)
    sbx = Sandbox.create(**opts)
    sbx.files.write(STATE, "kept by the snapshot")
    snap = sbx.create_snapshot(name="kept")
    sbx.kill()
    again = Sandbox.create(snap.snapshot_id, **opts)
    try:
        assert again.files.read(STATE) == "kept by the snapshot"
        assert again.commands.run("echo ran").stdout == "ran\n"
    finally:
        again.kill()
        assert Sandbox.delete_snapshot(snap.snapshot_id, **opts) is True


def test_an_allowlisted_sandbox_is_told_the_egress_proxy_and_a_closed_one_is_not(
        srv: Server) -> None:
    opts = e2b_opts(srv.url, srv.token)
    listed = Sandbox.create(network=SandboxNetworkOpts(
        deny_out=lambda ctx: [ctx.all_traffic], allow_out=["10.213.9.2"]), **opts)
    closed = Sandbox.create(allow_internet_access=False, **opts)
    try:
        assert listed.commands.run("echo $https_proxy").stdout.startswith("http://10.0.2.2:")
        assert closed.commands.run("echo proxy=$https_proxy").stdout == "proxy=\n"
    finally:
        listed.kill()
        closed.kill()
