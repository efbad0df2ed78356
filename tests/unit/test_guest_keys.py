"""Per-task SSH keys: made once, private, stable, and forgotten on request."""

from __future__ import annotations

import base64
import os
import stat
import threading
import time
from pathlib import Path

import paramiko
import pytest

from rift.guest.keys import forget_task, keep_boot_key, key_for_task, key_path, load_key, tidy


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_task_gets_an_ed25519_key_readable_by_the_owner_alone(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    private, public = key_for_task(keys, "task_k3v9x2m7")
    assert private == keys / "task_k3v9x2m7"
    assert _mode(private) == 0o600
    assert _mode(keys) == 0o700
    assert isinstance(load_key(private), paramiko.Ed25519Key)
    kind, blob, comment = public.split(" ")
    assert (kind, comment) == ("ssh-ed25519", "rift")
    assert paramiko.Ed25519Key(data=base64.b64decode(blob)) == load_key(private)


def test_asking_again_answers_the_same_key(tmp_path: Path) -> None:
    first = key_for_task(tmp_path, "task_a")
    assert key_for_task(tmp_path, "task_a") == first
    assert key_for_task(tmp_path, "task_b")[1] != first[1]


def test_the_public_line_matches_the_private_key(tmp_path: Path) -> None:
    private, public = key_for_task(tmp_path, "task_a")
    key = load_key(private)
    assert public.split()[1] == key.get_base64()


def test_racing_callers_agree_on_one_key(tmp_path: Path) -> None:
    answers: list[str] = []
    barrier = threading.Barrier(8)

    def ask() -> None:
        barrier.wait()
        answers.append(key_for_task(tmp_path, "task_race")[1])

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(answers) == 8 and len(set(answers)) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["task_race"]  # no leftovers


def test_forgetting_a_task_deletes_its_key_and_a_new_one_differs(tmp_path: Path) -> None:
    _, before = key_for_task(tmp_path, "task_a")
    assert forget_task(tmp_path, "task_a")
    assert not (tmp_path / "task_a").exists()
    assert not forget_task(tmp_path, "task_a")
    assert key_for_task(tmp_path, "task_a")[1] != before


@pytest.mark.parametrize("task_id", ["", "../etc/passwd", "a/b", ".hidden", "x" * 200, "a b"])
def test_ids_that_could_escape_the_keys_folder_are_refused(tmp_path: Path, task_id: str) -> None:
    with pytest.raises(ValueError, match="cannot name a key file"):
        key_path(tmp_path, task_id)


def test_the_key_never_shows_in_a_repr(tmp_path: Path) -> None:
    private, _ = key_for_task(tmp_path, "task_a")
    secret = private.read_text()
    assert "PRIVATE KEY" in secret
    body = "".join(secret.splitlines()[1:-1])
    assert body[:20] not in repr(load_key(private))


def test_tidy_deletes_unneeded_keys_and_stale_halves_but_keeps_the_rest(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    kept, dropped = key_path(keys, "task_keep0000"), key_path(keys, "task_drop0000")
    key_for_task(keys, "task_keep0000")
    key_for_task(keys, "task_drop0000")
    stale, young = keys / ".task_x.00aa.tmp", keys / ".task_y.00bb.tmp"
    for half in (stale, young):
        half.write_text("half a key")
    os.utime(stale, (time.time() - 120, time.time() - 120))
    assert tidy(keys, lambda task_id: task_id == "task_keep0000") == 2
    assert kept.exists() and young.exists()
    assert not dropped.exists() and not stale.exists()
    assert tidy(tmp_path / "none", lambda _: False) == 0


def test_a_boot_key_is_the_pools_key_under_the_vms_id_and_outlives_it(tmp_path: Path) -> None:
    _, public = key_for_task(tmp_path, "pool_k3v9x2m7")
    keep_boot_key(tmp_path, "pool_k3v9x2m7", "vm_a1b2c3d4")
    keep_boot_key(tmp_path, "pool_k3v9x2m7", "vm_a1b2c3d4")  # again: replaced, no error
    forget_task(tmp_path, "pool_k3v9x2m7")
    boot = key_path(tmp_path, "vm_a1b2c3d4")
    assert _mode(boot) == 0o600
    assert public.split()[1] == load_key(boot).get_base64()
    keep_boot_key(tmp_path, "pool_gone0000", "vm_e5f6g7h8")  # no such key: none kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vm_a1b2c3d4"]
