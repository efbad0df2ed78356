"""Volumes' files on every host (SPEC §18): this machine's through
hypervisor.volumes.VolumeFolder, a host elsewhere's through its SSH
(rift.guest.links), at the same paths there, by the same steps.

A host elsewhere (`qemu+ssh://`) keeps its volumes in the same folder of its own
machine (`RIFT_DATA_DIR/volumes/`), as it keeps its VMs' disks and snapshots: each
step is one shell script run there with the host's own tools (`mkfs.ext4`,
`qemu-img`, `ln`), doing what VolumeFolder does here (a sparse raw file made ext4
and turned qcow2; clones and a snapshot's kept copies as frozen parents, hard
links under `parents/` named at random; a file removed with each frozen parent
whose last name it was). Nothing of a volume's bytes crosses the network, but
when a VM moving to another host carries it (`send`, rift.guest.volume_relay).
What its file and its chain take there is read there (`stat`'s blocks), as here.
What goes wrong comes out as OSError.
"""

from __future__ import annotations

import errno
import secrets
import shlex

from hypervisor.volumes import (
    GIB,
    PARENTS,
    VOLUME_TIMEOUT_S,
    VolumeFolder,
    is_volume_id,
    kept_prefix,
)
from rift.guest.links import HostLinkError, HostLinks, SshTarget, ssh_target
from rift.guest.volume_relay import VolumeRelay

# Shell helpers every script starts with: a qcow2's virtual size, and a file's
# removal with each frozen parent (under parents/) whose last name it was.
_HELPERS = r"""set -eu
vsize() { qemu-img info -U "$1" | sed -n 's/^virtual size: .*(\([0-9]*\) bytes).*/\1/p'; }
overlay() { qemu-img create -q -f qcow2 -F qcow2 -b "$1" "$2" "$3"; }
unlink_chain() {
  p=$1
  while [ -e "$p" ]; do
    b=
    if [ "$(stat -c %h "$p")" = 1 ]; then
      b=$(qemu-img info -U "$p" | sed -n 's/^backing file: \([^ ]*\).*/\1/p')
    fi
    rm -f "$p"
    if [ -z "$b" ] || [ "$(dirname "$b")" != "$PARENTS" ]; then return 0; fi
    p=$b
  done
}
"""


