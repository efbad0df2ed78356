"""Domain XML building, Rift metadata reading, and host placement: pure functions."""

from __future__ import annotations

import dataclasses
import xml.etree.ElementTree as ET

import pytest

from hypervisor import (
    QEMU_XMLNS,
    RIFT_XMLNS,
    DomainSpec,
    HostLoad,
    build_domain_xml,
    choose_host,
    largest_free,
    parse_rift_metadata,
)
from hypervisor.domain_xml import (
    domain_xml_with_ssh_port,
    domain_xml_with_task,
    parse_rift_mark,
    rift_mark_with_task,
)


def parse(xml: str) -> ET.Element:
    return ET.fromstring(xml)  # noqa: S314 - our own output, no DTD


SPEC = DomainSpec(
    name="rift-vm_k3v9x2m7",
    task_id="task_abc123",
    vm_id="vm_k3v9x2m7",
    vcpus=2,
    memory_mib=256,
    image="tiny",
)
GUEST = dataclasses.replace(
    SPEC,
    domain_type="qemu",
    kernel="/var/lib/rift/images/tiny/vmlinux",
    initrd="/var/lib/rift/images/tiny/initrd.img",
    cmdline="console=ttyS0 quiet",
    ssh_port=40022,
    serial_log="/var/lib/rift/serial/vm_k3v9x2m7.log",
)


# A managed save image's XML as libvirt 9.0 writes it (trimmed), for the rewrite.
LIBVIRT_XML = """<domain type='qemu' xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'>
  <name>rift-vm_k3v9x2m7</name>
  <metadata>
    <rift:vm xmlns:rift="https://rift.dev/xmlns/domain/1" task="task_old" vm="vm_k3v9x2m7" \
image="tiny" install="inst_1"/>
  </metadata>
  <qemu:commandline>
    <qemu:arg value='-netdev'/>
    <qemu:arg value='user,id=n0,hostfwd=tcp:127.0.0.1:40022-:22'/>
  </qemu:commandline>
</domain>
"""


def test_the_rift_mark_takes_a_new_task_and_keeps_vm_image_and_install() -> None:
    for source in (build_domain_xml(dataclasses.replace(SPEC, install="inst_1")),
                   '<vm task="task_abc123" vm="vm_k3v9x2m7" image="tiny" install="inst_1"/>'):
        mark = rift_mark_with_task(source, "task_new")
        element = parse(mark)
        assert element.tag == "vm"
        assert element.attrib == {"task": "task_new", "vm": "vm_k3v9x2m7", "image": "tiny",
                                  "install": "inst_1"}


def test_a_new_mark_is_refused_without_rift_metadata_or_for_a_task_xml_cannot_carry() -> None:
    with pytest.raises(ValueError, match="no Rift metadata"):
        rift_mark_with_task("<domain><name>other</name></domain>", "task_new")
    with pytest.raises(ValueError, match="cannot carry"):
        rift_mark_with_task(build_domain_xml(SPEC), "task_\x01")


def test_a_whole_domain_xml_changes_in_its_task_only() -> None:
    changed = domain_xml_with_task(LIBVIRT_XML, "task_new")
    assert changed == LIBVIRT_XML.replace('task="task_old"', 'task="task_new"')
    assert parse_rift_mark(changed) == ("task_new", "vm_k3v9x2m7", "inst_1")


def test_a_hostile_task_is_escaped_in_the_rewritten_domain_xml() -> None:
    hostile = "t\"<&>'\n</rift:vm>"
    changed = domain_xml_with_task(LIBVIRT_XML, hostile)
    assert parse_rift_mark(changed) == (hostile, "vm_k3v9x2m7", "inst_1")
    assert changed.count("<rift:vm ") == 1 and "</rift:vm>" not in changed


def test_a_domain_xml_without_one_rift_element_is_not_rewritten() -> None:
    with pytest.raises(ValueError, match="no single Rift metadata element"):
        domain_xml_with_task("<domain><name>other</name></domain>", "task_new")
    foreign = LIBVIRT_XML.replace("https://rift.dev/xmlns/domain/1", "https://example.org/x")
    with pytest.raises(ValueError, match="no single Rift metadata element"):
        domain_xml_with_task(foreign, "task_new")


