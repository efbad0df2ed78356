"""The connection pool: reuse, one call per connection, limits, and closing; and the
shell's refusals that need no guest."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest

from rift.domain.model import Vm
from rift.guest import GuestFileError, ShellSettings, SshGuestShell, key_for_task
from rift.guest.errors import GuestError
from rift.guest.pool import ConnectionPool

ADDRESS = ("127.0.0.1", 40022)


@dataclass(eq=False)
class FakeTransport:
    n: int
    active: bool = True
    closed: bool = False

    def is_active(self) -> bool:
        return self.active and not self.closed

    def close(self) -> None:
        self.closed = True


class Opener:
    def __init__(self, fail: bool = False) -> None:
        self.opened: list[FakeTransport] = []
        self.fail = fail

    def __call__(self, vm_id: str, address: tuple[str, int]) -> FakeTransport:
        if self.fail:
            raise GuestError("refused", vm_id=vm_id)
        transport = FakeTransport(len(self.opened))
        self.opened.append(transport)
        return transport


def test_a_connection_is_reused_by_the_next_call() -> None:
    opener = Opener()
    pool = ConnectionPool(opener)
    with pool.lease("vm_a", ADDRESS, 1) as first:
        pass
    with pool.lease("vm_a", ADDRESS, 1) as second:
        assert second is first
    assert len(opener.opened) == 1 and pool.count("vm_a") == 1


def test_concurrent_calls_get_connections_of_their_own() -> None:
    opener = Opener()
    pool = ConnectionPool(opener, per_vm=4)
    with pool.lease("vm_a", ADDRESS, 1) as a, pool.lease("vm_a", ADDRESS, 1) as b:
        assert a is not b
    assert pool.count("vm_a") == 2


def test_a_call_waits_for_a_connection_when_all_are_lent_and_gives_up_in_time() -> None:
    pool = ConnectionPool(Opener(), per_vm=1)
    with (pool.lease("vm_a", ADDRESS, 1), pytest.raises(GuestError, match="busy"),
          pool.lease("vm_a", ADDRESS, 0.05)):
        pass


def test_a_waiting_call_takes_the_connection_handed_back() -> None:
    pool = ConnectionPool(Opener(), per_vm=1)
    got: list[FakeTransport] = []
    with pool.lease("vm_a", ADDRESS, 1) as held:
        def wait_for_it() -> None:
            with pool.lease("vm_a", ADDRESS, 5) as t:
                got.append(t)

        waiter = threading.Thread(target=wait_for_it)
        waiter.start()
        waiter.join(0.1)
        assert waiter.is_alive()
    waiter.join(5)
    assert got == [held]


def test_a_dead_connection_is_replaced() -> None:
    opener = Opener()
    pool = ConnectionPool(opener)
    with pool.lease("vm_a", ADDRESS, 1) as first:
        pass
    first.active = False
    with pool.lease("vm_a", ADDRESS, 1) as second:
        assert second is not first
    assert first.closed and pool.count("vm_a") == 1


def test_a_call_that_raises_drops_its_connection() -> None:
    pool = ConnectionPool(Opener())
    with pytest.raises(RuntimeError), pool.lease("vm_a", ADDRESS, 1) as transport:
        raise RuntimeError("the session broke")
    assert transport.closed and pool.count("vm_a") == 0


def test_a_failed_connect_frees_its_place() -> None:
    opener = Opener(fail=True)
    pool = ConnectionPool(opener, per_vm=1)
    with pytest.raises(GuestError, match="refused"), pool.lease("vm_a", ADDRESS, 1):
        pass
    opener.fail = False
    with pool.lease("vm_a", ADDRESS, 1):
        pass


def test_closing_a_vm_closes_its_connections_even_those_lent() -> None:
    pool = ConnectionPool(Opener())
    with pool.lease("vm_a", ADDRESS, 1) as lent:
        with pool.lease("vm_a", ADDRESS, 1) as other:
            pass
        pool.close_vm("vm_a")
        assert lent.closed and other.closed
    assert pool.count("vm_a") == 0


def test_a_new_address_for_a_vm_retires_its_old_connections() -> None:
    pool = ConnectionPool(Opener())
    with pool.lease("vm_a", ADDRESS, 1) as old:
        pass
    with pool.lease("vm_a", ("127.0.0.1", 40023), 1) as new:
        assert new is not old
    assert old.closed


def test_only_a_few_idle_connections_are_kept() -> None:
    pool = ConnectionPool(Opener(), per_vm=4, keep_idle=1)
    with pool.lease("vm_a", ADDRESS, 1), pool.lease("vm_a", ADDRESS, 1):
        pass
    assert pool.count("vm_a") == 1


def test_an_added_connection_serves_the_first_call() -> None:
    opener = Opener()
    pool = ConnectionPool(opener)
    ready = FakeTransport(99)
    pool.add("vm_a", ADDRESS, ready)
    with pool.lease("vm_a", ADDRESS, 1) as transport:
        assert transport is ready
    assert opener.opened == []


def test_a_vm_whose_connect_stalls_makes_no_other_vms_call_wait() -> None:
    release = threading.Event()
    opened = Opener()

    def connect(vm_id: str, address: tuple[str, int]) -> FakeTransport:
        if vm_id == "vm_stuck":
            release.wait(10)  # a guest that never finishes its SSH handshake
        return opened(vm_id, address)

    pool = ConnectionPool(connect, per_vm=1)
    stuck = threading.Thread(target=lambda: pool.lease("vm_stuck", ADDRESS, 10).__enter__())
    stuck.start()
    try:
        began = time.monotonic()
        with pool.lease("vm_b", ("127.0.0.1", 40023), 1) as transport:
            assert transport.is_active()
        pool.close_vm("vm_b")
        assert time.monotonic() - began < 3.0  # behind the stuck one: 10 s
    finally:
        release.set()
        stuck.join(5)


def test_close_closes_every_vm() -> None:
    pool = ConnectionPool(Opener())
    for vm in ("vm_a", "vm_b"):
        with pool.lease(vm, ADDRESS, 1):
            pass
    pool.close()
    assert pool.count("vm_a") == pool.count("vm_b") == 0


def _vm(port: int | None) -> Vm:
    return Vm(id="vm_a", task_id="task_a", owner="alice", name="a", image="tiny",
              status="running", host="local", vcpus=1, memory_mib=256,
              created_at=datetime.now(UTC), ssh_host="127.0.0.1" if port else None,
              ssh_port=port)


def test_the_ssh_shell_is_a_guest_shell_and_refuses_a_vm_without_an_address(
    tmp_path: Path,
) -> None:
    shell = SshGuestShell(tmp_path)
    with pytest.raises(GuestError, match="no SSH address"):
        shell.execs.exec(_vm(None), "true", None, 5)


def test_a_guest_that_does_not_answer_is_a_guest_error_at_once(tmp_path: Path) -> None:
    key_for_task(tmp_path, "task_a")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        shell = SshGuestShell(tmp_path, ShellSettings(connect_timeout_s=2))
        with pytest.raises(GuestError, match="cannot connect"):
            shell.execs.exec(_vm(port), "true", None, 5)
        with pytest.raises(GuestFileError, match="absolute"):
            shell.files.read_file(_vm(port), "relative/path")
    shell.close()
