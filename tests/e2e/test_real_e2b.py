"""The E2B door on a real guest (SPEC §16), driven by E2B's own SDK (`e2b`, sync
client) with only its two settings pointed at `rift serve`: a sandbox of `tiny`
(busybox sh) runs commands (output, exit codes, envs, cwd), runs a shell on a
PTY (fed, resized, reconnected, killed; a size out of bounds refused), writes and
reads files, is a Rift task held by `e2b:<token label>` with one VM, and a takeover of
that task through REST ends the SDK's lease with an answer naming the new holder.
One server and one sandbox for the module."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from e2b import (
    AsyncSandbox,
    AuthenticationException,
    CommandExitException,
    FileNotFoundException,
    InvalidArgumentException,
    Sandbox,
    SandboxException,
    SandboxQuery,
    Template,
    wait_for_file,
)
from e2b.exceptions import NotFoundException
from e2b.sandbox.commands.command_handle import PtySize

from tests.support.e2b import e2b_opts, own_tiny
from tests.support.real_guests import RealSettings, Rig
from tests.support.servers import Server, real_vms_missing
from tests.support.witnesses import our_domains

pytestmark = [
    pytest.mark.skipif(real_vms_missing() is not None, reason=real_vms_missing() or ""),
    pytest.mark.slow,
]


@dataclass
class World:
    srv: Server
    sbx: Sandbox
    opts: dict[str, object]


REAL = RealSettings(env={"RIFT_DEFAULT_IMAGE": "tiny", "RIFT_VM_BOOT_TIMEOUT_S": "120",
                         "RIFT_STATS_INTERVAL_S": "1"}, prepare=own_tiny)


@pytest.fixture(scope="module")
def world(rig: Rig) -> Iterator[World]:
    srv = rig.server
    opts = e2b_opts(srv.url, srv.token)
    sbx = Sandbox.create(envs={"GREETING": "hello"}, metadata={"suite": "real"},
                         **opts)  # type: ignore[arg-type]
    try:
        yield World(srv, sbx, opts)
    finally:  # by id, through the server running now (a test restarts it)
        Sandbox.kill(sbx.sandbox_id, **e2b_opts(rig.server.url, rig.server.token))


def test_commands_run_in_the_sandbox_with_their_output_envs_and_cwd(world: World) -> None:
    ran = world.sbx.commands.run("echo hi")
    assert (ran.stdout, ran.stderr, ran.exit_code) == ("hi\n", "", 0)
    both = world.sbx.commands.run("echo $GREETING $LOCAL; echo oops >&2; pwd",
                                  envs={"LOCAL": "there"}, cwd="/tmp")
    assert (both.stdout, both.stderr) == ("hello there\n/tmp\n", "oops\n")
    heard: list[str] = []
    world.sbx.commands.run("for i in 1 2 3; do echo $i; sleep 0.2; done", on_stdout=heard.append)
    assert "".join(heard) == "1\n2\n3\n"


def test_the_async_client_works_the_same(world: World) -> None:
    async def tour() -> None:
        sbx = await AsyncSandbox.create(**world.opts)  # type: ignore[arg-type]
        try:
            ran = await sbx.commands.run("echo async; exit 0")
            assert (ran.stdout, ran.exit_code) == ("async\n", 0)
            await sbx.files.write("/tmp/async.txt", "a")
            assert await sbx.files.read("/tmp/async.txt") == "a"
            assert [e.name for e in await sbx.files.list("/tmp") if e.name == "async.txt"]
        finally:
            assert await sbx.kill()

    asyncio.run(tour())


def test_a_failing_command_raises_with_its_exit_code(world: World) -> None:
    with pytest.raises(CommandExitException) as failed:
        world.sbx.commands.run("echo no >&2; exit 3")
    assert (failed.value.exit_code, failed.value.stderr) == (3, "no\n")


def test_background_commands_are_listed_fed_reconnected_and_killed(world: World) -> None:
    sbx = world.sbx
    sleeper = sbx.commands.run("sleep 60", background=True)
    fed = sbx.commands.run("read a; echo got $a; cat", background=True, stdin=True)
    assert {sleeper.pid, fed.pid} <= {p.pid for p in sbx.commands.list()}
    sbx.commands.send_stdin(fed.pid, "one\n")
    again = sbx.commands.connect(fed.pid)  # a second stream on the same process
    sbx.commands.send_stdin(fed.pid, "two\n")
    sbx.commands.close_stdin(fed.pid)
    assert fed.wait().stdout == "got one\ntwo\n"
    assert "two\n" in again.wait().stdout
    assert sbx.commands.kill(sleeper.pid)
    with pytest.raises(CommandExitException) as killed:
        sleeper.wait()
    assert killed.value.exit_code == -1
    assert sleeper.pid not in {p.pid for p in sbx.commands.list()}
    assert not sbx.commands.kill(sleeper.pid)  # no longer running: not found


def test_a_pty_runs_a_shell_that_is_fed_resized_reconnected_and_killed(world: World) -> None:
    sbx = world.sbx
    term = sbx.pty.create(PtySize(rows=24, cols=80), envs={"ABC": "123"}, cwd="/tmp")
    sbx.pty.send_stdin(term.pid, b"stty size\n")
    with pytest.raises(InvalidArgumentException):
        sbx.pty.resize(term.pid, PtySize(rows=0, cols=0))
    with pytest.raises(InvalidArgumentException):
        sbx.pty.resize(term.pid, PtySize(rows=24, cols=10_000))
    sbx.pty.resize(term.pid, PtySize(rows=30, cols=100))
    term.disconnect()
    again = sbx.pty.connect(term.pid)
    sbx.pty.send_stdin(term.pid, b"echo $ABC; pwd; stty size; exit 7\n")
    heard: list[bytes] = []
    with pytest.raises(CommandExitException) as ended:
        again.wait(on_pty=heard.append)
    assert again.pid == term.pid and ended.value.exit_code == 7
    lines = b"".join(heard).decode().replace("\r", "").split("\n")
    assert {"123", "/tmp", "30 100"} <= set(lines), lines  # its envs, cwd, size now
    doomed = sbx.pty.create(PtySize(rows=24, cols=80))
    assert doomed.pid in {p.pid for p in sbx.commands.list()}
    assert sbx.pty.kill(doomed.pid)
    with pytest.raises(CommandExitException):
        doomed.wait()
    assert not sbx.pty.kill(doomed.pid)  # gone: not found


def test_files_written_are_read_back(world: World) -> None:
    world.sbx.files.write("/tmp/note.txt", "content\n")
    assert world.sbx.files.read("/tmp/note.txt") == "content\n"
    blob = bytes(range(256)) * 64
    info = world.sbx.files.write("/tmp/deep/er/blob.bin", blob)  # its folders are made
    assert (info.path, info.name) == ("/tmp/deep/er/blob.bin", "blob.bin")
    assert bytes(world.sbx.files.read("/tmp/deep/er/blob.bin", format="bytes")) == blob
    assert world.sbx.commands.run("wc -c < /tmp/deep/er/blob.bin").stdout.strip() == "16384"
    with pytest.raises(FileNotFoundException):
        world.sbx.files.read("/tmp/not-there")
    with pytest.raises(InvalidArgumentException):  # a directory where a file is expected
        world.sbx.files.read("/tmp")


def test_folders_are_made_listed_stat_renamed_and_removed(world: World) -> None:
    files = world.sbx.files
    assert files.make_dir("/tmp/tree/a/b")
    assert not files.make_dir("/tmp/tree/a/b")  # there already
    files.write("/tmp/tree/a/one.txt", "12345")
    files.write("/tmp/tree/top.txt", "x")
    info = files.get_info("/tmp/tree/a/one.txt")
    assert (info.name, info.type.value, info.size, info.path) == \
        ("one.txt", "file", 5, "/tmp/tree/a/one.txt")
    assert files.get_info("/tmp/tree/a").type.value == "dir"
    assert sorted(e.name for e in files.list("/tmp/tree")) == ["a", "top.txt"]
    deep = sorted(e.path for e in files.list("/tmp/tree", depth=3))
    assert deep == ["/tmp/tree/a", "/tmp/tree/a/b", "/tmp/tree/a/one.txt", "/tmp/tree/top.txt"]
    moved = files.rename("/tmp/tree/top.txt", "/tmp/tree/a/b/moved.txt")
    assert (moved.name, moved.path) == ("moved.txt", "/tmp/tree/a/b/moved.txt")
    assert files.exists("/tmp/tree/a/b/moved.txt") and not files.exists("/tmp/tree/top.txt")
    files.remove("/tmp/tree")
    assert not files.exists("/tmp/tree")
    with pytest.raises(FileNotFoundException):
        files.get_info("/tmp/tree")
    with pytest.raises(FileNotFoundException):
        files.list("/tmp/tree")


def test_the_sandbox_is_a_rift_task_held_by_e2b_and_listed(world: World) -> None:
    vm_id = "vm_" + world.sbx.sandbox_id
    vm = httpx.get(f"{world.srv.url}/api/v1/vms/{vm_id}", timeout=30,
                   headers={"Authorization": f"Bearer {world.srv.token}"}).json()["vm"]
    task = httpx.get(f"{world.srv.url}/api/v1/tasks/{vm['task_id']}", timeout=30,
                     headers={"Authorization": f"Bearer {world.srv.token}"}).json()["task"]
    assert task["holder"].startswith("e2b:") and [v["id"] for v in task["vms"]] == [vm_id]
    info = world.sbx.get_info()
    assert (info.state.value, info.metadata, info.template_id) == \
        ("running", {"suite": "real"}, "base")
    found = Sandbox.list(query=SandboxQuery(metadata={"suite": "real"}),
                         **world.opts).next_items()  # type: ignore[arg-type]
    assert [s.sandbox_id for s in found] == [world.sbx.sandbox_id]


def test_a_paused_sandbox_keeps_its_files_and_connect_resumes_it(world: World) -> None:
    world.sbx.files.write("/tmp/kept.txt", "kept")
    world.sbx.commands.run("echo remembered > /dev/shm/mem")
    assert world.sbx.pause()
    assert world.sbx.get_info().state.value == "paused"
    world.sbx.connect()  # resumes it; the SDK keeps its token: the lease is shared
    assert world.sbx.get_info().state.value == "running"
    assert world.sbx.files.read("/tmp/kept.txt") == "kept"
    assert world.sbx.commands.run("cat /dev/shm/mem").stdout == "remembered\n"


def test_metrics_are_the_vms_latest_sample(world: World) -> None:
    deadline = time.monotonic() + 30
    while not (found := world.sbx.get_metrics()):
        assert time.monotonic() < deadline, "no sample within 30 s"
        time.sleep(0.5)
    sample = found[-1]
    assert sample.cpu_count == 1 and sample.mem_used > 0 and sample.mem_total > 0
    assert sample.disk_total > 0


def test_another_user_sees_no_sandbox_and_a_bad_key_is_refused(world: World) -> None:
    other = e2b_opts(world.srv.url, world.srv.new_token("eve", "eve-e2b"))
    with pytest.raises(NotFoundException):
        Sandbox.get_info(world.sbx.sandbox_id, **other)  # type: ignore[arg-type]
    with pytest.raises(NotFoundException):
        Sandbox.get_info("zzzzzzzz", **other)  # type: ignore[arg-type]
    assert Sandbox.list(**other).next_items() == []  # type: ignore[arg-type]
    with pytest.raises(AuthenticationException):
        Sandbox.list(**e2b_opts(world.srv.url, "rift_" + "x" * 43)).next_items()


def test_a_takeover_ends_the_sdk_lease_saying_who_holds_it(world: World) -> None:
    vm_id = "vm_" + world.sbx.sandbox_id
    auth = {"Authorization": f"Bearer {world.srv.token}"}
    task_id = httpx.get(f"{world.srv.url}/api/v1/vms/{vm_id}", headers=auth,
                        timeout=30).json()["vm"]["task_id"]
    took = httpx.post(f"{world.srv.url}/api/v1/tasks/{task_id}/attach", headers=auth,
                      json={"takeover": True}, timeout=30)
    assert took.status_code == 200, took.text
    with pytest.raises(SandboxException) as refused:
        world.sbx.commands.run("echo late")
    assert "api:" in str(refused.value) and "lease_stale" in str(refused.value)
    with pytest.raises(SandboxException) as refused_file:
        world.sbx.files.read("/tmp/note.txt")
    assert "403" in str(refused_file.value) and "api:" in str(refused_file.value)
    world.sbx.kill()  # by the API key: the task is closed, its VM destroyed
    assert Sandbox.list(**world.opts).next_items() == []  # type: ignore[arg-type]
    with pytest.raises(NotFoundException):
        world.sbx.get_info()


def test_a_template_builds_an_image_whose_sandboxes_start_with_its_server_up(
        world: World, tmp_path: Path) -> None:
    """`Template.build` through Rift's builder (rift.e2b.templates), its steps run as
    E2B's `user` in /home/user (made in `tiny`, which lacks it), its ready command
    run in the guest until it succeeds (busybox httpd without -f returns once it
    listens), and a sandbox of its name started from the saved state, the start
    command already serving."""
    (tmp_path / "index.html").write_text("<h1>built by Template</h1>\n")
    template = (Template(file_context_path=tmp_path).from_template("tiny")
                .run_cmd("mkdir www && echo $((6 * 7)) > www/answer && id -un >> www/answer "
                         "&& pwd >> www/answer")
                .copy("index.html", "www/")  # relative: into the folder, /home/user
                .set_start_cmd("httpd -p 8080 -h /home/user/www && touch /tmp/ready",
                               wait_for_file("/tmp/ready")))
    heard: list[str] = []
    built = Template.build(template, "site", on_build_logs=lambda e: heard.append(e.message),
                           **world.opts)  # type: ignore[arg-type]
    assert (built.template_id, built.name) == ("site", "site")
    assert "the ready command succeeded" in heard, heard
    sbx = Sandbox.create(template="site", **world.opts)  # type: ignore[arg-type]
    try:
        assert sbx.get_info().template_id == "site"
        served = sbx.commands.run("wget -q -O - http://127.0.0.1:8080/ "
                                  "http://127.0.0.1:8080/answer")
        assert served.stdout == "<h1>built by Template</h1>\n42\nuser\n/home/user\n", served
    finally:
        sbx.kill()


def test_nothing_is_left_of_the_sandbox(world: World, tmp_path: Path) -> None:
    assert not our_domains(world.srv)


def test_metadata_and_end_outlive_a_restart_and_the_end_still_kills(
        world: World, rig: Rig) -> None:
    """What the door keeps is in the store: after `rift serve` restarts, a sandbox's
    metadata, template and end read back as before; the holder's connect is a
    takeover by the same holder (the handle was in memory only) and commands run;
    its end, moved after the restart, still kills it."""
    sbx = Sandbox.create(metadata={"keep": "me"}, timeout=600, **world.opts)  # type: ignore[arg-type]
    before = sbx.get_info()
    srv = rig.restart()
    opts = e2b_opts(srv.url, srv.token)
    after = Sandbox.get_info(sbx.sandbox_id, **opts)  # type: ignore[arg-type]
    assert (after.metadata, after.template_id, after.end_at, after.started_at) == \
        (before.metadata, before.template_id, before.end_at, before.started_at)
    listed = Sandbox.list(query=SandboxQuery(metadata={"keep": "me"}), **opts).next_items()  # type: ignore[arg-type]
    assert [s.sandbox_id for s in listed] == [sbx.sandbox_id]
    again = Sandbox.connect(sbx.sandbox_id, **opts)  # type: ignore[arg-type]
    assert again.commands.run("echo back").stdout == "back\n"
    again.set_timeout(2)
    deadline = time.monotonic() + 30
    while Sandbox.list(query=SandboxQuery(metadata={"keep": "me"}), **opts).next_items():  # type: ignore[arg-type]
        assert time.monotonic() < deadline, "not killed at its end after the restart"
        time.sleep(0.5)
    with pytest.raises(NotFoundException):
        Sandbox.get_info(sbx.sandbox_id, **opts)  # type: ignore[arg-type]
    # Over at its end at once (above); its VM goes when the deadline sweep kills it.
    while httpx.get(f"{srv.url}/api/v1/vms/vm_{sbx.sandbox_id}", timeout=10, headers={
            "Authorization": f"Bearer {srv.token}"}).json()["vm"]["status"] != "destroyed":
        assert time.monotonic() < deadline + 30, "its VM outlived its end"
        time.sleep(0.5)