def test_metadata_written_into_a_domain_reads_back_as_task_and_vm() -> None:
    assert parse_rift_metadata(build_domain_xml(SPEC)) == ("task_abc123", "vm_k3v9x2m7")


def test_metadata_sits_in_the_rift_namespace_inside_the_metadata_element() -> None:
    root = parse(build_domain_xml(SPEC))
    element = root.find(f"metadata/{{{RIFT_XMLNS}}}vm")
    assert element is not None
    assert element.get("task") == "task_abc123"
    assert element.get("vm") == "vm_k3v9x2m7"


def test_metadata_is_read_from_the_bare_element_libvirt_returns() -> None:
    assert parse_rift_metadata('<vm task="t&amp;1" vm="v1"/>') == ("t&1", "v1")


def test_a_domain_without_rift_metadata_reads_as_none() -> None:
    xml = (
        "<domain type='test'><name>test</name><metadata><x:y xmlns:x='urn:x'/></metadata></domain>"
    )
    assert parse_rift_metadata(xml) == (None, None)
    assert parse_rift_metadata("<domain type='test'><name>test</name></domain>") == (None, None)


def test_unreadable_or_entity_laden_xml_reads_as_no_metadata() -> None:
    assert parse_rift_metadata("not xml <") == (None, None)
    bomb = (
        '<!DOCTYPE d [<!ENTITY a "aaaaaaaaaa">]>'
        f'<domain><metadata><rift:vm xmlns:rift="{RIFT_XMLNS}" task="&a;" vm="v"/>'
        "</metadata></domain>"
    )
    assert parse_rift_metadata(bomb) == (None, None)


def test_hostile_values_are_escaped_and_survive_the_round_trip() -> None:
    hostile = "x\"/><evil a='1'>&amp;</evil>\n\t<!--"
    spec = dataclasses.replace(GUEST, task_id=hostile, vm_id="<vm>&", cmdline=hostile)
    xml = build_domain_xml(spec)
    root = parse(xml)
    assert root.find(".//evil") is None
    assert parse_rift_metadata(xml) == (hostile, "<vm>&")
    assert root.findtext("os/cmdline") == hostile


def test_characters_xml_cannot_carry_are_refused() -> None:
    with pytest.raises(ValueError, match="task_id"):
        build_domain_xml(dataclasses.replace(SPEC, task_id="a\x00b"))


@pytest.mark.parametrize(
    "name", ["", "a b", "a/b", "../etc", "a;rm", "ä", "-flag", ".hidden", "x" * 201, "a\nb"]
)
def test_names_outside_the_safe_alphabet_are_rejected(name: str) -> None:
    with pytest.raises(ValueError, match="domain name"):
        build_domain_xml(dataclasses.replace(SPEC, name=name))


def test_names_from_the_safe_alphabet_are_accepted() -> None:
    for name in ("rift-vm_k3v9x2m7", "a", "A.b-c_9"):
        assert (
            parse(build_domain_xml(dataclasses.replace(SPEC, name=name))).findtext("name") == name
        )


@pytest.mark.parametrize(
    "spec",
    [
        dataclasses.replace(SPEC, vcpus=0),
        dataclasses.replace(SPEC, memory_mib=0),
        dataclasses.replace(SPEC, domain_type="xen"),
        dataclasses.replace(GUEST, ssh_port=0),
        dataclasses.replace(GUEST, ssh_port=70000),
    ],
)
def test_impossible_sizes_types_and_ports_are_rejected(spec: DomainSpec) -> None:
    with pytest.raises(ValueError, match=r"vcpus|memory_mib|domain_type|ssh_port"):
        build_domain_xml(spec)


