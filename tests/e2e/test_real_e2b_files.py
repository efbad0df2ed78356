"""The E2B door's files side on a real `tiny` guest (SPEC §16, issue #28), driven by
E2B's own SDK: entries as envd describes them (mode, permissions, owner, a
symlink's target), listings in envd's order, gzip both ways, an empty file, a
missing one removed, metadata refused where the guest cannot keep it (tiny has
no python3), a secured sandbox's signed download URL, and directory watches
(busybox: the polling watcher; `debian`'s inotify one runs in E2B's own suite,
tests/e2e/test_e2b_upstream.py). One server and one sandbox for the module."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from e2b import (
    AsyncSandbox,
    FileNotFoundException,
    FilesystemEvent,
    FilesystemEventType,
    FileType,
    InvalidArgumentException,
    Sandbox,
    SandboxException,
)

from tests.support.e2b import e2b_opts, own_tiny
from tests.support.real_guests import RealSettings, Rig
from tests.support.servers import real_vms_missing

pytestmark = [
    pytest.mark.skipif(real_vms_missing() is not None, reason=real_vms_missing() or ""),
    pytest.mark.slow,
]

REAL = RealSettings(env={"RIFT_DEFAULT_IMAGE": "tiny", "RIFT_VM_BOOT_TIMEOUT_S": "120"},
                    prepare=own_tiny)


@dataclass
class World:
    sbx: Sandbox
    opts: dict[str, object]


@pytest.fixture(scope="module")
def world(rig: Rig) -> Iterator[World]:
    opts = e2b_opts(rig.server.url, rig.server.token)
    sbx = Sandbox.create(secure=True, **opts)  # type: ignore[arg-type]
    try:
        yield World(sbx, opts)
    finally:
        sbx.kill()


def test_entries_are_described_and_listed_as_envd_does(world: World) -> None:
    files = world.sbx.files
    files.write("/tmp/e/sub/deep/x.txt", "x")
    files.write("/tmp/e/a.txt", "Hello, World!")
    world.sbx.commands.run("ln -s a.txt /tmp/e/link")
    info = files.get_info("/tmp/e/a.txt")
    assert (info.type, info.size, info.mode, info.permissions, info.owner, info.group) == \
        (FileType.FILE, 13, 0o644, "-rw-r--r--", "root", "root")  # tiny has no `user`
    assert info.modified_time.tzinfo is not None and info.symlink_target is None
    assert abs(info.modified_time.timestamp() - time.time()) < 600
    link = files.get_info("/tmp/e/link")
    assert (link.type, link.symlink_target) == (FileType.FILE, "/tmp/e/a.txt")
    folder = files.get_info("/tmp/e/sub")
    assert (folder.type, folder.mode, folder.permissions) == (FileType.DIR, 0o755, "drwxr-xr-x")
    assert [e.path for e in files.list("/tmp/e", depth=2)] == \
        ["/tmp/e/a.txt", "/tmp/e/link", "/tmp/e/sub", "/tmp/e/sub/deep"]


def test_gzip_empty_and_missing_files(world: World) -> None:
    files = world.sbx.files
    text = "compressed both ways " * 200
    assert files.write("/tmp/z.txt", text, gzip=True).path == "/tmp/z.txt"
    assert files.read("/tmp/z.txt", gzip=True) == text == files.read("/tmp/z.txt")
    assert bytes(files.read("/tmp/z.txt", format="bytes", gzip=True)).decode() == text
    world.sbx.commands.run("rm -f /tmp/empty; touch /tmp/empty")
    assert files.read("/tmp/empty") == ""
    files.remove("/tmp/never-was")  # envd removes with RemoveAll: no error
    with pytest.raises(FileNotFoundException):
        files.read("/tmp/never-was")


def test_metadata_is_refused_where_the_guest_cannot_keep_it(world: World) -> None:
    assert world.sbx.files.write("/tmp/plain.txt", "p").metadata is None
    with pytest.raises(InvalidArgumentException, match="metadata"):
        world.sbx.files.write("/tmp/meta.txt", "m", metadata={"author": "me"})
    assert not world.sbx.files.exists("/tmp/meta.txt")  # refused before it was written


def test_a_signed_download_url_reads_the_file_without_the_token(world: World) -> None:
    world.sbx.files.write("/tmp/signed.txt", "signed content")
    url = world.sbx.download_url("/tmp/signed.txt", "user", 60)
    answer = httpx.get(url, timeout=60)
    assert (answer.status_code, answer.text) == (200, "signed content")
    assert httpx.get(url.replace("signed.txt", "other.txt"), timeout=60).status_code == 401


def test_a_watch_reports_writes_removals_and_entries(world: World) -> None:
    files = world.sbx.files
    files.make_dir("/tmp/w")
    files.write("/tmp/w/old.txt", "old")
    handle = files.watch_dir("/tmp/w", include_entry=True)
    files.write("/tmp/w/new.txt", "new")
    files.write("/tmp/w/old.txt", "changed!")
    seen = {(e.type, e.name) for e in handle.get_new_events()}
    assert {(FilesystemEventType.CREATE, "new.txt"), (FilesystemEventType.WRITE, "new.txt"),
            (FilesystemEventType.WRITE, "old.txt")} <= seen
    files.remove("/tmp/w/old.txt")
    gone = handle.get_new_events()
    assert [(e.type, e.name, e.entry) for e in gone] == \
        [(FilesystemEventType.REMOVE, "old.txt", None)]
    world.sbx.commands.run("echo more >> /tmp/w/new.txt")
    (wrote,) = handle.get_new_events()
    assert wrote.entry is not None and (wrote.entry.path, wrote.entry.size) == \
        ("/tmp/w/new.txt", 8)
    handle.stop()
    with pytest.raises(SandboxException):
        handle.get_new_events()
    with pytest.raises(FileNotFoundException):
        files.watch_dir("/tmp/no-such-dir")
    with pytest.raises(SandboxException):
        files.watch_dir("/tmp/w/new.txt")  # not a directory


def test_the_async_client_streams_a_watch(world: World) -> None:
    async def watch() -> list[FilesystemEvent]:
        sbx = await AsyncSandbox.connect(world.sbx.sandbox_id, **world.opts)  # type: ignore[arg-type]
        seen: list[FilesystemEvent] = []
        await sbx.files.make_dir("/tmp/s")
        handle = await sbx.files.watch_dir("/tmp/s", on_event=seen.append, recursive=True)
        await sbx.files.write("/tmp/s/one.txt", "1")
        deadline = time.monotonic() + 30
        while not any(e.name == "one.txt" for e in seen) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        await handle.stop()
        return seen

    seen = asyncio.run(watch())
    assert (FilesystemEventType.CREATE, "one.txt") in {(e.type, e.name) for e in seen}
