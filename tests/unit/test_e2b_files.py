"""The E2B door's files side, without a VM (SPEC §16, issue #28): the guest scripts
of rift.e2b.entries, rift.e2b.uploads and rift.e2b.watch_scripts run here under
`sh` (the python3 path, as on `debian`) and busybox `sh` (the path of a guest
without python3, as `tiny`), and the parsers fed what a hostile guest could print."""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import time
import zlib
from pathlib import Path

import pytest
from e2b.sandbox.signature import get_signature

from rift.domain.errors import InvalidArgument
from rift.e2b import entries, uploads, watch_scripts, watches

BUSYBOX = shutil.which("busybox")
SHELLS = ["python3", pytest.param("busybox", marks=pytest.mark.skipif(
    BUSYBOX is None, reason="busybox is not installed"))]


def _shell(variant: str, script: str) -> list[str]:
    if variant == "busybox":  # as a guest without python3
        return [BUSYBOX or "busybox", "sh", "-c",
                script.replace("command -v python3", "command -v no-python3-here")]
    return ["sh", "-c", script]


def _run(variant: str, script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_shell(variant, script), capture_output=True, text=True,
                          timeout=30, check=False)


def _tree(tmp: Path) -> Path:
    top = tmp / "top"
    (top / "sub" / "deep").mkdir(parents=True)
    (top / "b.txt").write_text("12345")
    (top / "a.txt").write_text("")
    (top / "link").symlink_to("b.txt")
    (top / "sub" / "c.txt").write_text("c")
    return top


@pytest.mark.parametrize("variant", SHELLS)
def test_a_listing_walks_in_name_order_to_its_depth_with_envds_details(
        variant: str, tmp_path: Path) -> None:
    top = _tree(tmp_path)
    done = _run(variant, entries.script([str(top)], 2))
    assert done.returncode == 0, done.stderr
    found = entries.parse(done.stdout)
    assert [e["path"].removeprefix(str(top)) for e in found] == \
        ["/a.txt", "/b.txt", "/link", "/sub", "/sub/c.txt", "/sub/deep"]
    by_name = {e["name"]: e for e in found}
    assert by_name["b.txt"]["type"] == "FILE_TYPE_FILE" and by_name["b.txt"]["size"] == "5"
    assert by_name["sub"]["type"] == "FILE_TYPE_DIRECTORY"
    link = by_name["link"]  # described by its target, naming it resolved
    assert (link["type"], link["symlinkTarget"]) == ("FILE_TYPE_FILE", str(top / "b.txt"))
    assert link["permissions"].startswith("l") and "symlinkTarget" not in by_name["b.txt"]
    mode = os.stat(top / "b.txt").st_mode & 0o777
    assert (by_name["b.txt"]["mode"], by_name["b.txt"]["permissions"][0]) == (mode, "-")
    one = entries.parse(_run(variant, entries.script([str(top)], 1)).stdout)
    assert [e["name"] for e in one] == ["a.txt", "b.txt", "link", "sub"]


def test_metadata_is_read_from_user_e2b_attributes_and_set_by_the_settle_script(
        tmp_path: Path) -> None:
    target = tmp_path / "f.txt"
    target.write_text("x")
    try:
        os.setxattr(target, "user.other", b"not ours")
    except OSError:
        pytest.skip("this file system keeps no user xattrs")
    me = subprocess.run(["id", "-un"], capture_output=True, text=True, check=True).stdout.strip()
    done = _run("python3", uploads.settle(str(target), me, {"author": "mish", "k": "v w"}))
    assert done.returncode == 0, done.stderr
    listed = entries.parse(_run("python3", entries.script([str(target)])).stdout)
    assert listed[0]["metadata"] == {"author": "mish", "k": "v w"}
    assert _run("python3", uploads.settle(str(target), me, None)).returncode == 0
    assert "metadata" not in entries.parse(_run("python3", entries.script([str(target)]))
                                           .stdout)[0]
    assert os.getxattr(target, "user.other") == b"not ours"  # not E2B's: left alone
    if BUSYBOX:  # no python3: metadata cannot be kept, and none is claimed
        refused = _run("busybox", uploads.settle(str(target), me, {"a": "b"}))
        assert refused.returncode == uploads.NO_METADATA_HERE