def test_the_test_driver_domain_is_minimal_with_memory_in_kib() -> None:
    root = parse(build_domain_xml(SPEC))
    assert root.get("type") == "test"
    assert root.findtext("memory") == str(256 * 1024)
    memory = root.find("memory")
    assert memory is not None and memory.get("unit") == "KiB"
    assert root.findtext("vcpu") == "2"
    assert root.findtext("os/type") == "hvm"
    assert root.find("devices") is None
    assert f"{{{QEMU_XMLNS}}}commandline" not in {child.tag for child in root}


def test_the_qemu_guest_boots_the_kernel_on_q35_with_rng_and_serial_log() -> None:
    root = parse(build_domain_xml(GUEST))
    assert root.get("type") == "qemu"
    os_type = root.find("os/type")
    assert os_type is not None and os_type.get("machine") == "q35"
    assert root.findtext("os/kernel") == GUEST.kernel
    assert root.findtext("os/initrd") == GUEST.initrd
    assert root.findtext("os/cmdline") == GUEST.cmdline
    rng = root.find("devices/rng")
    assert rng is not None and rng.get("model") == "virtio"
    serial_source = root.find("devices/serial/source")
    assert serial_source is not None and serial_source.get("path") == GUEST.serial_log


def test_the_qemu_guest_forwards_a_loopback_port_to_ssh_through_user_networking() -> None:
    xml = build_domain_xml(GUEST)
    assert f'xmlns:qemu="{QEMU_XMLNS}"' in xml
    root = parse(xml)
    args = [arg.get("value") for arg in root.iter(f"{{{QEMU_XMLNS}}}arg")]
    assert args == [
        "-netdev",
        "user,id=n0,hostfwd=tcp:127.0.0.1:40022-:22",
        "-device",
        "virtio-net-pci,netdev=n0,addr=0x10",
    ]


def test_a_guest_whose_egress_is_none_has_a_restricted_user_network() -> None:
    xml = build_domain_xml(dataclasses.replace(GUEST, restrict=True))
    args = [arg.get("value") for arg in parse(xml).iter(f"{{{QEMU_XMLNS}}}arg")]
    assert args[1] == "user,id=n0,restrict=on,hostfwd=tcp:127.0.0.1:40022-:22"


def test_a_guest_with_an_egress_allowlist_runs_its_qemu_in_the_proxied_group() -> None:
    plain = parse(build_domain_xml(GUEST))
    assert plain.find("seclabel") is None
    root = parse(build_domain_xml(dataclasses.replace(GUEST, proxied=True, qemu_uid=994)))
    label = root.find("seclabel")
    assert label is not None and label.attrib == {"type": "static", "model": "dac",
                                                  "relabel": "yes"}
    # as the host's QEMU user (its DAC base label's uid), never a root chosen here
    assert label.findtext("label") == "+994:rift-proxied"
    with pytest.raises(ValueError, match="qemu_uid"):
        build_domain_xml(dataclasses.replace(GUEST, proxied=True))
    args = [arg.get("value") for arg in root.iter(f"{{{QEMU_XMLNS}}}arg")]
    assert "restrict=on" not in str(args[1])  # the firewall, not QEMU, keeps it to the proxy


def test_a_migrations_destination_xml_forwards_another_ssh_port_and_keeps_the_rest() -> None:
    xml = build_domain_xml(GUEST)
    moved = domain_xml_with_ssh_port(xml, 41000)
    assert moved == xml.replace("127.0.0.1:40022-:22", "127.0.0.1:41000-:22") != xml
    bare = build_domain_xml(dataclasses.replace(GUEST, ssh_port=None))
    assert domain_xml_with_ssh_port(bare, 41000) == bare  # no guest behind it


def test_a_guest_without_a_port_or_log_has_no_network_or_serial() -> None:
    xml = build_domain_xml(dataclasses.replace(GUEST, ssh_port=None, serial_log=None))
    assert "qemu:" not in xml
    assert parse(xml).find("devices/serial") is None


