"""The hostile-guest suite's tools (issue #26, SPEC §15), shared by
tests/e2e/test_real_hostile.py and bench/hostile.py: root in a guest over raw SSH
(the task's own key, no Rift in the way), the fake exec helpers a hostile guest
puts in place of rift-exec, and a probe that times a second user's calls
(`rift_vm_exec`, `rift_task_get`, `/healthz`) while the hostile guest does its worst."""

from __future__ import annotations

import contextlib
import shlex
import socket
import statistics
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import paramiko

from hypervisor.exec_helper import GUEST_PATH
from rift.guest.keys import load_key
from tests.support.mcp_clients import mcp_session, run

REAL_HELPER = GUEST_PATH + ".real"  # where the guest keeps the real rift-exec aside
HOST_KEY = "/etc/dropbear/dropbear_ed25519_host_key"  # hypervisor/guest_init.sh's
PROBE_CALL_S = 60.0  # one probe call's own bound (a frozen server costs a probe this)
KINDS = ("rift_vm_exec", "rift_task_get", "/healthz")
FLOOR = "raw SSH exec"  # the probe's optional floor: the same guest without Rift

# What a hostile guest puts at GUEST_PATH, by name: shell scripts run by its busybox.
FAKE_HELPERS = {
    # A view line built for backtracking patterns: `rift-exec ` and sixty `a=`, no newline.
    "catastrophic": "#!/bin/sh\nprintf 'rift-exec " + "a=" * 60 + "'\nexit 0\n",
    # Output that never ends, as fast as the guest can write it.
    "endless": "#!/bin/sh\nexec yes\n",
    # It never answers and never exits (nor reads its stdin).
    "silent": "#!/bin/sh\nexec sleep 100000\n",
}


class GuestRoot:
    """Root in a guest through its forwarded SSH port with the task's key, each
    command on a connection of its own (the host key is not checked: this is the
    test's own guest on loopback, and the suite changes it)."""

    def __init__(self, port: int, key_file: Path) -> None:
        self.port = port
        self.key = load_key(key_file)

    def run(self, command: str, timeout_s: float = 60) -> tuple[int, str]:
        """(exit status, stdout and stderr) of `command`, within `timeout_s`."""
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=timeout_s)
        transport = paramiko.Transport(sock)
        try:
            transport.banner_timeout = transport.auth_timeout = timeout_s
            transport.start_client(timeout=timeout_s)
            transport.auth_publickey("root", self.key)
            chan = transport.open_session(timeout=timeout_s)
            chan.settimeout(timeout_s)
            chan.set_combine_stderr(True)
            chan.exec_command(command)
            chan.shutdown_write()
            out = bytearray()
            while chunk := chan.recv(1 << 16):
                out += chunk
            return chan.recv_exit_status(), out.decode("utf-8", "replace")
        finally:
            transport.close()

    def must(self, command: str, timeout_s: float = 60) -> str:
        status, out = self.run(command, timeout_s)
        assert status == 0, f"{command!r} exited {status}: {out[-500:]}"
        return out

    def spawn(self, command: str) -> None:
        """Start `command` detached from the SSH session (it lives on after it)."""
        self.must(f"setsid sh -c {shlex.quote(command)} </dev/null >/dev/null 2>&1 &")

    def fake_helper(self, name: str) -> None:
        """Put the fake helper `name` at GUEST_PATH (the real one is kept aside once)."""
        script = FAKE_HELPERS[name]
        self.must(f"[ -e {REAL_HELPER} ] || cp {GUEST_PATH} {REAL_HELPER}; "
                  f"printf %s {shlex.quote(script)} > {GUEST_PATH}.new && "
                  f"chmod 755 {GUEST_PATH}.new && mv -f {GUEST_PATH}.new {GUEST_PATH}")

    def change_host_key(self, back: bool = False) -> None:
        """Restart the guest's SSH server (every connection to it ends) with a new
        host key, or `back` with the one it booted with; answers once it serves."""
        key = HOST_KEY if back else HOST_KEY + ".other"
        made = "" if back else f"dropbearkey -t ed25519 -f {key}; "
        self.spawn(f"sleep 1; killall dropbear; {made}rm -f /run/key-changed; "
                   f"dropbear -s -k -p 22 -W 1048576 -P /run/dropbear.pid -r {key} && "
                   f"echo {key} > /run/key-changed")
        time.sleep(2)
        deadline = time.monotonic() + 60
        while True:
            try:
                if self.run("cat /run/key-changed", 10)[1].strip() == key:
                    return
            except (OSError, paramiko.SSHException, EOFError):
                pass
            assert time.monotonic() < deadline, "the guest's SSH server did not come back"
            time.sleep(0.5)

    def real_helper(self) -> None:
        """The real rift-exec back in place; the fakes' leftovers (`yes`, `sleep`) ended."""
        self.must(f"cp {REAL_HELPER} {GUEST_PATH}.new && mv -f {GUEST_PATH}.new {GUEST_PATH}; "
                  "killall -q yes sleep; true")


