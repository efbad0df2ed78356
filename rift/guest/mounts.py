"""Volumes in a guest (SPEC §18): mounting a hot-plugged disk, found by its serial
(the volume id, in `/sys/block/vd*/serial`), at a path, and unmounting it; one
short shell script each (busybox sh or bash) on a pooled connection."""

from __future__ import annotations

import shlex

from rift.domain.errors import GuestUnreachable, InvalidArgument
from rift.domain.model import Vm
from rift.guest.errors import GuestError
from rift.guest.shell import SshGuestShell

MOUNT_TIMEOUT_S = 30
# What the scripts' exit codes mean (the guest answered: `invalid_argument`).
_WHY = {3: "the volume's disk did not appear in the guest",
        4: "the folder could not be made", 5: "something is mounted there already",
        6: "the guest could not mount the volume (ext4)", 7: "the guest could not unmount "
        "it: something holds it open (end it first)"}

_MOUNT = """serial={serial}; p={path}; opts={opts}; dev=; i=0
while [ $i -lt 400 ]; do
  for b in /sys/block/vd*; do
    [ "$(cat "$b/serial" 2>/dev/null)" = "$serial" ] && dev=/dev/${{b##*/}}
  done
  [ -n "$dev" ] && [ -b "$dev" ] && break
  dev=; i=$((i+1)); sleep 0.025
done
[ -n "$dev" ] || exit 3
mkdir -p "$p" || exit 4
grep -q " $p " /proc/mounts && exit 5
mount -t ext4 -o "$opts" "$dev" "$p" || exit 6
if [ "$opts" = rw,noatime ] && command -v resize2fs >/dev/null 2>&1; then
  resize2fs "$dev" >/dev/null 2>&1
fi
exit 0
"""

_UNMOUNT = """p={path}
grep -q " $p " /proc/mounts || exit 0
sync
umount "$p" || exit 7
"""


# Before a snapshot keeps the volumes: what is cached is written, and each writable
# volume's file system is frozen and thawed at once, which writes its journal out to
# its place (ext4), so a copy mounted `ro,noload` has all that was there.
_FLUSH = """sync
for p in {paths}; do
  grep -q " $p " /proc/mounts && fsfreeze -f "$p" && fsfreeze -u "$p"
done
exit 0
"""


class SshMounts:
    """GuestMounts over the guest shell's commands."""

    def __init__(self, shell: SshGuestShell) -> None:
        self.execs = shell.execs

    def mount(self, vm: Vm, serial: str, path: str, read_only: bool) -> None:
        opts = "ro,noload" if read_only else "rw,noatime"
        self._run(vm, _MOUNT.format(serial=shlex.quote(serial), path=shlex.quote(path),
                                    opts=opts), path)

    def unmount(self, vm: Vm, path: str) -> None:
        self._run(vm, _UNMOUNT.format(path=shlex.quote(path)), path)

    def flush(self, vm: Vm, paths: list[str]) -> None:
        self._run(vm, _FLUSH.format(paths=" ".join(shlex.quote(p) for p in paths)),
                  "its volumes")

    def _run(self, vm: Vm, script: str, path: str) -> None:
        try:
            done = self.execs.exec(vm, script, None, MOUNT_TIMEOUT_S)
        except GuestError as exc:
            raise GuestUnreachable(vm.id, str(exc)) from exc
        if done.timed_out:
            raise GuestUnreachable(vm.id, f"the guest did not mount or unmount {path} "
                                   f"within {MOUNT_TIMEOUT_S}s")
        if done.exit_code != 0:
            why = _WHY.get(done.exit_code or 0, "the guest refused")
            said = done.stderr.decode("utf-8", "replace").strip()[:200]
            raise InvalidArgument("path", f"{path}: {why}" + (f" ({said})" if said else ""))