@pytest.mark.parametrize(
    ("field", "spec"),
    [
        ("kernel", dataclasses.replace(GUEST, kernel="images/vmlinux")),
        ("initrd", dataclasses.replace(GUEST, initrd="images/initrd.img")),
        ("serial_log", dataclasses.replace(GUEST, serial_log="serial.log")),
    ],
)
def test_relative_paths_for_the_guest_are_rejected(field: str, spec: DomainSpec) -> None:
    with pytest.raises(ValueError, match=field):
        build_domain_xml(spec)


def test_kvm_guests_pass_the_host_cpu_through() -> None:
    root = parse(build_domain_xml(dataclasses.replace(GUEST, domain_type="kvm")))
    assert root.get("type") == "kvm"
    cpu = root.find("cpu")
    assert cpu is not None and cpu.get("mode") == "host-passthrough"


def test_a_guest_gets_its_cpu_weight_a_quota_per_vcpu_and_one_core_for_its_other_threads(
) -> None:
    from hypervisor.base import CpuLimits

    root = parse(build_domain_xml(dataclasses.replace(GUEST, cpu=CpuLimits(512, 0.5))))
    tune = root.find("cputune")
    assert tune is not None
    assert [(child.tag, child.text) for child in tune] == [
        ("shares", "512"), ("period", "100000"), ("quota", "50000"),
        ("emulator_period", "100000"), ("emulator_quota", "100000")]
    # libvirt's schema wants cputune after vcpu and before os.
    tags = [child.tag for child in root]
    assert tags.index("vcpu") < tags.index("cputune") < tags.index("os")


@pytest.mark.parametrize(("limits", "want"), [
    ((512, 0.0), [("shares", "512")]),
    ((0, 0.25), [("period", "100000"), ("quota", "25000"), ("emulator_period", "100000"),
                 ("emulator_quota", "100000")]),
    ((1, 0.001), [("shares", "2"), ("period", "100000"), ("quota", "1000"),
                  ("emulator_period", "100000"), ("emulator_quota", "100000")]),
])
def test_each_cpu_limit_is_written_alone_and_within_what_libvirt_takes(
        limits: tuple[int, float], want: list[tuple[str, str]]) -> None:
    from hypervisor.base import CpuLimits

    root = parse(build_domain_xml(dataclasses.replace(GUEST, cpu=CpuLimits(*limits))))
    tune = root.find("cputune")
    assert tune is not None and [(child.tag, child.text) for child in tune] == want


def test_no_limits_or_the_test_driver_write_no_cputune() -> None:
    from hypervisor.base import CpuLimits

    for spec in (GUEST, dataclasses.replace(GUEST, cpu=CpuLimits()),
                 dataclasses.replace(SPEC, cpu=CpuLimits(512, 0.5))):
        assert parse(build_domain_xml(spec)).find("cputune") is None
    for weight, quota in ((-1, 0.5), (262145, 0.5), (512, 1.5), (512, -0.1)):
        with pytest.raises(ValueError, match="CPU"):
            CpuLimits(weight, quota)


def test_a_host_without_a_cpu_cgroup_starts_guests_without_limits() -> None:
    import libvirt

    from hypervisor.base import CpuLimits
    from hypervisor.libvirt import LibvirtHypervisor

    class Refused(libvirt.libvirtError):
        def get_error_code(self) -> int:
            return int(libvirt.VIR_ERR_CONFIG_UNSUPPORTED)

        def get_error_message(self) -> str:
            return "unsupported configuration: cgroup cpu is required for scheduler tuning"

    class Domain:
        def create(self) -> int:
            return 0

    class Conn:
        def __init__(self) -> None:
            self.defined: list[str] = []

        def isAlive(self) -> int:
            return 1

        def defineXMLFlags(self, xml: str, _flags: int) -> Domain:
            if "<cputune>" in xml:
                raise Refused("refused")
            self.defined.append(xml)
            return Domain()

    conn = Conn()
    hv = LibvirtHypervisor("qemu:///system", opener=lambda _u: conn, cpu=CpuLimits(512, 0.5))
    hv.create(GUEST)
    hv.create(dataclasses.replace(GUEST, name="rift-vm_second1"))
    assert len(conn.defined) == 2 and hv.cpu is None  # asked once, then never again
    assert all("<cputune>" not in xml for xml in conn.defined)


