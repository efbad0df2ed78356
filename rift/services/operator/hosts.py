"""Hosts: libvirt connections with a capacity that VMs are placed on."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

from hypervisor.base import HypervisorError
from rift.domain.errors import HypervisorFailed, InvalidArgument
from rift.domain.model import Host
from rift.domain.store_errors import DuplicateKey
from rift.services.context import Deps

LOCAL = "local"
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")


# The oldest libvirt Rift runs guests on (Debian 12's): managed saves whose XML it
# rewrites, the save image header it re-heads for forks.
MIN_LIBVIRT = (9, 0, 0)
PROBE_TIMEOUT_S = 30.0  # for a host's libvirt to answer `rift host add`
_VERSIONS = re.compile(r"^libvirt (\d+)\.(\d+)\.(\d+) (\S+) ")


def _capacity(deps: Deps, uri: str, vcpus: int | None, memory_mib: int | None,
              probe: bool = True) -> tuple[int, int]:
    """The host's size (what its libvirt reports, unless given), once it answered
    (without `probe`, a size given whole is taken as it is)."""
    if not probe and vcpus is not None and memory_mib is not None:
        return vcpus, memory_mib
    hv = deps.hosts.hypervisor(uri)
    # libvirt's connect blocks (an SSH to an address that drops packets waits for TCP
    # to give up): the answer is bounded, and a connect still under way is left to end.
    asking = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rift-host-probe")
    try:
        info, versions = asking.submit(lambda: (hv.info(), hv.versions())).result(
            PROBE_TIMEOUT_S)
    except HypervisorError as exc:
        raise HypervisorFailed(_why_not(uri, exc.message)) from exc
    except FutureTimeout:
        raise HypervisorFailed(f"{uri}: the host does not answer (nothing within "
                               f"{PROBE_TIMEOUT_S:.0f} s)") from None
    finally:
        asking.shutdown(wait=False)
    found = _VERSIONS.match(versions)
    if found and found.group(4) in ("qemu", "kvm"):
        have = tuple(int(part) for part in found.groups()[:3])
        if have < MIN_LIBVIRT:
            raise InvalidArgument("uri", f"{uri} runs {versions}; Rift needs libvirt "
                                  f"{'.'.join(map(str, MIN_LIBVIRT))} or newer there "
                                  "(Debian 12's; the ansible hypervisor role installs it)")
    offered = int(info.vcpus * deps.limits.cpu_overcommit)
    return vcpus or offered, memory_mib or info.memory_mib


def _why_not(uri: str, words: str) -> str:
    """libvirt's words when a host does not let Rift in, with which it is first."""
    lowered = words.lower()
    if "permission denied" in lowered or "authentication" in lowered:
        return f"{uri}: the host refused the SSH key ({words})"
    if any(w in lowered for w in ("connection refused", "no route", "timed out",
                                  "unreachable", "could not resolve", "connection reset",
                                  "no such file", "failed to connect")):
        return f"{uri}: the host does not answer ({words})"
    return f"{uri}: {words}"


@dataclass(frozen=True)
class HostSize:
    """What an operator says of a host's size; what is left out is asked of libvirt."""

    vcpus: int | None = None
    memory_mib: int | None = None


def add_host(deps: Deps, name: str, uri: str, size: HostSize | None = None,
             probe: bool | None = None) -> Host:
    """Add a host once its libvirt answered and is new enough; nothing is added else.
    A host given its whole size (`vcpus` and `memory_mib`, as the ansible role gives
    it, possibly before its libvirtd runs) is added without asking, unless `probe`."""
    vcpus, memory_mib = (size.vcpus, size.memory_mib) if size is not None else (None, None)
    if probe is None:
        probe = vcpus is None or memory_mib is None
    if not _NAME_RE.match(name):
        raise InvalidArgument("name", "1–64 of a-z 0-9 _ . -, starting with a letter or digit")
    if "://" not in uri:
        raise InvalidArgument("uri", "a libvirt URI such as qemu:///system or test:///default")
    for field, value in (("vcpus", vcpus), ("memory_mib", memory_mib)):
        if value is not None and value < 1:
            raise InvalidArgument(field, "must be at least 1")
    cpus, mem = _capacity(deps, uri, vcpus, memory_mib, probe)
    host = Host(name, uri, cpus, mem, False, deps.clock.now())
    with deps.store.write() as tx:
        if tx.hosts.get(name) is not None:
            raise InvalidArgument("name", f"a host {name!r} exists already")
        tx.hosts.add(host)
    return host