def test_hostile_listing_lines_are_left_out_not_believed() -> None:
    good = "81a4\t5\tuser\tuser\t1700000000\t-\t\t-\t/home/user/a"
    assert entries.parse(good)[0]["owner"] == "user"
    for bad in ("", "81a4\t5", "zz\t5\tu\tg\t1\t-\t\t-\t/p", "81a4\t5\tu\tg\tnan\t-\t\t-\t/p",
                "81a4\t5\tu\tg\t99999999999999999\t-\t\t-\t/p", "81a4\t5\tu\tg\t1\t-\t\t-\t",
                "81a4\t5\tu\tg\t1\t-\t\t-\t/" + "x" * 70_000):
        assert entries.parse(bad) == [], bad
    odd = entries.parse("81a4\t5\t" + "o" * 500 + "\tg\t1\t-\t\tzz=11,6b=76\t/p")[0]
    assert len(odd["owner"]) == 64 and odd["metadata"] == {"k": "v"}


def test_gzip_bodies_are_inflated_bounded_and_reads_compressed_on_request() -> None:
    assert uploads.inflate(gzip.compress(b"hello")) == b"hello"
    bomb = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    packed = bomb.compress(b"\0" * (17 * 1024 * 1024)) + bomb.flush()
    with pytest.raises(InvalidArgument, match="16 MiB"):
        uploads.inflate(packed)
    with pytest.raises(InvalidArgument, match="not gzip"):
        uploads.inflate(b"plain")
    with pytest.raises(InvalidArgument, match="cut short"):
        uploads.inflate(gzip.compress(b"hello" * 100)[:20])
    assert gzip.decompress(uploads.deflate(b"abc")) == b"abc"
    assert uploads.wants_gzip("gzip") and uploads.wants_gzip("br, GZIP;q=0.5")
    assert not uploads.wants_gzip("deflate") and not uploads.wants_gzip("gzip;q=0")


def test_metadata_headers_are_e2bs_tokens_and_printable_values() -> None:
    assert uploads.metadata_of([("X-Metadata-Author", "mish"), ("Other", "x")]) == \
        {"author": "mish"}
    assert uploads.metadata_of([("content-type", "x")]) is None
    for bad in ([("x-metadata-bad key", "v")], [("x-metadata-", "v")],
                [("x-metadata-k", "bad\nvalue")], [("x-metadata-k", "é")],
                [(f"x-metadata-k{i}", "v") for i in range(65)]):
        with pytest.raises(InvalidArgument):
            uploads.metadata_of(bad)


def test_signed_urls_are_checked_as_the_sdk_signs_them() -> None:
    token, later = "task_abc.secret", int(time.time()) + 60
    sdk = get_signature("a.txt", "read", "user", token, 60)
    query = {"path": "a.txt", "username": "user", "signature": sdk["signature"],
             "signature_expiration": str(sdk["expiration"])}
    held = [("zzzzzzzz", "other.token"), ("abcdefgh", token)]
    assert uploads.signed_by(query, "read", time.time(), held) == ("abcdefgh", token)
    with pytest.raises(PermissionError, match="invalid signature"):
        uploads.signed_by(query, "write", time.time(), held)  # signed for reading only
    with pytest.raises(PermissionError, match="invalid signature"):
        uploads.signed_by({**query, "path": "b.txt"}, "read", time.time(), held)
    with pytest.raises(PermissionError, match="signature is already expired"):
        uploads.signed_by(query, "read", later + 1, held)
    plain = get_signature("a.txt", "write", None, token)  # no user, no expiration
    assert uploads.signed_by({"path": "a.txt", "signature": plain["signature"]}, "write",
                             time.time(), held)[0] == "abcdefgh"


