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

from hypervisor.domain_xml import RIFT_XMLNS, parse_rift_mark  # noqa: E402
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


# -- saved state, ownership and versions (pools of ready VMs) --------------------------

def record(hv: Hypervisor, name: str) -> DomainRecord:
    return {r.name: r for r in hv.list_domains()}[name]


@pytest.fixture(params=["default", "private"])
def tapped(request: pytest.FixtureRequest,
           tmp_path: Path) -> Iterator[tuple[LibvirtHypervisor, Any]]:
    """A hypervisor and its own libvirt connection (a private host's state is seen
    through that connection only), to look at domains behind the adapter's back."""
    uri = ("test:///default" if request.param == "default"
           else write_test_host_xml(str(tmp_path / "node.xml"), vcpus=6, memory_mib=3072))
    opened: list[Any] = []

    def opener(u: str) -> Any:
        opened.append(libvirt.open(u))
        return opened[-1]

    hv = LibvirtHypervisor(uri, opener=opener)
    hv.info()
    yield hv, opened[0]
    hv.close()


def test_a_saved_domain_is_listed_stopped_and_saved_then_restored_running(
    hypervisor: LibvirtHypervisor,
) -> None:
    one = spec(install="inst_it")
    hypervisor.create(one)
    assert record(hypervisor, one.name).saved is False
    hypervisor.save(one.name)
    assert record(hypervisor, one.name) == DomainRecord(
        one.name, "task_it", one.vm_id, active=False, install="inst_it", saved=True)
    hypervisor.restore(one.name)
    assert record(hypervisor, one.name) == DomainRecord(
        one.name, "task_it", one.vm_id, active=True, install="inst_it", saved=False)
    hypervisor.destroy(one.name)


def test_restore_without_a_saved_state_is_refused_and_boots_nothing(
    tapped: tuple[LibvirtHypervisor, Any],
) -> None:
    hypervisor, conn = tapped
    one = spec()
    hypervisor.create(one)
    with pytest.raises(HypervisorError) as running:
        hypervisor.restore(one.name)
    assert (running.value.op, running.value.message) == (
        "restore", f"domain '{one.name}' is running, not saved")
    conn.lookupByName(one.name).destroy()  # stopped, never saved
    with pytest.raises(HypervisorError) as stopped:
        hypervisor.restore(one.name)
    assert (stopped.value.op, stopped.value.message) == (
        "restore", f"domain '{one.name}' has no saved state")
    assert record(hypervisor, one.name).active is False
    hypervisor.destroy(one.name)


def test_save_and_restore_of_a_missing_domain_raise_in_libvirts_words(
    hypervisor: LibvirtHypervisor,
) -> None:
    for call, op in ((hypervisor.save, "save"), (hypervisor.restore, "restore"),
                     (lambda name: hypervisor.set_owner(name, "task_x"), "set_owner")):
        with pytest.raises(HypervisorError) as caught:
            call("rift-vm_neverwas")
        assert caught.value.op == op
        assert caught.value.code == libvirt.VIR_ERR_NO_DOMAIN
        assert caught.value.message  # "Domain not found" here; qemu names the domain


def test_saving_a_stopped_domain_is_refused_in_libvirts_words(
    hypervisor: LibvirtHypervisor,
) -> None:
    one = spec()
    hypervisor.create(one)
    hypervisor.save(one.name)
    with pytest.raises(HypervisorError) as caught:
        hypervisor.save(one.name)
    assert caught.value.op == "save"
    assert "not running" in caught.value.message
    assert caught.value.code == libvirt.VIR_ERR_OPERATION_INVALID
    hypervisor.destroy(one.name)


def test_destroying_a_saved_domain_leaves_nothing_not_even_its_saved_state(
    hypervisor: LibvirtHypervisor,
) -> None:
    one = spec()
    hypervisor.create(one)
    hypervisor.save(one.name)
    assert hypervisor.destroy(one.name) is True
    assert one.name not in names(hypervisor)
    hypervisor.create(one)  # the same name again: no saved state came back with it
    assert record(hypervisor, one.name).saved is False
    with pytest.raises(HypervisorError, match="is running, not saved"):
        hypervisor.restore(one.name)
    hypervisor.destroy(one.name)


