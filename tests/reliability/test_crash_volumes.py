"""Crashes amid a volume's attach and detach (issue 30, SPEC §18), in the crash
campaign: `kill -9` of `rift serve` while `rift_vm_attach_volume` hot-plugs a
volume into a `tiny` guest (its attachment `attaching`) and while
`rift_vm_detach_volume` takes it out (`detaching`), then a restart on the same
data dir with a short creating grace, so that the sweep settles the cut change
soon. Once it has: every attachment row is `attached` and its VM's domain holds
that volume's disk; no domain of the installation holds a volume's disk that no
row knows; no volume has two writers; and the volume takes a writer again (the
VM whose attach was cut, or a second VM while the first holds it: `volume_busy`).
Each kill comes a random few tens of milliseconds into the change (the seed is
printed; `RIFT_CRASH_SEED=N` replays it); how many kills found the change still
under way is recorded.

A long form (`make soak`): a restart and the grace take half a minute a trial;
`make test` covers the same settling on fakes (tests/unit/test_volume_settle.py).
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import libvirt
import pytest

from tests.support import campaign
from tests.support.mcp_clients import call, mcp_session, refused, run
from tests.support.real_guests import RealSettings, Rig
from tests.support.servers import REAL_URI, Server, real_vms_missing, wait_until
from tests.support.soak import long_form
from tests.support.witnesses import our_domains, rows

pytestmark = [
    pytest.mark.skipif(real_vms_missing() is not None, reason=real_vms_missing() or ""),
    pytest.mark.slow,
]

SECTION = "Crashes"
ENV = {"RIFT_VM_BOOT_TIMEOUT_S": "60", "RIFT_SWEEP_INTERVAL_S": "1"}
RECOVER_ENV = {"RIFT_VM_BOOT_TIMEOUT_S": "10", "RIFT_VM_CREATING_GRACE_S": "11"}
SETTLE_S = 60  # the grace, a sweep or two, an unplug on a busy machine
LIMIT_S = 120
TRIALS = campaign.scale(1, 3)  # each: a kill mid-attach, then one mid-detach


def campaign_seed() -> int:
    seed = int(os.environ.get("RIFT_CRASH_SEED") or random.SystemRandom().randrange(2**32))
    print(f"crash campaign seed: RIFT_CRASH_SEED={seed}")
    return seed


def _attachments(srv: Server) -> list[dict[str, Any]]:
    return [dict(r) for r in rows(srv, "SELECT * FROM volume_attachments")]


def _plugged(srv: Server) -> dict[str, set[str]]:
    """Each domain of the installation (by VM id): the volumes its live XML holds."""
    conn = libvirt.open(REAL_URI)
    try:
        found = {}
        for vm_id, record in our_domains(srv).items():
            root = ET.fromstring(conn.lookupByName(record.name).XMLDesc(0))  # noqa: S314 - libvirt's own XML
            found[vm_id] = {s.text for s in root.iter("serial")
                            if s.text and s.text.startswith("vol_")}
        return found
    finally:
        conn.close()


def the_promise(srv: Server) -> list[str]:
    """What breaks it, one line each; read until the rows did not move meanwhile."""
    deadline = time.monotonic() + 30
    while True:
        held = _attachments(srv)
        plugged = _plugged(srv)
        if held == _attachments(srv):
            break
        assert time.monotonic() < deadline, "no reading within 30 s in which no row moved"
    broken = [f"{a['volume_id']} on {a['vm_id']} is still {a['state']}" for a in held
              if a["state"] != "attached"]
    broken += [f"{a['vm_id']}'s domain lacks {a['volume_id']}" for a in held
               if a["volume_id"] not in plugged.get(a["vm_id"], set())]
    known = {(a["vm_id"], a["volume_id"]) for a in held}
    broken += [f"{vm_id}'s domain holds {vol}, which no row knows"
               for vm_id, vols in plugged.items() for vol in vols if (vm_id, vol) not in known]
    writers: dict[str, int] = {}
    for a in held:
        writers[a["volume_id"]] = writers.get(a["volume_id"], 0) + (not a["read_only"])
    broken += [f"{vol} has {n} writers" for vol, n in writers.items() if n > 1]
    return broken


class Home:
    def __init__(self, rig: Rig) -> None:
        self.rig = rig
        self.ids: dict[str, str] = {}

    @property
    def srv(self) -> Server:
        return self.rig.server

    def state(self) -> str | None:
        found = [a["state"] for a in _attachments(self.srv)
                 if (a["vm_id"], a["volume_id"]) == (self.ids["vm"], self.ids["vol"])]
        return found[0] if found else None

    def kill_and_restart(self, change: str) -> bool:
        """kill -9 and a restart; wait until the sweep settled what the kill cut."""
        self.rig.kill()
        at_kill = self.state()
        self.rig.restart(**RECOVER_ENV)
        wait_until(lambda: all(a["state"] == "attached" for a in _attachments(self.srv)),
                   SETTLE_S, f"reconciliation settling the cut {change}")
        return at_kill == change

    def call(self, tool: str, **args: Any) -> dict[str, Any]:
        srv = self.srv

        async def one() -> dict[str, Any]:
            async with mcp_session(srv.url, srv.token, "crashy") as s:
                return await call(s, tool, **args)

        return run(one, LIMIT_S)

    def mount(self, tool: str, **args: Any) -> threading.Thread:
        """`tool` on the VM and volume, in a thread (the kill cuts it: the point)."""
        worker = threading.Thread(target=_swallow, daemon=True, args=(lambda: self.call(
            tool, handle=self.ids["handle"], vm_id=self.ids["vm"], volume_id=self.ids["vol"],
            **args),))
        worker.start()
        return worker


@long_form("tests/unit/test_volume_settle.py settles cut attaches and detaches on fakes")
def test_kill_9_mid_attach_and_mid_detach_leaves_no_unknown_disk_and_one_writer(
        tmp_path: Path) -> None:
    rng = random.Random(campaign_seed())
    cut = {"attaching": 0, "detaching": 0}
    with Rig.started(tmp_path, RealSettings(env=ENV)) as rig:
        home = Home(rig)
        made = home.call("rift_task_new", name="crash amid volumes")
        handle = made["handle"]
        vms = [home.call("rift_vm_new", handle=handle, image="tiny")["vm"]["id"]
               for _ in range(2)]
        vol = home.call("rift_volume_new", name="work", size_gib=1)["volume"]["id"]
        home.ids.update(handle=handle, vm=vms[0], vol=vol)
        for trial in range(TRIALS):
            worker = home.mount("rift_vm_attach_volume", path="/work")
            wait_until(lambda: home.state() is not None, LIMIT_S, "the attach begins",
                       every_s=0.002)
            time.sleep(rng.uniform(0, 0.1))
            cut["attaching"] += home.kill_and_restart("attaching")
            worker.join(30)
            assert not worker.is_alive(), "the cut attach hangs"
            assert the_promise(home.srv) == [], f"mid-attach, trial {trial}"
            if home.state() is None:  # settled toward detached: it takes a writer again
                home.call("rift_vm_attach_volume", handle=handle, vm_id=vms[0],
                          volume_id=vol, path="/work")
            _second_writer_refused(home, vms)
            worker = home.mount("rift_vm_detach_volume")
            wait_until(lambda: home.state() in ("detaching", None), LIMIT_S,
                       "the detach begins", every_s=0.002)
            time.sleep(rng.uniform(0, 0.1))
            cut["detaching"] += home.kill_and_restart("detaching")
            worker.join(30)
            assert not worker.is_alive(), "the cut detach hangs"
            assert the_promise(home.srv) == [], f"mid-detach, trial {trial}"
            assert home.state() is None, "a cut detach settles toward detached"
        campaign.record(SECTION, "real-guest kills mid-attach / mid-detach of a volume that "
                        f"found the change under way (of {TRIALS} each)",
                        f"{cut['attaching']} / {cut['detaching']}")
        home.call("rift_task_close", handle=handle)
        assert home.call("rift_volume_get", volume_id=vol)["volume"]["attached_to"] == []
        assert our_domains(home.srv, REAL_URI) == {}


def _second_writer_refused(home: Home, vms: list[str]) -> None:
    srv = home.srv

    async def second() -> None:
        async with mcp_session(srv.url, srv.token, "crashy") as s:
            busy = await refused(s, "volume_busy", "rift_vm_attach_volume",
                                 handle=home.ids["handle"], vm_id=vms[1],
                                 volume_id=home.ids["vol"], path="/work")
            assert busy["vm_id"] == vms[0], busy

    run(second, LIMIT_S)


def _swallow(call_it: Any) -> None:
    with contextlib.suppress(BaseException):  # a call cut by the kill fails, as it should
        call_it()