def ensure_local_host(deps: Deps, uri: str, vcpus: int | None = None,
                      memory_mib: int | None = None) -> Host:
    """A fresh install has one host, `local`, on `RIFT_HYPERVISOR_URI`; a changed
    URI or size is taken up at start."""
    with deps.store.read() as tx:
        current = tx.hosts.get(LOCAL)
    if current is None:
        try:
            return add_host(deps, LOCAL, uri, HostSize(vcpus, memory_mib), probe=False)
        except (InvalidArgument, DuplicateKey):  # another replica added it a moment ago
            pass
    cpus, mem = _capacity(deps, uri, vcpus, memory_mib, probe=False)
    with deps.store.write() as tx:
        current = tx.hosts.get(LOCAL, lock=True)
        assert current is not None  # read above, or added a moment ago by another replica
        host = current.resized(uri, cpus, mem)
        tx.hosts.save(host, current)
    return host


def list_hosts(deps: Deps) -> list[dict[str, Any]]:
    with deps.store.read() as tx:
        hosts = tx.hosts.all()
        usage = tx.fleet.usage_by_host()
        pooled = tx.pool_vms.usage_by_host()
        members = tx.pool_vms.all()
        snaps = tx.snapshots.bytes_by_host()
        paused = {h.name: sum(1 for vm in tx.fleet.live_on_host(h.name) if vm.status == "paused")
                  for h in hosts}
    rows = []
    for h in hosts:
        used = usage.get(h.name)
        held = pooled.get(h.name)  # running pool VMs hold room too (SPEC §11)
        rows.append({
            "name": h.name, "uri": h.uri, "vcpus": h.vcpus, "memory_mib": h.memory_mib,
            "used_vcpus": (used.vcpus if used else 0) + (held.vcpus if held else 0),
            "used_memory_mib": (used.memory_mib if used else 0) + (held.memory_mib if held else 0),
            "vms": used.vms if used else 0,
            "pooled": sum(1 for m in members if m.host == h.name),
            "paused": paused[h.name],  # holding only their disk and saved memory
            "snapshots": snaps.get(h.name, (0, 0))[0],
            "snapshot_mib": round(snaps.get(h.name, (0, 0))[1] / (1 << 20)),
            "state": h.state,
            "unreachable_since": h.unreachable_since.isoformat() if h.unreachable_since else None,
            "last_error": h.last_error,
        })
    return rows


def drain_host(deps: Deps, name: str, drained: bool = True) -> Host:
    with deps.store.write() as tx:
        current = tx.hosts.get(name, lock=True)
        if current is None:
            raise InvalidArgument("name", f"no host {name!r}; rift host list shows them")
        host = current.set_drain(drained)
        tx.hosts.save(host, current)
    return host


def remove_host(deps: Deps, name: str) -> None:
    with deps.store.write() as tx:
        if tx.hosts.get(name) is None:
            raise InvalidArgument("name", f"no host {name!r}; rift host list shows them")
        live = tx.fleet.live_on_host(name)
        if live:
            raise InvalidArgument("name", f"host {name!r} still has {len(live)} VMs; "
                                  f"rift host drain {name} --move moves the running ones to "
                                  "other hosts (or wait for their tasks to close)")
        kept = tx.snapshots.bytes_by_host().get(name, (0, 0))[0]
        if kept:
            raise InvalidArgument("name", f"host {name!r} still keeps {kept} snapshots; "
                                  "they go with their tasks: rift host drain it and wait for "
                                  "them to close")
        volumes = tx.volumes.on_host(name)
        if volumes:
            raise InvalidArgument("name", f"host {name!r} still keeps {len(volumes)} volumes "
                                  "(their files are there); they go only with "
                                  "rift_volume_delete (rift volume list --user USER)")
        pooled = [m for m in tx.pool_vms.all() if m.host == name]
        if pooled:
            raise InvalidArgument("name", f"host {name!r} still keeps {len(pooled)} pooled VMs; "
                                  "rift pool clear their images (rift pool list) first")
        tx.hosts.delete(name)