def one_call(url: str, token: str, tool: str, limit_s: float,
             **args: object) -> tuple[str | None, float, dict[str, Any]]:
    """One tool call on a session of its own: (its refusal code, None when it
    answered; seconds; what it answered). No answer within `limit_s` is the code
    `no_answer`; a session that breaks is `broken`."""
    async def once() -> tuple[str | None, dict[str, Any]]:
        async with mcp_session(url, token, "hostile") as s:
            result = await s.call_tool(tool, dict(args))
            content = result.structured_content or {}
            if result.is_error:
                return str(content.get("error", {}).get("code")), content
            return None, content

    began = time.monotonic()
    try:
        code, content = run(once, limit_s)
    except TimeoutError:
        code, content = "no_answer", {}
    except Exception as exc:  # a dead or stopped server: said, not raised
        code, content = "broken", {"error": f"{type(exc).__name__}: {exc}"}
    return code, time.monotonic() - began, content


def rss_mib(pid: int, field_name: str = "VmRSS") -> float:
    """A process's resident memory (VmRSS) or its peak (VmHWM), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1]) / 1024
    raise LookupError(field_name)


# -- the probe: a second user's calls, timed ---------------------------------------------

@dataclass(frozen=True)
class Sample:
    at: float  # time.monotonic() when the call began
    kind: str
    seconds: float
    ok: bool
    error: str = ""


@dataclass
class Window:
    """The probe's samples between two moments."""

    samples: list[Sample] = field(default_factory=list)

    def of(self, kind: str) -> list[Sample]:
        return [s for s in self.samples if s.kind == kind]

    def failures(self) -> list[Sample]:
        return [s for s in self.samples if not s.ok]

    def seconds(self, kind: str) -> list[float]:
        return sorted(s.seconds for s in self.of(kind))

    def p50(self, kind: str) -> float:
        return statistics.median(self.seconds(kind))

    def p99(self, kind: str) -> float:
        found = self.seconds(kind)
        return found[min(len(found) - 1, round(0.99 * (len(found) - 1)))]

    def slowest(self) -> float:
        return max((s.seconds for s in self.samples), default=0.0)


