"""The copies a move puts on its destination (`rift host drain --move`), recorded
before they are made, so that those of a drain killed mid-copy go.

A move between machines puts files on the destination before the migration: the
VM's own files (an empty overlay the migration fills; rift.services.lifecycle.
guest_kinds' `receive`) and its volumes' (rift.services.operator.volume_moves'
`carry`, and `move_detached_far` for the volumes no VM holds). Each is recorded
first in one journal (a meta key: kind, id, the destination's URI, the process
that writes it, when) and settled once the rows name the destination. A drain
killed before that leaves its copies and their entries; every reconciliation
(`rift serve` at its start and in each sweep) takes the entries whose process is
gone and removes each copy that no row references, then its entry:

- a VM's files at a URI are referenced while its row is live on a host of that
  machine (hosts of one machine share a folder) or marked moving; on this
  machine, while its row is live at all (a VM of a host elsewhere has its files
  made here first), and they go with it (reconciliation's `remove_dead_disks`);
- a volume's file at a URI is referenced while its row names a host of that
  machine, or while a live entry (another drain's) names the same copy.

The check and the removal run in one write transaction that first takes the
journal by compare-and-set and reads each row locked, so a drain beginning meanwhile
(it records its entry, then marks its VM) waits for it: a file a row or a running
drain references is never removed. A removal the host refuses keeps its entry for
the next sweep. A process is gone when, on this machine, no process has its id
and start time; a process of another machine (a replica's) after a day.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit

from hypervisor.base import HypervisorError, ImageError, elsewhere
from rift.domain.clock import iso
from rift.services.context import Deps
from rift.services.lifecycle.guest_kinds import vm_files
from rift.services.lifecycle.teardown import host_uri, in_move
from rift.services.ports import Tx

KEY = "moves.copies"
OTHER_MACHINE_S = 86_400  # an entry of another machine's process is taken after this


@dataclass(frozen=True)
class Copy:
    kind: str  # "vm" (its own files) or "volume" (its file)
    ref: str  # the VM's or the volume's id
    uri: str  # the destination host's libvirt URI
    by: str = ""  # the process that made it: machine/pid/start time
    at: str = ""  # when it was recorded (ISO 8601)

    def key(self) -> tuple[str, str, str]:
        return self.kind, self.ref, self.uri


def _start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return fields[19] if len(fields) > 19 else None  # field 22: its start, in ticks


def writer() -> str:
    """This process, as the journal names it."""
    return f"{socket.gethostname()}/{os.getpid()}/{_start_time(os.getpid())}"


def _gone(copy: Copy, now: datetime) -> bool:
    machine, pid, started = copy.by.rsplit("/", 2)
    if machine != socket.gethostname():
        return now - datetime.fromisoformat(copy.at.replace("Z", "+00:00")) \
            > timedelta(seconds=OTHER_MACHINE_S)
    return not pid.isdigit() or _start_time(int(pid)) != started


def _read(tx: Tx) -> tuple[str | None, list[Copy]]:
    raw = tx.meta.get(KEY)
    return raw, [Copy(*entry) for entry in json.loads(raw)] if raw else []


def _write(tx: Tx, raw: str | None, copies: list[Copy]) -> bool:
    value = json.dumps([[c.kind, c.ref, c.uri, c.by, c.at] for c in copies])
    return tx.meta.swap(KEY, raw, value)


def record(deps: Deps, copies: list[Copy]) -> None:
    """Before the copies are made: each recorded as this process's."""
    made = [Copy(c.kind, c.ref, c.uri, writer(), iso(deps.clock.now()) or "") for c in copies]
    while True:
        with deps.store.write() as tx:
            raw, found = _read(tx)
            if _write(tx, raw, found + made):
                return


def settle(deps: Deps, copies: list[Copy]) -> None:
    """The rows name the copies' host now (or nothing was copied): this process's
    entries for them go."""
    keys, me = {c.key() for c in copies}, writer()
    while True:
        with deps.store.write() as tx:
            raw, found = _read(tx)
            if _write(tx, raw, [c for c in found if c.key() not in keys or c.by != me]):
                return


def _machine(uri: str | None) -> str | None:
    """Which machine a host's files are on: "" for this one, the SSH host else."""
    if uri is None:
        return None
    return (urlsplit(uri).hostname or "") if elsewhere(uri) else ""


def _verdict(deps: Deps, tx: Tx, copy: Copy, live: list[Copy]) -> str:
    """"remove" the copy, "drop" the entry only (referenced, or a running drain's
    copy now), or "keep" it for a later sweep (its VM is still marked moving)."""
    if any(c.key() == copy.key() for c in live):
        return "drop"
    if copy.kind == "vm":
        vm = tx.vms.get(copy.ref, lock=True)
        if vm is not None and in_move(deps, vm):
            return "keep"
        if vm is not None and vm.is_live and not elsewhere(copy.uri):
            return "drop"  # this machine keeps a live VM's files (remove_dead_disks')
        owner = vm.host if vm is not None and vm.is_live else None
    else:
        volume = tx.volumes.get(copy.ref, lock=True)
        owner = volume.host if volume is not None else None
    if owner is None:
        return "remove"  # no row references any copy of it
    machine = _machine(host_uri(tx, owner))  # None: its host is unknown, so kept
    return "drop" if machine is None or machine == _machine(copy.uri) else "remove"


def _remove(deps: Deps, copy: Copy) -> None:
    if copy.kind == "volume":
        deps.volume_files.remove(copy.uri, copy.ref)
    elif elsewhere(copy.uri):
        deps.host_files.forget(copy.uri, copy.ref)
    else:
        vm_files(deps).remove(copy.ref)


def remove_stray_copies(deps: Deps) -> list[str]:
    """The copies of moves whose process is gone that no row references are removed
    (each `kind:id@uri`), and the entries of those processes go."""
    with deps.store.read() as tx:
        _, found = _read(tx)
    now = deps.clock.now()
    removed: list[str] = []
    for copy in (c for c in found if _gone(c, now)):
        with deps.store.write() as tx:
            raw, current = _read(tx)
            if copy not in current or not _write(tx, raw, [c for c in current if c != copy]):
                continue  # settled, or taken by another sweep: the next looks again
            verdict = _verdict(deps, tx, copy, [c for c in current if not _gone(c, now)])
            if verdict == "keep":
                tx.meta.swap(KEY, tx.meta.get(KEY), raw or "[]")  # for a later sweep
            if verdict != "remove":
                continue
            try:
                _remove(deps, copy)
            except (OSError, ImageError, HypervisorError) as exc:
                tx.meta.swap(KEY, tx.meta.get(KEY), raw or "[]")  # for the next sweep
                deps.log.warning("a stray copy of a move stays", extra={
                    "copy": f"{copy.kind}:{copy.ref}@{copy.uri}", "error": str(exc)})
                continue
            removed.append(f"{copy.kind}:{copy.ref}@{copy.uri}")
    if removed:
        deps.log.warning("copies a killed move left removed", extra={"copies": removed})
    return removed
