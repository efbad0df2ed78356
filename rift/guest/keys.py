"""One ed25519 key pair per task, made by Rift and never shown.

The private key is `<keys dir>/<task id>` (mode 0600, OpenSSH format, in a
0700 folder); its public half goes into each of the task's guests at boot.
Creation is atomic (written aside, then hard-linked into place), so two callers
racing for a new task's key agree on one key. Nothing here logs key material.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import paramiko
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

_TASK_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
KEY_COMMENT = "rift"


def key_path(keys_dir: Path, task_id: str) -> Path:
    """Where the task's private key lives; ValueError for an id unfit for a file name."""
    if not _TASK_ID.fullmatch(task_id):
        raise ValueError(f"task id {task_id!r} cannot name a key file")
    return keys_dir / task_id


def key_for_task(keys_dir: Path, task_id: str) -> tuple[Path, str]:
    """(private key path, OpenSSH public key line) of the task, made on first use."""
    path = key_path(keys_dir, task_id)
    if not path.exists():
        _create(keys_dir, path)
    return path, public_line(load_key(path))


def load_key(path: Path) -> paramiko.Ed25519Key:
    """The private key at `path`, as paramiko uses it."""
    return paramiko.Ed25519Key(filename=str(path))


def new_host_key() -> tuple[str, str]:
    """A new ed25519 SSH host key for a guest's sshd: (its private key in OpenSSH's
    format, its public key line). It goes to the guest over SSH and is kept nowhere
    here."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM,
                                serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption()).decode()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                           serialization.PublicFormat.OpenSSH).decode()
    return private.strip(), public.strip()


def public_line(key: paramiko.PKey) -> str:
    """`ssh-ed25519 AAAA… rift`: the line for authorized_keys."""
    return f"{key.get_name()} {key.get_base64()} {KEY_COMMENT}"


def forget_task(keys_dir: Path, task_id: str) -> bool:
    """Delete the task's key; False when it had none."""
    try:
        key_path(keys_dir, task_id).unlink()
    except FileNotFoundError:
        return False
    return True


def keep_boot_key(keys_dir: Path, key_id: str, vm_id: str, *,
                  source: Path | None = None) -> None:
    """Keep the key `vm_id` booted with (`key_id`'s, a pool's; or the file `source`,
    a snapshot image's) under the VM's id, as a second name of the same file where
    it can be (else a copy): it outlives its pool, and goes with the VM (`tidy`).
    A VM that has a boot key keeps it (a snapshot image's VM, pooled: its guest
    comes back from a reboot with the image's key, not the pool's). A missing key
    is left missing."""
    target = key_path(keys_dir, vm_id)
    if target.exists():
        return
    aside = keys_dir / f".{vm_id}.{secrets.token_hex(8)}.tmp"
    origin = source if source is not None else key_path(keys_dir, key_id)
    try:
        try:
            os.link(origin, aside)
        except FileNotFoundError:
            return
        except OSError:  # another file system
            shutil.copyfile(origin, aside)
            aside.chmod(0o600)
        os.replace(aside, target)
    finally:
        aside.unlink(missing_ok=True)


def tidy(keys_dir: Path, needed: Callable[[str], bool], aside_age_s: float = 60) -> int:
    """Delete every key (a task's, a pool's, a VM's boot key) whose owner's id
    `needed` says no to, and every key a crash left
    written aside (older than `aside_age_s`: a younger one may be in the making).
    Answers how many files went."""
    gone = 0
    try:
        entries = list(keys_dir.iterdir())
    except FileNotFoundError:
        return 0
    for path in entries:
        if path.name.startswith(".") and path.name.endswith(".tmp"):
            try:
                stale = time.time() - path.stat().st_mtime > aside_age_s
            except FileNotFoundError:
                continue
            if stale:
                path.unlink(missing_ok=True)
                gone += 1
        elif _TASK_ID.fullmatch(path.name) and not needed(path.name):
            gone += forget_task(keys_dir, path.name)
    return gone


def _create(keys_dir: Path, path: Path) -> None:
    keys_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    keys_dir.chmod(0o700)
    pem = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    aside = keys_dir / f".{path.name}.{secrets.token_hex(8)}.tmp"
    fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
            f.flush()
            os.fsync(f.fileno())
        # Atomic, and refuses to replace a key made meanwhile: the first one wins.
        with contextlib.suppress(FileExistsError):
            os.link(aside, path)
    finally:
        aside.unlink(missing_ok=True)
