"""A guest's code contexts for the engine's tests: the real rift-code
(hypervisor/rift_code.py) run here by Debian's python3, reached over HTTP on the
loopback as the SSH tunnel reaches a guest's (`HostCode`), and a guest that answers
whatever a test scripts (`ScriptedCode`: a hostile one); a VM to run code in and a
run through the engine (`code_vm`, `run_code`)."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import time
from pathlib import Path

from rift.contract import tools as c
from rift.contract.base import command
from rift.domain.model import Vm
from rift.guest.code import SOURCE
from rift.services.context import Deps
from rift.services.lifecycle import code, tasks, vms
from rift.services.ports.code import CodeAnswer, CodeRequest, NoPython
from tests.support.engine import ALICE
from tests.support.vm_rows import give_ssh_address

PYTHON = "/usr/bin/python3"  # Debian's, with python3-ipykernel (scripts/setup.sh)


def code_vm(deps: Deps) -> tuple[str, str]:
    """A task of ALICE's and a running VM in it with an SSH address: (handle, VM id)."""
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    vm = vms.new(deps, ALICE, command(c.VmNewIn, handle=str(opened.handle))).vm
    with deps.store.write() as tx:
        give_ssh_address(tx, vm.id)
    return str(opened.handle), vm.id


def run_code(deps: Deps, handle: str, vm_id: str, code_text: str,
             **more: object) -> c.RunCodeOut:
    """`rift_vm_run_code` as ALICE, through the engine."""
    return code.run(deps, ALICE, command(c.VmRunCodeIn, handle=handle, vm_id=vm_id,
                                         code=code_text, **more))


class HostCode:
    """GuestCode over rift-code run on this host (one server for every VM)."""

    def __init__(self, home: Path, backend: str = "rift") -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        env = dict(os.environ, RIFT_CODE_BACKEND=backend, HOME=str(home))
        self.proc = subprocess.Popen(
            [PYTHON, str(SOURCE), "serve", str(self.port), "--default"], env=env,
            stderr=subprocess.DEVNULL, cwd=home)
        self.requests: list[CodeRequest] = []
        deadline = time.monotonic() + 30
        while True:
            try:
                self.request(None, CodeRequest(method="GET", path="/health", timeout_s=5))
                break
            except OSError:
                assert time.monotonic() < deadline, "rift-code did not listen"
                time.sleep(0.05)

    def reachable(self, vm: Vm) -> None:
        return None

    def start(self, vm: Vm) -> None:
        return None  # it runs from the start

    def request(self, vm: Vm | None, request: CodeRequest) -> CodeAnswer:
        self.requests.append(request)
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=request.timeout_s)
        try:
            conn.request(request.method, request.path, json.dumps(request.body or {}))
            answer = conn.getresponse()
            return CodeAnswer(answer.status, json.loads(answer.read()))
        finally:
            conn.close()

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


class ScriptedCode:
    """GuestCode that answers what a test gives it (None: the guest has no python3)."""

    def __init__(self, answer: CodeAnswer | None) -> None:
        self.answer = answer

    def reachable(self, vm: Vm) -> None:
        return None

    def start(self, vm: Vm) -> None:
        if self.answer is None:
            raise NoPython(vm.id)

    def request(self, vm: Vm, request: CodeRequest) -> CodeAnswer:
        if self.answer is None:
            raise NoPython(vm.id)
        return self.answer