def test_a_driver_that_refuses_every_undefine_flag_still_loses_the_saved_state(
    tmp_path: Path,
) -> None:
    class Refusing(libvirt.libvirtError):
        def get_error_code(self) -> int:
            return int(libvirt.VIR_ERR_NO_SUPPORT)

    class Picky(Relay):
        def undefineFlags(self, flags: int = 0) -> int:
            if flags:
                raise Refusing("this function is not supported by the connection driver")
            return int(self.inner.undefineFlags(0))

    class Connection(Relay):
        def lookupByName(self, name: str) -> Picky:
            return Picky(self.inner.lookupByName(name))

    uri = write_test_host_xml(str(tmp_path / "node.xml"), vcpus=2, memory_mib=1024)
    hv = LibvirtHypervisor(uri, opener=lambda u: Connection(libvirt.open(u)))
    one = spec()
    hv.create(one)
    hv.save(one.name)
    assert hv.destroy(one.name) is True
    assert hv.list_domains() == []
    hv.close()


@pytest.mark.parametrize("state", ["running", "stopped", "saved"])
def test_set_owner_changes_the_task_and_keeps_vm_image_and_install(
    tapped: tuple[LibvirtHypervisor, Any], state: str,
) -> None:
    hypervisor, conn = tapped
    one = spec(install="inst_it")
    hypervisor.create(one)
    if state == "stopped":
        conn.lookupByName(one.name).destroy()
    elif state == "saved":
        hypervisor.save(one.name)
    hypervisor.set_owner(one.name, "task_new")
    listed = record(hypervisor, one.name)
    assert (listed.task_id, listed.vm_id, listed.install) == ("task_new", one.vm_id, "inst_it")
    dom = conn.lookupByName(one.name)
    marks = {parse_rift_mark(dom.XMLDesc(flags)) for flags in (0, libvirt.VIR_DOMAIN_XML_INACTIVE)}
    assert marks == {("task_new", one.vm_id, "inst_it")}  # live and persistent alike
    assert 'image="tiny"' in dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, RIFT_XMLNS, 0)
    if state == "saved":
        hypervisor.restore(one.name)
    elif state == "stopped":
        dom.create()
    assert record(hypervisor, one.name).task_id == "task_new"  # and after it starts
    hypervisor.destroy(one.name)


def test_set_owner_takes_hostile_task_ids_and_refuses_ones_xml_cannot_carry(
    tmp_path: Path,
) -> None:
    hv = private_host(tmp_path)
    one = spec()
    hv.create(one)
    hostile = "t\"<&>'\n</rift:vm>"
    hv.set_owner(one.name, hostile)
    assert record(hv, one.name).task_id == hostile
    with pytest.raises(HypervisorError) as caught:
        hv.set_owner(one.name, "task_\x00")
    assert caught.value.op == "set_owner"
    assert record(hv, one.name).task_id == hostile
    hv.close()


def test_set_owner_refuses_a_domain_without_rift_metadata() -> None:
    hv = LibvirtHypervisor("test:///default")
    with pytest.raises(HypervisorError) as caught:
        hv.set_owner("test", "task_x")  # the default host's own domain
    assert caught.value.op == "set_owner"
    assert "carries no Rift metadata" in caught.value.message
    assert record(hv, "test").task_id is None
    hv.close()


def test_versions_name_libvirt_and_the_driver_and_stay_the_same(tmp_path: Path) -> None:
    hv = private_host(tmp_path)
    conn = libvirt.open(hv.uri)
    lib = conn.getLibVersion()
    dotted = f"{lib // 1_000_000}.{lib // 1000 % 1000}.{lib % 1000}"
    first = hv.versions()
    assert first.startswith(f"libvirt {dotted} test ")
    hv.close()
    assert hv.versions() == first == LibvirtHypervisor("test:///default").versions()