class HostVolumes:
    """The engine's VolumeFiles port over every host: `local` for a host of this
    machine, its SSH for a host elsewhere."""

    def __init__(self, local: VolumeFolder, links: HostLinks) -> None:
        self.local = local
        self.links = links
        self.folder = str(local.folder.resolve())
        self.parents = f"{self.folder}/{PARENTS}"
        self.relay = VolumeRelay(self.folder, links)

    # -- where ------------------------------------------------------------------------

    def _there(self, uri: str) -> SshTarget | None:
        return ssh_target(uri)

    def _file(self, volume_id: str) -> str:
        return f"{self.folder}/{self.local.file(volume_id).name}"  # ImageError for a bad id

    def _kept(self, snapshot_id: str, volume_id: str) -> str:
        self._file(volume_id)  # a volume id, or ImageError
        return f"{self.parents}/{kept_prefix(snapshot_id)}{volume_id}.qcow2"

    def _run(self, target: SshTarget, script: str) -> str:
        env = (f"FOLDER={shlex.quote(self.folder)}; PARENTS={shlex.quote(self.parents)}; "
               'mkdir -p "$PARENTS"\n')
        try:
            return self.links.run(target, "sh -c " + shlex.quote(_HELPERS + env + script),
                                  timeout_s=VOLUME_TIMEOUT_S)
        except HostLinkError as exc:
            raise OSError(errno.EIO, f"{target.host}: {exc}") from exc

    def _new_parent(self) -> str:
        return f"{self.parents}/{secrets.token_hex(8)}.qcow2"

    # -- the port ---------------------------------------------------------------------

    def path(self, uri: str, volume_id: str) -> str:
        if self._there(uri) is None:
            return self.local.path(uri, volume_id)
        return self._file(volume_id)

    def make(self, uri: str, volume_id: str, size_gib: int) -> None:
        target = self._there(uri)
        if target is None:
            return self.local.make(uri, volume_id, size_gib)
        q = shlex.quote
        raw, part = f"{self.folder}/.{volume_id}.raw", f"{self.folder}/.{volume_id}.qcow2"
        self._run(target, (
            f"trap 'rm -f {q(raw)} {q(part)}' EXIT\n"
            f"truncate -s {int(size_gib) * GIB} {q(raw)}\n"
            "mkfs.ext4 -q -F -m 0 -E lazy_itable_init=0,lazy_journal_init=1,nodiscard "
            f"{q(raw)}\n"
            f"qemu-img convert -q -f raw -O qcow2 {q(raw)} {q(part)}\n"
            f"mv -f {q(part)} {q(self._file(volume_id))}\n"))
        return None

    def grow(self, uri: str, volume_id: str, size_gib: int) -> None:
        target = self._there(uri)
        if target is None:
            return self.local.grow(uri, volume_id, size_gib)
        self._run(target, f"qemu-img resize -q {shlex.quote(self._file(volume_id))} "
                          f"{int(size_gib) * GIB}\n")
        return None

    def clone(self, uri: str, source_id: str, volume_id: str) -> None:
        target = self._there(uri)
        if target is None:
            return self.local.clone(uri, source_id, volume_id)
        q = shlex.quote
        source, made = q(self._file(source_id)), q(self._file(volume_id))
        for_source, for_clone = q(self._new_parent()), q(self._new_parent())
        fresh = q(f"{self.folder}/.{source_id}.qcow2")
        self._run(target, (
            f"ln {source} {for_source}\nln {source} {for_clone}\nsize=$(vsize {source})\n"
            f'overlay {for_clone} {made} "$size"\noverlay {for_source} {fresh} "$size"\n'
            f"mv -f {fresh} {source}\nchmod 444 {for_source} {for_clone}\n"))
        return None

    def freeze(self, uri: str, volume_id: str, snapshot_id: str) -> None:
        target = self._there(uri)
        if target is None:
            return self.local.freeze(uri, volume_id, snapshot_id)
        q = shlex.quote
        source, kept = q(self._file(volume_id)), q(self._kept(snapshot_id, volume_id))
        for_source, fresh = q(self._new_parent()), q(f"{self.folder}/.{volume_id}.qcow2")
        self._run(target, (
            f"ln {source} {kept}\nln {source} {for_source}\n"
            f'overlay {for_source} {fresh} "$(vsize {source})"\n'
            f"mv -f {fresh} {source}\nchmod 444 {kept} {for_source}\n"))
        return None

    def frozen(self, uri: str, snapshot_id: str) -> dict[str, int]:
        target = self._there(uri)
        if target is None:
            return self.local.frozen(uri, snapshot_id)
        prefix = kept_prefix(snapshot_id)
        listed = self._run(target, (
            f'for f in "$PARENTS"/{shlex.quote(prefix)}*.qcow2; do\n'
            '  [ -e "$f" ] || continue\n'
            '  echo "$(basename "$f") $(vsize "$f")"\ndone\n'))
        kept: dict[str, int] = {}
        for line in listed.splitlines():
            name, _, size = line.partition(" ")
            volume_id = name[len(prefix):-len(".qcow2")]
            if is_volume_id(volume_id) and size.strip().isdigit():
                kept[volume_id] = -(-int(size) // GIB)
        return dict(sorted(kept.items()))

    def clone_frozen(self, uri: str, snapshot_id: str, source_id: str,
                     volume_id: str) -> None:
        target = self._there(uri)
        if target is None:
            return self.local.clone_frozen(uri, snapshot_id, source_id, volume_id)
        q = shlex.quote
        kept, for_clone = q(self._kept(snapshot_id, source_id)), q(self._new_parent())
        self._run(target, (f"ln {kept} {for_clone}\n"
                           f'overlay {for_clone} {q(self._file(volume_id))} "$(vsize {kept})"\n'))
        return None

    def thaw(self, uri: str, snapshot_id: str) -> None:
        target = self._there(uri)
        if target is None:
            return self.local.thaw(uri, snapshot_id)
        prefix = kept_prefix(snapshot_id)
        self._run(target, (f'for f in "$PARENTS"/{shlex.quote(prefix)}*.qcow2; do\n'
                           '  unlink_chain "$f"\ndone\n'))
        return None

    def remove(self, uri: str, volume_id: str) -> None:
        target = self._there(uri)
        if target is None:
            return self.local.remove(uri, volume_id)
        self._run(target, f"unlink_chain {shlex.quote(self._file(volume_id))}\n")
        return None

    def used_bytes(self, uri: str, volume_id: str) -> int | None:
        target = self._there(uri)
        if target is None:
            return self.local.used_bytes(uri, volume_id)
        said = self._run(target, (  # the allocated blocks of its file and of its chain
            f"f={shlex.quote(self._file(volume_id))}\n"
            '[ -e "$f" ] || { echo none; exit 0; }\n'
            "qemu-img info -U --backing-chain \"$f\" | sed -n 's/^image: //p' |\n"
            '  while read -r p; do stat -c "%b %B" "$p"; done |\n'
            "  awk '{ s += $1 * $2 } END { print s + 0 }'\n")).strip()
        if said == "none":
            return None
        if not said.isdigit():
            raise OSError(errno.EIO, f"{target.host}: no usage of {volume_id}: {said[-200:]}")
        return int(said)

    def send(self, uri: str, dest_uri: str, volume_id: str, whole: bool) -> None:
        if self._there(uri) is None and self._there(dest_uri) is None:
            return None  # hosts of this machine share one folder
        self.relay.send(uri, dest_uri, self._file(volume_id), whole)
        return None
