"""envd's directory watches: `filesystem.Filesystem/WatchDir` (a server stream) and
`CreateWatcher`, `GetWatcherEvents`, `RemoveWatcher` (the sync SDK's polling form).

A watch is a Rift background exec in the sandbox running a watcher that prints one
line per event (`CREATE|WRITE|REMOVE|RENAME|CHMOD <tab> <name relative to the
watched directory>`) and, for each line `<token>` on its stdin, `#<token>` once
everything that happened before it is printed, so `GetWatcherEvents` answers what
happened up to the call (the SDK reads right after a write):

- where the guest has `python3` (`debian`): inotify (fsnotify's mapping, as envd:
  create and moved-to CREATE, modify WRITE, attrib CHMOD, delete REMOVE,
  moved-from RENAME; a directory made under a recursive watch is watched too);
- elsewhere (busybox `tiny`: no python3, no inotifyd): polling, a listing every
  0.5 s and at each read compared with the last (new: CREATE, and WRITE when not
  empty; mtime or size changed: WRITE; only ctime: CHMOD; gone: REMOVE; a rename
  is a REMOVE and a CREATE). Changes undone between two looks are not seen.

Everything from the guest is hostile (SPEC §15): lines split on one tab, names
bounded, at most `MAX_PENDING` events waiting per watcher: a guest that floods
beyond, or whose output outran the exec's ring, has its watcher cut off
(`resource_exhausted`) and its exec killed. At most `MAX_PER_SANDBOX` watchers a
sandbox. Watchers live in this process's memory.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rift.api.waiting import HeldStream
from rift.contract import tools as c
from rift.contract.base import MAX_EXEC_S, command
from rift.contract.views import ExecView
from rift.domain.errors import RiftError
from rift.e2b import entries
from rift.e2b.connect import STREAM_JSON, ConnectFault, end_stream, envelope, stream_request
from rift.e2b.envd import Call, absolute, call_of, fault_of, user_of
from rift.e2b.filesystem import run_script
from rift.e2b.processes import STREAM_HEADERS, Processes, stream_refusal
from rift.e2b.watch_scripts import script
from rift.services.lifecycle import execs

MAX_PER_SANDBOX = 16
MAX_WATCHERS = 4096  # in this process; one older than its exec's longest life is dropped
MAX_PENDING = 10_000
MAX_NAME = 4096
SYNC_S = 10  # how long a read waits for the watcher to answer its token
KINDS = {"CREATE": "EVENT_TYPE_CREATE", "WRITE": "EVENT_TYPE_WRITE",
         "REMOVE": "EVENT_TYPE_REMOVE", "RENAME": "EVENT_TYPE_RENAME",
         "CHMOD": "EVENT_TYPE_CHMOD"}

@dataclass
class Watcher:
    sandbox: str
    root: str
    include_entry: bool
    exec_id: str
    offsets: tuple[int, int] = (0, 0)
    partial: str = ""
    pending: list[dict[str, Any]] = field(default_factory=list)
    fault: ConnectFault | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    born: float = field(default_factory=time.monotonic)


def event(line: str) -> dict[str, Any] | None:
    kind, sep, name = line.partition("\t")
    if not sep or kind not in KINDS or not name or len(name) > MAX_NAME:
        return None
    return {"name": name, "type": KINDS[kind]}


class Watches:
    def __init__(self, processes: Processes) -> None:
        self.processes = processes
        self._lock = threading.Lock()
        self._by_id: dict[str, Watcher] = {}

    def routes(self) -> list[Route]:
        rpc = "/filesystem.Filesystem/"
        return [Route(rpc + "WatchDir", self.watch_dir, methods=["POST"]),
                Route(rpc + "CreateWatcher", self.create, methods=["POST"]),
                Route(rpc + "GetWatcherEvents", self.events, methods=["POST"]),
                Route(rpc + "RemoveWatcher", self.remove, methods=["POST"])]

    # -- the watcher's exec -----------------------------------------------------------

    def _start(self, call: Call, message: dict[str, Any], user: str) -> Watcher:
        path = message.get("path")
        if not isinstance(path, str) or not path or len(path) > MAX_NAME:
            raise ConnectFault("invalid_argument", "path: the directory to watch")
        with self._lock:
            oldest = time.monotonic() - MAX_EXEC_S
            self._by_id = {k: w for k, w in self._by_id.items() if w.born > oldest}
            if sum(w.sandbox == call.sandbox for w in self._by_id.values()) >= MAX_PER_SANDBOX \
                    or len(self._by_id) >= MAX_WATCHERS:
                raise ConnectFault("resource_exhausted", f"at most {MAX_PER_SANDBOX} "
                                   "watchers a sandbox")
        root = absolute(path, user).rstrip("/") or "/"
        deps = self.processes.deps
        view = execs.start(deps, call.caller, command(
            c.VmExecIn, handle=call.handle, vm_id=call.vm_id, wait_s=0, timeout_s=MAX_EXEC_S,
            command=script(root, message.get("recursive") is True)))
        watcher = Watcher(call.sandbox, root, message.get("includeEntry") is True, view.exec_id)
        deadline = time.monotonic() + SYNC_S
        while not self._read(call, watcher, "ready"):
            if watcher.fault is not None:
                raise watcher.fault
            if time.monotonic() > deadline:
                self._kill(call, watcher)
                raise ConnectFault("deadline_exceeded", "the watcher did not start")
        return watcher

    def _read(self, call: Call, watcher: Watcher, marker: str, wait_s: int = 1) -> bool:
        """Read the watcher's output once (waiting up to `wait_s` for more); True once
        the line `marker` was seen. Events go to `pending`."""
        out, err = watcher.offsets
        view: ExecView = execs.get(self.processes.deps, call.caller, command(
            c.VmExecGetIn, handle=call.handle, exec_id=watcher.exec_id, stdout_offset=out,
            stderr_offset=err, wait_s=wait_s))
        watcher.offsets = (view.stdout_offset, view.stderr_offset)
        if view.truncated:
            return self._cut(call, watcher, "the guest's events outran what it keeps")
        lines = (watcher.partial + view.stdout).split("\n")
        watcher.partial = lines.pop()[:MAX_NAME + 16]
        seen = False
        for line in lines:
            if line == marker:
                seen = True
            elif (found := event(line)) is not None:
                watcher.pending.append(found)
        if len(watcher.pending) > MAX_PENDING:
            return self._cut(call, watcher, f"more than {MAX_PENDING} events waiting")
        if view.status != "running" and not seen:
            code = {20: "not_found", 22: "invalid_argument"}.get(view.exit_code or 0,
                                                                 "internal")
            watcher.fault = ConnectFault(code, f"the watcher ended ({view.status}): "
                                         f"{view.stderr.strip()[:300]}")
        return seen

    def _cut(self, call: Call, watcher: Watcher, why: str) -> bool:
        watcher.fault = ConnectFault("resource_exhausted", f"the watch was cut off: {why}")
        self._kill(call, watcher)
        return False

    def _kill(self, call: Call, watcher: Watcher) -> None:
        with contextlib.suppress(RiftError):  # it ended already, or the sandbox is gone
            execs.kill(self.processes.deps, call.caller, command(
                c.VmExecKillIn, handle=call.handle, exec_id=watcher.exec_id, signal="KILL"))

    def _sync(self, call: Call, watcher: Watcher) -> list[dict[str, Any]]:
        """Everything that happened up to now: the watcher's answer to a fresh token."""
        token = secrets.token_hex(6)
        execs.send_input(self.processes.deps, call.caller, command(
            c.VmExecInputIn, handle=call.handle, exec_id=watcher.exec_id, data=token + "\n"))
        deadline = time.monotonic() + SYNC_S
        while not self._read(call, watcher, "#" + token):
            if watcher.fault is not None:
                raise watcher.fault
            if time.monotonic() > deadline:
                raise ConnectFault("deadline_exceeded", "the watcher did not answer")
        found, watcher.pending = watcher.pending, []
        return self._with_entries(call, watcher, found)

    def _with_entries(self, call: Call, watcher: Watcher,
                      found: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if not watcher.include_entry or not found:
            return found
        paths = sorted({f"{watcher.root.rstrip('/')}/{e['name']}" for e in found
                        if e["type"] not in ("EVENT_TYPE_REMOVE", "EVENT_TYPE_RENAME")})[:256]
        if not paths:
            return found
        listed = {e["path"]: e for e in entries.parse(
            run_script(self.processes, call, entries.script(paths)))}
        for e in found:
            entry = listed.get(f"{watcher.root.rstrip('/')}/{e['name']}")
            if entry is not None and e["type"] not in ("EVENT_TYPE_REMOVE",
                                                       "EVENT_TYPE_RENAME"):
                e["entry"] = entry
        return found

    def _mine(self, call: Call, message: dict[str, Any]) -> Watcher:
        wid = message.get("watcherId")
        with self._lock:
            watcher = self._by_id.get(wid) if isinstance(wid, str) else None
        if watcher is None or watcher.sandbox != call.sandbox:
            raise ConnectFault("not_found", f"watcher with id {str(wid)[:40]} not found")
        return watcher

    # -- the RPCs ---------------------------------------------------------------------

    async def create(self, request: Request) -> Response:
        def work(call: Call, message: dict[str, Any]) -> dict[str, Any]:
            watcher = self._start(call, message, user_of(request))
            wid = "w" + secrets.token_hex(8)
            with self._lock:
                self._by_id[wid] = watcher
            return {"watcherId": wid}
        return await self.processes.unary(request, work)

    async def events(self, request: Request) -> Response:
        def work(call: Call, message: dict[str, Any]) -> dict[str, Any]:
            watcher = self._mine(call, message)
            with watcher.lock:
                if watcher.fault is not None:
                    raise watcher.fault
                return {"events": self._sync(call, watcher)}
        return await self.processes.unary(request, work)

    async def remove(self, request: Request) -> Response:
        def work(call: Call, message: dict[str, Any]) -> dict[str, Any]:
            watcher = self._mine(call, message)
            with self._lock:
                self._by_id = {k: w for k, w in self._by_id.items() if w is not watcher}
            self._kill(call, watcher)
            return {}
        return await self.processes.unary(request, work)

    async def watch_dir(self, request: Request) -> Response:
        state = self.processes.state
        body = await request.body()
        try:
            message = stream_request(request.headers.get("content-type", ""), body)
            call = await state.waiting.run(None, call_of, self.processes.deps, request)
            give = state.waiting.take(call.caller.user)
        except ConnectFault as fault:
            return stream_refusal(fault)
        except RiftError as err:
            return stream_refusal(fault_of(err))
        try:
            watcher = await state.waiting.run(None, self._start, call, message,
                                              user_of(request))
        except (ConnectFault, RiftError) as err:
            give()
            return stream_refusal(err if isinstance(err, ConnectFault) else fault_of(err))
        return HeldStream(state.waiting.iterate(self._stream(call, watcher)), give,
                          media_type=STREAM_JSON, headers=STREAM_HEADERS)

    def _stream(self, call: Call, watcher: Watcher) -> Iterator[bytes]:
        """The stream's envelopes: start, then events as they come (a keepalive each
        quiet 15 s), until the watcher fails or the client goes (its exec killed)."""
        yield envelope({"start": {}})
        quiet = time.monotonic()
        try:
            while watcher.fault is None:
                try:
                    self._read(call, watcher, "\0", wait_s=10)
                    found, watcher.pending = watcher.pending, []
                    found = self._with_entries(call, watcher, found)
                except (ConnectFault, RiftError) as err:
                    watcher.fault = err if isinstance(err, ConnectFault) else fault_of(err)
                    break
                for e in found:
                    yield envelope({"filesystem": e})
                if found:
                    quiet = time.monotonic()
                elif time.monotonic() - quiet > 15:
                    quiet = time.monotonic()
                    yield envelope({"keepalive": {}})
            yield end_stream(watcher.fault)
        finally:
            self._kill(call, watcher)
