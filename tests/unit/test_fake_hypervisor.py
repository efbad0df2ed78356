"""FakeHypervisor keeps the Hypervisor contract in memory, and fails on demand."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from hypervisor import (
    DomainRecord,
    DomainSpec,
    FakeHypervisor,
    HostInfo,
    Hypervisor,
    HypervisorError,
    open_hypervisor,
    parse_rift_metadata,
)


def spec(n: int = 1) -> DomainSpec:
    return DomainSpec(
        name=f"rift-vm_{n:08d}",
        task_id="task_1",
        vm_id=f"vm_{n:08d}",
        vcpus=1,
        memory_mib=128,
        image="tiny",
    )


def test_the_fake_satisfies_the_hypervisor_protocol() -> None:
    hypervisor: Hypervisor = FakeHypervisor()
    assert hypervisor.uri == "fake:///"


def test_the_fake_reports_the_size_it_was_given() -> None:
    assert FakeHypervisor(vcpus=4, memory_mib=2048).info() == HostInfo("fake", 4, 2048)


def test_a_created_domain_is_listed_running_with_its_metadata() -> None:
    fake = FakeHypervisor()
    fake.create(spec(1))
    assert fake.list_domains() == [DomainRecord("rift-vm_00000001", "task_1", "vm_00000001", True)]
    domain = fake.domains["rift-vm_00000001"]
    assert domain.spec == spec(1)
    assert domain.xml is not None and parse_rift_metadata(domain.xml) == ("task_1", "vm_00000001")


def test_destroy_removes_the_domain_and_says_so_once() -> None:
    fake = FakeHypervisor()
    fake.create(spec(1))
    assert fake.destroy("rift-vm_00000001") is True
    assert fake.destroy("rift-vm_00000001") is False
    assert fake.list_domains() == []


def test_destroying_a_domain_that_never_existed_returns_false() -> None:
    assert FakeHypervisor().destroy("rift-vm_nothing") is False


def test_a_second_domain_of_the_same_name_is_refused_and_the_first_is_kept() -> None:
    fake = FakeHypervisor()
    fake.create(spec(1))
    with pytest.raises(HypervisorError) as caught:
        fake.create(dataclasses.replace(spec(1), vm_id="vm_other"))
    assert caught.value.op == "define"
    assert "already exists" in caught.value.message
    assert [d.vm_id for d in fake.list_domains()] == ["vm_00000001"]


def test_an_injected_create_failure_raises_and_leaves_nothing() -> None:
    fake = FakeHypervisor()
    fake.fail_next_create("internal error: qemu unexpectedly closed the monitor")
    with pytest.raises(HypervisorError) as caught:
        fake.create(spec(1))
    assert caught.value.message == "internal error: qemu unexpectedly closed the monitor"
    assert fake.domains == {}
    fake.create(spec(1))
    assert list(fake.domains) == ["rift-vm_00000001"]


def test_create_failures_can_be_injected_several_times_in_a_row() -> None:
    fake = FakeHypervisor()
    fake.fail_next_create("no", times=2)
    for _ in range(2):
        with pytest.raises(HypervisorError):
            fake.create(spec(1))
    fake.create(spec(1))
    assert len(fake.domains) == 1


def test_an_injected_destroy_failure_keeps_the_domain_until_healed() -> None:
    fake = FakeHypervisor()
    fake.create(spec(1))
    fake.fail_destroy("Failed to terminate process 4242 with SIGKILL")
    for _ in range(2):
        with pytest.raises(HypervisorError) as caught:
            fake.destroy("rift-vm_00000001")
        assert caught.value.op == "destroy"
    assert "rift-vm_00000001" in fake.domains
    fake.fail_destroy(None)
    assert fake.destroy("rift-vm_00000001") is True


def test_a_bad_spec_raises_value_error_and_leaves_nothing() -> None:
    fake = FakeHypervisor()
    with pytest.raises(ValueError, match="domain name"):
        fake.create(dataclasses.replace(spec(1), name="bad name"))
    assert fake.domains == {}


def test_foreign_domains_are_listed_with_whatever_metadata_they_carry() -> None:
    fake = FakeHypervisor()
    fake.add_foreign_domain("rift-vm_orphan", "task_gone", "vm_orphan")
    fake.add_foreign_domain("someone-elses", None, None, active=False)
    assert fake.list_domains() == [
        DomainRecord("rift-vm_orphan", "task_gone", "vm_orphan", True),
        DomainRecord("someone-elses", None, None, False),
    ]
    assert fake.domains["rift-vm_orphan"].spec is None


def test_tests_can_stop_a_domain_behind_rifts_back() -> None:
    fake = FakeHypervisor()
    fake.create(spec(1))
    fake.domains["rift-vm_00000001"].active = False
    assert fake.list_domains()[0].active is False


def test_the_fake_records_its_calls_in_order() -> None:
    fake = FakeHypervisor()
    fake.create(spec(1))
    fake.destroy("rift-vm_00000001")
    fake.list_domains()
    assert fake.calls == [
        ("create", "rift-vm_00000001"),
        ("destroy", "rift-vm_00000001"),
        ("list", ""),
    ]


def test_a_closed_fake_opens_again_on_use() -> None:
    fake = FakeHypervisor()
    fake.create(spec(1))
    fake.close()
    assert fake.closed
    assert [d.name for d in fake.list_domains()] == ["rift-vm_00000001"]
    assert not fake.closed


def test_many_threads_creating_and_destroying_leave_nothing_behind() -> None:
    fake = FakeHypervisor()
    errors: list[BaseException] = []

    def churn(worker: int) -> None:
        try:
            for i in range(200):
                one = spec(worker * 1000 + i)
                fake.create(one)
                assert fake.destroy(one.name)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=churn, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert errors == []
    assert fake.domains == {}


def test_a_saved_domain_is_listed_saved_and_restores_running() -> None:
    fake = FakeHypervisor()
    fake.create(spec(1))
    fake.save("rift-vm_00000001")
    assert fake.list_domains() == [
        DomainRecord("rift-vm_00000001", "task_1", "vm_00000001", active=False, saved=True)]
    fake.restore("rift-vm_00000001")
    assert fake.list_domains() == [
        DomainRecord("rift-vm_00000001", "task_1", "vm_00000001", active=True, saved=False)]


def test_restore_is_refused_unless_the_domain_is_saved() -> None:
    fake = FakeHypervisor()
    fake.create(spec(1))
    with pytest.raises(HypervisorError, match="is running, not saved") as running:
        fake.restore("rift-vm_00000001")
    assert running.value.op == "restore"
    fake.domains["rift-vm_00000001"].active = False  # stopped, never saved
    with pytest.raises(HypervisorError, match="has no saved state"):
        fake.restore("rift-vm_00000001")
    with pytest.raises(HypervisorError, match="not running") as stopped:
        fake.save("rift-vm_00000001")
    assert stopped.value.op == "save"
    assert fake.list_domains()[0].active is False


def test_save_restore_and_set_owner_of_a_missing_domain_are_refused() -> None:
    fake = FakeHypervisor()
    for call, op in ((fake.save, "save"), (fake.restore, "restore"),
                     (lambda name: fake.set_owner(name, "task_2"), "set_owner")):
        with pytest.raises(HypervisorError, match="Domain not found") as caught:
            call("rift-vm_nothing")
        assert caught.value.op == op


def test_destroying_a_saved_domain_leaves_nothing() -> None:
    fake = FakeHypervisor()
    fake.create(spec(1))
    fake.save("rift-vm_00000001")
    assert fake.destroy("rift-vm_00000001") is True
    assert fake.list_domains() == []


def test_set_owner_changes_the_task_in_the_listing_and_the_xml() -> None:
    fake = FakeHypervisor()
    fake.create(dataclasses.replace(spec(1), install="inst_1"))
    fake.save("rift-vm_00000001")
    fake.set_owner("rift-vm_00000001", "task_2")
    fake.restore("rift-vm_00000001")
    assert fake.list_domains() == [
        DomainRecord("rift-vm_00000001", "task_2", "vm_00000001", True, install="inst_1")]
    xml = fake.domains["rift-vm_00000001"].xml
    assert xml is not None and parse_rift_metadata(xml) == ("task_2", "vm_00000001")


def test_set_owner_refuses_a_domain_without_rift_metadata() -> None:
    fake = FakeHypervisor()
    fake.add_foreign_domain("someone-elses", None, None)
    with pytest.raises(HypervisorError, match="carries no Rift metadata"):
        fake.set_owner("someone-elses", "task_2")


def test_injected_save_restore_and_set_owner_failures_change_nothing() -> None:
    fake = FakeHypervisor()
    fake.create(spec(1))
    fake.fail_next("save", "internal error: unable to execute QEMU command 'migrate'")
    with pytest.raises(HypervisorError, match="migrate") as caught:
        fake.save("rift-vm_00000001")
    assert caught.value.op == "save"
    fake.save("rift-vm_00000001")
    fake.fail_next("restore", "operation failed: job 'domain restore' failed", times=2)
    fake.fail_next("set_owner", "no")
    for _ in range(2):
        with pytest.raises(HypervisorError, match="domain restore"):
            fake.restore("rift-vm_00000001")
    with pytest.raises(HypervisorError, match="no"):
        fake.set_owner("rift-vm_00000001", "task_2")
    assert fake.list_domains() == [
        DomainRecord("rift-vm_00000001", "task_1", "vm_00000001", False, saved=True)]
    fake.restore("rift-vm_00000001")
    assert fake.calls[-1] == ("restore", "rift-vm_00000001")


def test_the_fakes_versions_are_constant_until_a_test_changes_them() -> None:
    fake = FakeHypervisor()
    assert fake.versions() == fake.versions() == "libvirt 0.0.0 fake 0.0.0"
    fake.version = "libvirt 11.3.0 qemu 10.0.0"
    assert fake.versions() == "libvirt 11.3.0 qemu 10.0.0"


def test_a_fake_uri_opens_a_fake_hypervisor() -> None:
    hypervisor = open_hypervisor("fake:///unit")
    assert isinstance(hypervisor, FakeHypervisor)
    assert hypervisor.uri == "fake:///unit"
