"""One strategy per kind of guest: how a VM of one image starts on one host,
how Rift waits for its guest and reaches it, and how the VM's own files go.

- `TestDriverGuest`: libvirt's test driver (or the in-memory fake): a domain
  with no guest behind it. Every image the catalog knows is accepted, the VM is
  `running` as soon as its domain is, and it has no SSH address (`ssh: null`),
  so exec and files refuse with `guest_unreachable`, naming the test driver
  (`reach`).
- `KernelGuest`: a kernel image (`tiny`, `debian`): the kernel and initramfs
  booted directly, Rift's own init taking the task's key from the kernel
  command line; ready once the init's marker is on the serial console and SSH
  answers. `debian` also has a read-only root base disk under a per-VM
  copy-on-write overlay: made in `plan` with hypervisor.disks.make_overlay, as
  the domain's `disk`, and removed by `clean_up` like every VM's disks.
- `Qcow2Guest`: an operator's qcow2 image: the VM's own overlay on it and a
  cloud-init seed with the task's key; ready once an SSH login succeeds.
- `SnapshotGuest`: an image made from a snapshot (`rift image add NAME
  --snapshot SNAP_ID`): each VM a fork of its saved state, on its own overlay,
  given an identity of its own once it answers.
- `NoGuests`: a real host on a control plane wired without a guest runtime
  (unit tests): its VMs fail at start, saying so.

`guest_kind` picks one per (host, image); it is the only place that asks what
a host or an image is, and each kind's `plan` the only place a start is planned.
What a kind decided when a VM was made stays on its row (its SSH address), so
reaching the guest later (`reach`) asks no host again.
"""

from __future__ import annotations

from hypervisor.base import ImageError
from hypervisor.qcow2 import KIND_QCOW2, image_kind
from hypervisor.snapshot_image import KIND_SNAPSHOT
from rift.services.context import Deps, Runtime
from rift.services.lifecycle.guest_kinds.base import (
    GuestKind,
    NotReady,
    Verdict,
    VmFiles,
    mac_of,
    reach,
    real_runtime,
    serial_log,
    vm_files,
)
from rift.services.lifecycle.guest_kinds.real import KernelGuest, Qcow2Guest, SnapshotGuest
from rift.services.lifecycle.guest_kinds.test_driver import NoGuests, TestDriverGuest
from rift.services.ports import Guests

TEST_DRIVERS = ("test", "fake")

__all__ = ["GuestKind", "KernelGuest", "NoGuests", "NotReady", "Qcow2Guest", "SnapshotGuest",
           "TestDriverGuest", "Verdict", "VmFiles", "guest_kind", "is_test_host", "kind_on",
           "mac_of", "reach", "serial_log", "usable", "vm_files"]


def is_test_host(uri: str) -> bool:
    """libvirt's test driver (or the in-memory fake): domains with no guest behind them.
    The driver is the URI scheme before any `+transport`: `test+unix:///default` is
    the test driver inside libvirtd, one host that every client (replica) shares."""
    driver = uri.split(":", 1)[0].split("+", 1)[0]
    return driver in TEST_DRIVERS


def guest_kind(uri: str, image: str, runtime: Runtime, guests: Guests) -> GuestKind:
    """The kind of VMs of `image` on the host at `uri`."""
    real = real_runtime(runtime)
    files = VmFiles(real)
    if is_test_host(uri):
        return TestDriverGuest(files)
    if real is None:
        return NoGuests()
    kind = image_kind(real.images_dir, image)
    if kind == KIND_QCOW2:
        return Qcow2Guest(uri, image, real, guests, files)
    if kind == KIND_SNAPSHOT:
        return SnapshotGuest(uri, image, real, guests, files)
    return KernelGuest(uri, image, real, guests, files)


def kind_on(deps: Deps, uri: str, image: str) -> GuestKind:
    """`guest_kind` with this control plane's guest runtime and shell."""
    return guest_kind(uri, image, deps.runtime, deps.guests)


def usable(kind: GuestKind) -> bool:
    """Whether the kind's image can start on its host (its check passes)."""
    try:
        kind.check()
    except ImageError:
        return False
    return True