def _watch(variant: str, root: Path, recursive: bool,
           change: str) -> list[tuple[str, str]]:
    with subprocess.Popen(_shell(variant, watch_scripts.script(str(root), recursive)),
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as watcher:
        assert watcher.stdin is not None and watcher.stdout is not None
        try:
            assert watcher.stdout.readline() == "ready\n"
            subprocess.run(["sh", "-c", change], cwd=root, check=True)
            watcher.stdin.write("t1\n")
            watcher.stdin.flush()
            seen: list[tuple[str, str]] = []
            while (line := watcher.stdout.readline()) != "#t1\n":
                assert line, "the watcher ended"
                found = watches.event(line.rstrip("\n"))
                assert found is not None, line
                seen.append((found["type"].removeprefix("EVENT_TYPE_"), found["name"]))
            return seen
        finally:
            watcher.kill()


def test_the_inotify_watcher_reports_as_envds_fsnotify_does(tmp_path: Path) -> None:
    (tmp_path / "old.txt").write_text("x")
    seen = _watch("python3", tmp_path, True,
                  "printf hi > new.txt; chmod 600 new.txt; mkdir d; echo y > d/f; "
                  "mv old.txt moved.txt; rm d/f")
    assert seen == [("CREATE", "new.txt"), ("WRITE", "new.txt"), ("CHMOD", "new.txt"),
                    ("CREATE", "d"), ("CREATE", "d/f"), ("WRITE", "d/f"),
                    ("RENAME", "old.txt"), ("CREATE", "moved.txt"), ("REMOVE", "d/f")]
    flat = _watch("python3", tmp_path, False, "echo z > d/g; echo z > top.txt")
    assert flat == [("CREATE", "top.txt"), ("WRITE", "top.txt")]  # d/g: not watched


def test_what_a_new_directory_holds_before_its_watch_is_armed_is_told_once(
        tmp_path: Path) -> None:
    # inotify cannot watch a directory before it exists: what lands in it first is
    # found by a look when its watch is armed, and told once, whichever came first
    for trial in range(5):
        seen = _watch("python3", tmp_path, True,
                      f"mkdir -p {trial}/a/b/c; echo x > {trial}/a/b/c/f; : > {trial}/a/e")
        assert sorted(seen) == [("CREATE", f"{trial}"), ("CREATE", f"{trial}/a"),
                                ("CREATE", f"{trial}/a/b"), ("CREATE", f"{trial}/a/b/c"),
                                ("CREATE", f"{trial}/a/b/c/f"), ("CREATE", f"{trial}/a/e"),
                                ("WRITE", f"{trial}/a/b/c/f")], seen
        assert seen.index(("CREATE", f"{trial}/a/b/c/f")) < seen.index(
            ("WRITE", f"{trial}/a/b/c/f"))


@pytest.mark.skipif(BUSYBOX is None, reason="busybox is not installed")
def test_the_polling_watcher_reports_what_changed_between_two_looks(tmp_path: Path) -> None:
    (tmp_path / "old.txt").write_text("x")
    (tmp_path / "same.txt").write_text("x")
    (tmp_path / "d").mkdir()
    seen = _watch("busybox", tmp_path, True,
                  "printf hi > new.txt; touch -d @1 same.txt; mkdir e; echo y > d/f; "
                  "rm old.txt; : > empty")
    assert sorted(seen) == sorted([("CREATE", "new.txt"), ("WRITE", "new.txt"),
                                   ("WRITE", "same.txt"), ("CREATE", "e"), ("CREATE", "d/f"),
                                   ("WRITE", "d/f"), ("REMOVE", "old.txt"),
                                   ("CREATE", "empty")])
    (tmp_path / "was-empty").mkdir()  # a first look with nothing in it
    assert _watch("busybox", tmp_path / "was-empty", False, "echo a > x") == \
        [("CREATE", "x"), ("WRITE", "x")]


def test_hostile_event_lines_are_left_out() -> None:
    assert watches.event("WRITE\ta.txt") == {"name": "a.txt", "type": "EVENT_TYPE_WRITE"}
    for bad in ("", "WRITE", "WRITE\t", "EXPLODE\ta", "WRITE\t" + "x" * 5000):
        assert watches.event(bad) is None