class Probe:
    """A second user's calls one after another, in a thread with its own event loop
    and MCP session: `rift_vm_exec` (`true`) on that user's VM, `rift_task_get`, and
    `GET /healthz`, each timed (a call that fails or takes over PROBE_CALL_S is a
    failed sample); with `floor`, that too each round (FLOOR: e.g. `true` over an
    open raw SSH connection to the same VM, which shows what the host's own load
    costs without Rift); with `gauges`, each read once a round and kept as a
    sample whose `seconds` is the value read (e.g. the age of the sweep's last
    heartbeat)."""

    def __init__(self, url: str, token: str, handle: str, vm_id: str,
                 pause_s: float = 0.05, floor: Callable[[], object] | None = None,
                 gauges: dict[str, Callable[[], float]] | None = None) -> None:
        self.url, self.token, self.handle, self.vm_id = url, token, handle, vm_id
        self.pause_s = pause_s
        self.floor = floor
        self.gauges = gauges or {}
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._main, name="probe", daemon=True)
        self.crashed: BaseException | None = None

    def start(self) -> Probe:
        self._thread.start()
        return self

    def stop(self, within_s: float = PROBE_CALL_S * 3 + 10) -> None:
        self._stop.set()
        self._thread.join(within_s)

    @contextlib.contextmanager
    def window(self, at_least_s: float = 3.0) -> Iterator[Window]:
        """The samples of calls begun inside the `with` block, which lasts at least
        `at_least_s` (a call still in flight at its end is waited for, up to
        PROBE_CALL_S)."""
        began = time.monotonic()
        found = Window()
        try:
            yield found
        finally:
            time.sleep(max(0.0, began + at_least_s - time.monotonic()))
            ended = time.monotonic()
            deadline = ended + PROBE_CALL_S + 5
            while time.monotonic() < deadline and self._thread.is_alive():
                with self._lock:
                    last = self.samples[-1].at if self.samples else 0.0
                if last >= ended:
                    break
                time.sleep(0.05)
            with self._lock:
                found.samples = [s for s in self.samples if began <= s.at <= ended]

    def _note(self, sample: Sample) -> None:
        with self._lock:
            self.samples.append(sample)

    def _main(self) -> None:
        try:
            anyio.run(self._loop)
        except BaseException as exc:  # reported by whoever reads the probe
            self.crashed = exc

    async def _timed(self, kind: str, call: Awaitable[tuple[bool, str]]) -> None:
        began = time.monotonic()
        ok, error = False, ""
        try:
            with anyio.fail_after(PROBE_CALL_S):
                ok, error = await call
        except TimeoutError:
            error = f"no answer within {PROBE_CALL_S:.0f} s"
        except Exception as exc:  # any failure is a failed sample
            error = f"{type(exc).__name__}: {exc}"
        self._note(Sample(began, kind, time.monotonic() - began, ok, error))

    async def _loop(self) -> None:
        async with (mcp_session(self.url, self.token, "hostile-probe") as s,
                    httpx.AsyncClient(timeout=PROBE_CALL_S) as http):
            async def tool(name: str, **args: object) -> tuple[bool, str]:
                result = await s.call_tool(name, args)
                if result.is_error:
                    return False, str(result.structured_content or result.content)[:300]
                return True, ""

            async def exec_true() -> tuple[bool, str]:
                result = await s.call_tool("rift_vm_exec", {
                    "handle": self.handle, "vm_id": self.vm_id, "command": "true"})
                content = result.structured_content or {}
                if result.is_error or content.get("exit_code") != 0:
                    return False, str(content or result.content)[:300]
                return True, ""

            async def healthz() -> tuple[bool, str]:
                answer = await http.get(self.url + "/healthz")
                return answer.status_code == 200, f"HTTP {answer.status_code}"

            async def floor() -> tuple[bool, str]:
                assert self.floor is not None
                await anyio.to_thread.run_sync(self.floor)
                return True, ""

            while not self._stop.is_set():
                for name, gauge in self.gauges.items():
                    began = time.monotonic()
                    try:
                        value = await anyio.to_thread.run_sync(gauge)
                        self._note(Sample(began, name, value, True))
                    except Exception as exc:  # a gauge that cannot be read is a failure
                        self._note(Sample(began, name, 0.0, False, repr(exc)))
                if self.floor is not None:
                    await self._timed(FLOOR, floor())
                await self._timed("rift_vm_exec", exec_true())
                await self._timed("rift_task_get", tool("rift_task_get", handle=self.handle))
                await self._timed("/healthz", healthz())
                await anyio.sleep(self.pause_s)