# placement


def host(
    name: str,
    *,
    vcpus: int = 8,
    memory_mib: int = 8192,
    used_vcpus: int = 0,
    used_memory_mib: int = 0,
    drained: bool = False,
) -> HostLoad:
    return HostLoad(name, vcpus, memory_mib, used_vcpus, used_memory_mib, drained)


def test_placement_picks_the_host_with_the_most_free_memory() -> None:
    hosts = [host("a", used_memory_mib=4096), host("b", used_memory_mib=1024), host("c")]
    chosen = choose_host(hosts, vcpus=1, memory_mib=512)
    assert chosen is not None and chosen.name == "c"


def test_placement_skips_drained_hosts_however_empty() -> None:
    hosts = [host("big", memory_mib=65536, drained=True), host("small", used_memory_mib=6000)]
    chosen = choose_host(hosts, vcpus=1, memory_mib=512)
    assert chosen is not None and chosen.name == "small"


def test_placement_skips_a_roomy_host_without_enough_free_vcpus() -> None:
    hosts = [host("roomy", used_vcpus=8), host("busy", used_memory_mib=7000)]
    chosen = choose_host(hosts, vcpus=1, memory_mib=512)
    assert chosen is not None and chosen.name == "busy"


def test_placement_returns_none_when_nothing_fits() -> None:
    hosts = [host("a", used_memory_mib=8000), host("b", vcpus=1, used_vcpus=1)]
    assert choose_host(hosts, vcpus=1, memory_mib=512) is None
    assert choose_host([], vcpus=1, memory_mib=1) is None
    assert choose_host([host("d", drained=True)], vcpus=1, memory_mib=1) is None


def test_placement_fills_a_host_exactly() -> None:
    chosen = choose_host([host("a", used_vcpus=6, used_memory_mib=7936)], vcpus=2, memory_mib=256)
    assert chosen is not None and chosen.name == "a"


def test_placement_breaks_ties_by_host_name() -> None:
    hosts = [host("zulu"), host("alpha"), host("mike")]
    chosen = choose_host(hosts, vcpus=1, memory_mib=512)
    assert chosen is not None and chosen.name == "alpha"


def test_largest_free_reports_the_roomiest_undrained_host() -> None:
    hosts = [
        host("a", used_vcpus=2, used_memory_mib=4096),
        host("b", used_vcpus=7, used_memory_mib=1024),
        host("c", memory_mib=65536, drained=True),
    ]
    assert largest_free(hosts) == (1, 7168)


def test_largest_free_is_zero_without_hosts_and_never_negative() -> None:
    assert largest_free([]) == (0, 0)
    assert largest_free([host("d", drained=True)]) == (0, 0)
    assert largest_free([host("over", used_vcpus=9, used_memory_mib=9000)]) == (0, 0)


def test_the_qemu_user_of_a_host_is_read_off_its_dac_base_label() -> None:
    from hypervisor.base import HypervisorError
    from hypervisor.libvirt import LibvirtHypervisor

    class Conn:
        def __init__(self, caps: str) -> None:
            self.caps = caps

        def isAlive(self) -> int:
            return 1

        def getCapabilities(self) -> str:
            return self.caps

    caps = ("<capabilities><host><secmodel><model>none</model><doi>0</doi></secmodel>"
            "<secmodel><model>dac</model><doi>0</doi><baselabel type='kvm'>+994:+993"
            "</baselabel><baselabel type='qemu'>+994:+993</baselabel></secmodel></host>"
            "</capabilities>")
    assert LibvirtHypervisor("qemu:///system", opener=lambda _u: Conn(caps)).qemu_uid() == 994
    bare = LibvirtHypervisor("test:///default", opener=lambda _u: Conn(
        "<capabilities><host><secmodel><model>testSecurity</model></secmodel></host>"
        "</capabilities>"))
    with pytest.raises(HypervisorError, match="DAC base label"):
        bare.qemu_uid()
