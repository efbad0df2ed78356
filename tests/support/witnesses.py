"""The witnesses the real-guest tests read (virsh, libvirt, the server's
database) and what they do behind Rift's back (domains Rift did not make)."""

from __future__ import annotations

import json
import secrets
import sqlite3
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypervisor.base import DomainRecord, DomainSpec
from hypervisor.domain_xml import build_domain_xml
from hypervisor.image_files import image_files
from tests.support.servers import REAL_URI, Server

LIVE = ("creating", "running")
# The event each VM status is recorded with: the last event a VM's row may show.
STATUS_EVENT = {"creating": "vm_creating", "running": "vm_running", "failed": "vm_failed",
                "destroyed": "vm_destroyed"}


# -- witnesses of real guests: libvirt, virsh and the server's database -------------------

def virsh_names() -> set[str]:
    """Every domain on the host, running or only defined (`virsh list --all`)."""
    out = subprocess.run(["virsh", "-c", REAL_URI, "list", "--all", "--name"],
                         capture_output=True, text=True, check=True, timeout=30).stdout
    return {line.strip() for line in out.splitlines() if line.strip()}


def virsh(*argv: str) -> None:
    done = subprocess.run(["virsh", "-c", REAL_URI, *argv], capture_output=True, text=True,
                          check=False, timeout=60)
    assert done.returncode == 0, f"virsh {' '.join(argv)}: {done.stderr.strip()}"


def rows(srv: Server, sql: str, *args: object) -> list[sqlite3.Row]:
    """Read the server's SQLite store (read-only; works while it runs and after a crash)."""
    conn = sqlite3.connect(f"file:{srv.data_dir / 'rift.db'}?mode=ro", uri=True, timeout=10)
    conn.row_factory = sqlite3.Row
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def install_id(srv: Server) -> str:
    return str(rows(srv, "SELECT value FROM meta WHERE key = 'install_id'")[0]["value"])


def pool_vm_ids(srv: Server) -> set[str]:
    """The ids of the pooled VMs (SPEC §11): their domains have no VM row by design."""
    return {r["id"] for r in rows(srv, "SELECT id FROM pool_vms")}


def vm_rows(srv: Server, task_id: str | None = None) -> dict[str, sqlite3.Row]:
    found = (rows(srv, "SELECT * FROM vms WHERE task_id = ?", task_id) if task_id
             else rows(srv, "SELECT * FROM vms"))
    return {r["id"]: r for r in found}


def events(srv: Server, task_id: str) -> list[tuple[str, str, dict[str, Any]]]:
    """(type, actor, details) of a task's events, in order."""
    return [(r["type"], r["actor"], json.loads(r["details"])) for r in
            rows(srv, "SELECT type, actor, details FROM events WHERE task_id = ? ORDER BY id",
                 task_id)]


def our_domains(srv: Server, uri: str = REAL_URI) -> dict[str, DomainRecord]:
    """This installation's domains on the host `uri`, by VM id (read from their metadata)."""
    from hypervisor.libvirt import LibvirtHypervisor  # libvirt-python, only when used

    hv = LibvirtHypervisor(uri)
    try:
        mine = install_id(srv)
        return {d.vm_id: d for d in hv.list_domains() if d.vm_id and d.install == mine}
    finally:
        hv.close()


@dataclass(frozen=True)
class Untruths:
    """What `assert_rows_tell_the_truth` refuses, one line per finding."""

    leaked: list[str]  # a domain of this installation with no live VM row
    lying: list[str]  # a `running` row whose domain is gone or shut off
    unrecorded: list[str]  # a task or VM row whose state has not its event

    def __bool__(self) -> bool:
        return bool(self.leaked or self.lying or self.unrecorded)


Events = dict[str, list[tuple[str, str, dict[str, Any]]]]


def _snapshot(srv: Server) -> tuple[dict[str, sqlite3.Row], dict[str, sqlite3.Row], Events]:
    """VM rows, task rows and every task's events, read in one transaction (one
    snapshot: a state change and its event commit together, so they agree here
    even while a sweep runs)."""
    conn = sqlite3.connect(f"file:{srv.data_dir / 'rift.db'}?mode=ro", uri=True, timeout=10,
                           isolation_level=None)
    conn.row_factory = sqlite3.Row
    try:
        conn.execute("BEGIN")
        vms = {r["id"]: r for r in conn.execute("SELECT * FROM vms")}
        tasks = {r["id"]: r for r in conn.execute("SELECT * FROM tasks")}
        told: Events = {task_id: [] for task_id in tasks}
        for r in conn.execute("SELECT task_id, type, actor, details FROM events ORDER BY id"):
            told.setdefault(r["task_id"], []).append(
                (r["type"], r["actor"], json.loads(r["details"])))
        conn.execute("COMMIT")
        return vms, tasks, told
    finally:
        conn.close()


