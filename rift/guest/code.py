"""Code contexts in a guest (SPEC §20): rift-code (hypervisor/rift_code.py) listens on
the guest's loopback at PORT, and each request is one `direct-tcpip` channel on the
VM's tunnel connection (the one exposures use): HTTP/1.0, one JSON body each way.

When nothing listens yet, the server is started over SSH (`setsid python3 …`,
detached from the session), after putting the script into the guest at GUEST_PATH
when it is not there (the path names the script's digest: a guest holding an older
one gets this one beside it); one start at a time per VM. A pooled VM's server is
started at its fill, with its default context's kernel (rift.guest.life).

What the guest answers is hostile (SPEC §15): read up to ANSWER_MAX bytes by the
deadline, the status line and the body parsed without patterns.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import paramiko

import hypervisor
from hypervisor.manifest import sha256
from rift.domain.errors import GuestUnreachable
from rift.domain.model import Vm
from rift.guest.errors import GuestError, GuestPortClosed
from rift.guest.files import ShellFiles
from rift.guest.run import send_within
from rift.guest.runner import Runner
from rift.services.ports.code import CodeAnswer, CodeRequest, NoPython

SOURCE = Path(hypervisor.__file__).with_name("rift_code.py")
DIGEST = sha256(SOURCE.read_bytes())[:16]
GUEST_PATH = f"/usr/lib/rift/rift-code-{DIGEST}.py"
PORT = 49999  # the port E2B's code interpreter listens on (its SDK's JUPYTER_PORT)
OPEN_S = 10.0  # opening one channel
START_S = 60.0  # from the start line to listening (python under TCG takes seconds)
ANSWER_MAX = 40 << 20  # a run's answer: 1 MiB a stream, 16 MiB of results, and JSON's
NO_SCRIPT, NO_PYTHON = 97, 98
# The server started detached; then, where there is bash, the line waits (up to 30 s)
# until it listens, so the channel opened next finds it (no failed opens meanwhile).
START_LINE = (f"[ -f {GUEST_PATH} ] || exit {NO_SCRIPT}; "
              f"command -v python3 >/dev/null 2>&1 || exit {NO_PYTHON}; cd; "
              f"setsid python3 {GUEST_PATH} serve {PORT} --default </dev/null "
              ">/tmp/rift-code.log 2>&1 & command -v bash >/dev/null || exit 0; "
              "exec bash -c 'for i in $(seq 600); do (exec 3<>/dev/tcp/127.0.0.1/"
              f"{PORT}) 2>/dev/null && exit 0; sleep 0.05; done; exit 0'")


class SshCode:
    """GuestCode over the guest shell's tunnel and commands."""

    def __init__(self, files: ShellFiles, runner: Runner) -> None:
        self.files = files
        self.runner = runner
        self._lock = threading.Lock()
        self._starting: dict[str, threading.Lock] = {}

    def reachable(self, vm: Vm) -> None:
        return None

    def request(self, vm: Vm, request: CodeRequest) -> CodeAnswer:
        deadline = time.monotonic() + request.timeout_s
        try:
            chan = self._open(vm, deadline)
            try:
                return _exchange(vm, chan, request, deadline)
            finally:
                chan.close()
        except (TimeoutError, OSError, EOFError, paramiko.SSHException) as exc:
            raise GuestUnreachable(vm.id, f"rift-code did not answer: {exc}") from exc
        except GuestError as exc:
            raise GuestUnreachable(vm.id, str(exc)) from exc

    def start(self, vm: Vm) -> None:
        """Start the server (and its default context's kernel) unless it listens."""
        self.request(vm, CodeRequest(method="GET", path="/health", timeout_s=START_S))

    def _open(self, vm: Vm, deadline: float) -> paramiko.Channel:
        try:
            return self.files.open_port(vm, PORT, OPEN_S)
        except GuestPortClosed:
            pass
        with self._lock:
            starting = self._starting.setdefault(vm.id, threading.Lock())
        with starting:  # one start at a time per VM; the others find it listening
            try:
                return self.files.open_port(vm, PORT, OPEN_S)
            except GuestPortClosed:
                pass
            self._start(vm)
            until = min(deadline, time.monotonic() + START_S)
            while True:
                time.sleep(0.1)
                try:
                    return self.files.open_port(vm, PORT, OPEN_S)
                except GuestPortClosed:
                    if time.monotonic() > until:
                        raise GuestError(f"rift-code did not listen within {START_S:.0f}s "
                                         "(its log: /tmp/rift-code.log)", vm_id=vm.id) from None

    def _start(self, vm: Vm) -> None:
        done = self.runner.run(vm, START_LINE, None, START_S, 4096)
        if done.exit_code == NO_SCRIPT:
            self.runner.put_binary(vm, lambda: SOURCE, GUEST_PATH)
            done = self.runner.run(vm, START_LINE, None, START_S, 4096)
        if done.exit_code == NO_PYTHON:
            raise NoPython(vm.id)
        if done.exit_code != 0:
            said = done.stderr.decode("utf-8", "replace").strip()[-200:]
            raise GuestError(f"rift-code did not start (exit {done.exit_code}): {said}",
                             vm_id=vm.id)


def _exchange(vm: Vm, chan: paramiko.Channel, request: CodeRequest,
              deadline: float) -> CodeAnswer:
    body = json.dumps(request.body or {}).encode()
    head = (f"{request.method} {request.path} HTTP/1.0\r\nHost: rift-code\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
    send_within(chan, head.encode() + body, deadline)
    data = bytearray()
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"no answer within {request.timeout_s:.0f}s")
        chan.settimeout(remaining)
        try:
            chunk = chan.recv(min(1 << 16, ANSWER_MAX + 1 - len(data)))
        except TimeoutError as exc:
            raise TimeoutError(f"no answer within {request.timeout_s:.0f}s") from exc
        if not chunk:
            break
        data += chunk
        if len(data) > ANSWER_MAX:
            raise GuestError(f"rift-code answered more than {ANSWER_MAX} bytes", vm_id=vm.id)
    return parse_answer(bytes(data), vm.id)


def parse_answer(data: bytes, vm_id: str) -> CodeAnswer:
    """An HTTP/1.x answer's status and JSON body (split, no pattern)."""
    head, sep, body = data.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].split(b" ")
    if not sep or len(status_line) < 2 or not status_line[0].startswith(b"HTTP/1.") \
            or not status_line[1].isdigit() or len(status_line[1]) != 3:
        raise GuestError("rift-code answered no HTTP", vm_id=vm_id)
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise GuestError("rift-code answered no JSON", vm_id=vm_id) from exc
    return CodeAnswer(int(status_line[1]), parsed)
