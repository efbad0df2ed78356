"""LibvirtHypervisor against libvirt's in-process test driver: real libvirt, no daemon.

Runs on the shared `test:///default` host (which starts with a domain named
"test" that is not ours) and on private hosts sized by a node XML file.
"""

from __future__ import annotations

import dataclasses
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hypervisor import (
    DomainRecord,
    DomainSpec,
    HostInfo,
    Hypervisor,
    HypervisorError,
    open_hypervisor,
    write_test_host_xml,
)

libvirt = pytest.importorskip("libvirt")

from hypervisor.libvirt import LibvirtHypervisor  # noqa: E402 - needs libvirt, checked above


def spec(**changes: Any) -> DomainSpec:
    vm_id = f"vm_{uuid.uuid4().hex[:8]}"
    base = DomainSpec(
        name=f"rift-{vm_id}", task_id="task_it", vm_id=vm_id, vcpus=1, memory_mib=128, image="tiny"
    )
    return dataclasses.replace(base, **changes)


class Relay:
    """Passes every call to a real libvirt object; tests override the calls they bend."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def private_host(tmp_path: Path, vcpus: int = 6, memory_mib: int = 3072, **kw: Any) -> Any:
    uri = write_test_host_xml(str(tmp_path / "node.xml"), vcpus=vcpus, memory_mib=memory_mib)
    return LibvirtHypervisor(uri, **kw)


@pytest.fixture(params=["default", "private"])
def hypervisor(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LibvirtHypervisor]:
    if request.param == "default":
        hv = LibvirtHypervisor("test:///default")
    else:
        hv = private_host(tmp_path)
    yield hv
    hv.close()


def names(hv: Hypervisor) -> set[str]:
    return {record.name for record in hv.list_domains()}


def test_a_created_domain_is_listed_with_its_metadata_then_destroyed(
    hypervisor: LibvirtHypervisor,
) -> None:
    one = spec()
    hypervisor.create(one)
    assert DomainRecord(one.name, "task_it", one.vm_id, True) in hypervisor.list_domains()
    assert hypervisor.destroy(one.name) is True
    assert one.name not in names(hypervisor)


def test_destroying_a_missing_domain_returns_false(hypervisor: LibvirtHypervisor) -> None:
    assert hypervisor.destroy("rift-vm_neverwas") is False


def test_destroy_twice_is_harmless(hypervisor: LibvirtHypervisor) -> None:
    one = spec()
    hypervisor.create(one)
    assert hypervisor.destroy(one.name) is True
    assert hypervisor.destroy(one.name) is False


def test_a_duplicate_name_is_refused_in_libvirts_words_and_keeps_the_first(
    hypervisor: LibvirtHypervisor,
) -> None:
    first = spec()
    hypervisor.create(first)
    before = hypervisor.list_domains()
    with pytest.raises(HypervisorError) as caught:
        hypervisor.create(dataclasses.replace(first, vm_id="vm_intruder"))
    assert caught.value.op == "define"
    assert f"domain '{first.name}' already exists" in caught.value.message
    assert caught.value.code == libvirt.VIR_ERR_OPERATION_FAILED
    assert set(hypervisor.list_domains()) == set(before)
    hypervisor.destroy(first.name)


def test_a_start_libvirt_refuses_after_define_leaves_nothing_defined(tmp_path: Path) -> None:
    class StartsTwice(Relay):
        """Start, then start again: libvirt refuses the second with the domain running."""

        def create(self) -> int:
            self.inner.create()
            return int(self.inner.create())

    class Connection(Relay):
        def defineXMLFlags(self, xml: str, flags: int = 0) -> StartsTwice:
            return StartsTwice(self.inner.defineXMLFlags(xml, flags))

    uri = write_test_host_xml(str(tmp_path / "node.xml"), vcpus=2, memory_mib=1024)
    hv = LibvirtHypervisor(uri, opener=lambda u: Connection(libvirt.open(u)))
    with pytest.raises(HypervisorError) as caught:
        hv.create(spec())
    assert caught.value.op == "start"
    assert "already running" in caught.value.message
    assert hv.list_domains() == []
    hv.close()


def test_the_private_host_reports_the_size_its_node_xml_gives(tmp_path: Path) -> None:
    hv = private_host(tmp_path, vcpus=12, memory_mib=24576)
    assert hv.info() == HostInfo(driver="test", vcpus=12, memory_mib=24576)
    hv.close()


def test_private_hosts_do_not_see_each_others_domains(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, b = private_host(tmp_path / "a"), private_host(tmp_path / "b")
    one = spec()
    a.create(one)
    assert names(a) == {one.name}
    assert names(b) == set()
    a.close()
    b.close()


def test_the_default_hosts_own_test_domain_is_listed_without_metadata_and_left_alone() -> None:
    hv = LibvirtHypervisor("test:///default")
    one = spec()
    hv.create(one)
    hv.destroy(one.name)
    records = {record.name: record for record in hv.list_domains()}
    assert records["test"].task_id is None
    assert records["test"].vm_id is None
    hv.close()


def test_hostile_metadata_values_survive_a_trip_through_libvirt(tmp_path: Path) -> None:
    hv = private_host(tmp_path)
    hostile = spec(task_id="t\"<&>'\n</rift:vm>", vm_id="vm_<&>")
    hv.create(hostile)
    assert hv.list_domains() == [DomainRecord(hostile.name, hostile.task_id, "vm_<&>", True)]
    hv.close()


def test_the_qemu_guest_xml_passes_libvirts_schema(tmp_path: Path) -> None:
    hv = private_host(tmp_path, validate=True)
    guest = spec(
        domain_type="qemu",
        kernel="/images/tiny/vmlinux",
        initrd="/images/tiny/initrd.img",
        cmdline="console=ttyS0 quiet",
        ssh_port=40022,
        serial_log=str(tmp_path / "serial.log"),
    )
    hv.create(guest)
    assert hv.list_domains() == [DomainRecord(guest.name, "task_it", guest.vm_id, True)]
    hv.close()


def test_with_validation_every_define_asks_libvirt_to_check_the_schema(tmp_path: Path) -> None:
    flags_seen: list[int] = []

    class Connection(Relay):
        def defineXMLFlags(self, xml: str, flags: int = 0) -> Any:
            flags_seen.append(flags)
            return self.inner.defineXMLFlags(xml, flags)

    uri = write_test_host_xml(str(tmp_path / "node.xml"), vcpus=2, memory_mib=1024)
    for validate in (True, False):
        hv = LibvirtHypervisor(uri, validate=validate, opener=lambda u: Connection(libvirt.open(u)))
        hv.create(spec())
        hv.close()
    assert flags_seen == [libvirt.VIR_DOMAIN_DEFINE_VALIDATE, 0]


def test_a_domain_stopped_behind_rifts_back_is_listed_inactive_and_still_destroyed() -> None:
    hv = LibvirtHypervisor("test:///default")
    one = spec()
    hv.create(one)
    other = libvirt.open("test:///default")
    other.lookupByName(one.name).destroy()
    assert DomainRecord(one.name, "task_it", one.vm_id, False) in hv.list_domains()
    assert hv.destroy(one.name) is True
    assert one.name not in names(hv)
    other.close()
    hv.close()


def test_a_dead_connection_is_reopened_on_the_next_call(tmp_path: Path) -> None:
    class Mortal(Relay):
        alive = True

        def isAlive(self) -> int:
            return 1 if self.alive else 0

    opened: list[Mortal] = []

    def opener(uri: str) -> Mortal:
        opened.append(Mortal(libvirt.open(uri)))
        return opened[-1]

    uri = write_test_host_xml(str(tmp_path / "node.xml"), vcpus=2, memory_mib=1024)
    hv = LibvirtHypervisor(uri, opener=opener)
    assert hv.info().vcpus == 2
    assert hv.info().vcpus == 2
    assert len(opened) == 1
    opened[0].alive = False
    assert hv.info().vcpus == 2
    assert len(opened) == 2
    hv.close()


def test_a_closed_hypervisor_opens_again_on_use(tmp_path: Path) -> None:
    hv = private_host(tmp_path, vcpus=3)
    assert hv.info().vcpus == 3
    hv.close()
    hv.close()
    assert hv.info().vcpus == 3
    hv.close()


def test_a_host_libvirt_cannot_open_raises_in_libvirts_words(tmp_path: Path) -> None:
    hv = LibvirtHypervisor(f"test://{tmp_path}/missing.xml")
    with pytest.raises(HypervisorError) as caught:
        hv.info()
    assert caught.value.op == "open"
    assert caught.value.message


def test_many_threads_share_one_connection_and_leave_nothing(tmp_path: Path) -> None:
    hv = private_host(tmp_path)
    errors: list[BaseException] = []

    def churn() -> None:
        try:
            for _ in range(50):
                one = spec()
                hv.create(one)
                assert hv.destroy(one.name)
                hv.list_domains()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=churn) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert hv.list_domains() == []
    hv.close()


def test_open_hypervisor_gives_a_lazy_libvirt_hypervisor_for_libvirt_uris() -> None:
    hv = open_hypervisor("test:///default")
    assert isinstance(hv, LibvirtHypervisor)
    assert hv.info().driver == "test"
    hv.close()