def untruths(srv: Server, uri: str = REAL_URI) -> Untruths:
    """The promise, counted: every domain of this installation on `uri` has a live VM
    row or a pool row (and never both), every `running` row has its running domain,
    and every row's state has its event. Rows are read before the domains are
    listed (Rift takes a domain down before its row says so, so a sweep running
    meanwhile cannot make this see a leak) and again after (a row `running` on both
    sides of the listing had its domain then; a row made meanwhile accounts for its
    domain)."""
    pooled = pool_vm_ids(srv)  # before the VM rows: a hand-out moves an id from one to the other
    vms, tasks, told = _snapshot(srv)
    domains = our_domains(srv, uri)
    after = vm_rows(srv)
    # A row made while the domains were listed (the pool filler works on its own) is
    # read after: a domain is leaked only if no row accounted for it on either side.
    pooled_after = pool_vm_ids(srv)
    made_meanwhile = (set(after) - set(vms)) | pooled_after
    leaked = [f"{domain.name}: its row is {vms[vm_id]['status'] if vm_id in vms else 'missing'}"
              for vm_id, domain in domains.items()
              if vm_id not in pooled and vm_id not in made_meanwhile
              and (vm_id not in vms or vms[vm_id]["status"] not in LIVE)]
    leaked += [f"{domain.name}: misnamed for {vm_id}" for vm_id, domain in domains.items()
               if domain.name != f"rift-{vm_id}"]
    # A pooled VM is no one's: one still pooled after it was handed to a task was given twice.
    lying = [f"{vm_id} is a task's and still pooled" for vm_id in pooled & set(after)
             if vm_id in pooled_after]
    still = {vm_id for vm_id, vm in after.items() if vm["status"] == "running"}
    lying += [f"{vm_id} runs without a running domain" for vm_id, vm in vms.items()
             if vm["status"] == "running" and vm_id in still
             and not (vm_id in domains and domains[vm_id].active)]
    unrecorded = []
    by_task: dict[str, list[sqlite3.Row]] = {}
    for vm in vms.values():
        by_task.setdefault(vm["task_id"], []).append(vm)
    for task_id, task in tasks.items():
        kinds = [kind for kind, _, _ in told[task_id]]
        if (kinds[:1] != ["opened"] or kinds.count("closed") != (task["status"] == "closed")
                or not _lease_told(task, told[task_id])):
            unrecorded.append(f"{task_id} ({task['status']}, lease {task['lease_gen']}, "
                              f"held by {task['holder']}): {kinds}")
        for vm in by_task.get(task_id, []):
            of_vm = [kind for kind, _, details in told[task_id]
                     if details.get("vm_id") == vm["id"] and kind in STATUS_EVENT.values()]
            if (of_vm[:1] != ["vm_creating"] or of_vm[-1] != STATUS_EVENT[vm["status"]]
                    or not _in_order(of_vm)
                    or (vm["ready_at"] is not None and "vm_running" not in of_vm)):
                unrecorded.append(f"{vm['id']} ({vm['status']}): {of_vm}")
    return Untruths(leaked, lying, unrecorded)


LEASE_EVENTS = ("attached", "taken_over", "released", "closed")  # each moves lease_gen on


def _lease_told(task: sqlite3.Row, told: list[tuple[str, str, dict[str, Any]]]) -> bool:
    """Every lease change of the task (its generation moves on with each) has its
    event, and the holder is the actor of the last event that gave it the task."""
    changes = [(kind, actor) for kind, actor, _ in told if kind in ("opened", *LEASE_EVENTS)]
    if task["lease_gen"] != len(changes):
        return False
    last_kind, last_actor = changes[-1] if changes else ("", "")
    holder = last_actor if last_kind in ("opened", "attached", "taken_over") else None
    return bool(task["holder"] == holder)


def _in_order(of_vm: list[str]) -> bool:
    """A VM's events follow its life, each at most once: creating, then running,
    then failed, then destroyed (any of the last three may be missing)."""
    life = list(STATUS_EVENT.values())
    steps = [life.index(kind) for kind in of_vm]
    return steps == sorted(set(steps))


def assert_rows_tell_the_truth(srv: Server, uri: str = REAL_URI) -> None:
    """The promise (see `untruths`): no leaked domain, no lying row, no state
    without its event."""
    found = untruths(srv, uri)
    assert not found.leaked, f"leaked domains: {found.leaked}"
    assert not found.lying, f"lying rows: {found.lying}"
    assert not found.unrecorded, f"rows without their event: {found.unrecorded}"


def foreign_domain(image_dir: Path, work: Path, install: str, vm_id: str) -> DomainSpec:
    """A `tiny` domain with Rift metadata, made the way Rift makes them, but by no Rift."""
    image = image_files(image_dir, "tiny")
    return DomainSpec(name=f"rift-{vm_id}", task_id="task_zzzzzzzz", vm_id=vm_id, vcpus=1,
                      memory_mib=128, image="tiny", domain_type="qemu",
                      kernel=str(image.kernel), initrd=str(image.initrd),
                      cmdline=image.cmdline_base, serial_log=str(work / f"{vm_id}.log"),
                      install=install)


def define_and_start(spec: DomainSpec, work: Path, *, persistent: bool = True) -> None:
    """Behind Rift's back: `virsh define` + `virsh start`, or `virsh create` (a
    transient domain, started as it is made: a sweep cannot come in between)."""
    xml = work / f"{spec.name}.xml"
    xml.write_text(build_domain_xml(spec))
    if persistent:
        virsh("define", str(xml))
        virsh("start", spec.name)
    else:
        virsh("create", str(xml))


def remove_domain(name: str) -> None:
    if name in virsh_names():
        subprocess.run(["virsh", "-c", REAL_URI, "destroy", name], capture_output=True,
                       timeout=60, check=False)
        # with its managed save, if it sleeps: libvirt refuses to undefine it otherwise
        subprocess.run(["virsh", "-c", REAL_URI, "undefine", name, "--managed-save"],
                       capture_output=True, timeout=60, check=False)


def new_vm_id() -> str:
    alphabet = "abcdefghijklmnopqrstuvwxyz234567"
    return "vm_" + "".join(secrets.choice(alphabet) for _ in range(8))
