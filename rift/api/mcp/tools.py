"""The tools as MCP sees them: each tool's contract (rift/contract/, by resource), the use
case it calls (the same function every door calls, taking the contract's input
model), its short text rendering, and, for the calls that wait (SPEC §10), how a
cancel ends what it made."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import mcp_types as types
from pydantic import BaseModel

from rift.api.mcp.code_render import charts, context_line, run_code
from rift.contract import tools as c
from rift.contract.tool import ToolContract
from rift.services.context import Caller, Deps
from rift.services.lifecycle import (
    code,
    execs,
    exposures,
    files,
    forks,
    leases,
    pauses,
    snapshots,
    tasks,
    vms,
    volume_attach,
    volumes,
)
from rift.services.ports.watch import Watch

Render = Callable[[dict[str, Any]], str]
Extra = Callable[[dict[str, Any]], list[types.ContentBlock]]
Call = Callable[[Deps, Caller, Any], BaseModel]  # (deps, caller, input model) -> output
WatchedCall = Callable[[Deps, Caller, Any, Watch | None], BaseModel]
Stop = Callable[[Deps, Caller, str | None, str], None]  # (deps, caller, handle, target)


@dataclass(frozen=True)
class Waits:
    """A call that waits (SPEC §10): it runs under a `Watch` and, cancelled, ends
    what it made or watched under the call's own handle (`stop`: a lease that moved
    on refuses it, and nothing changes)."""

    call: WatchedCall
    stop: Stop
    plain_cancel_stops: bool  # a cancelled plain call ends it (not a dropped long poll)
    task_cancel_stops_now: bool  # tasks/cancel ends it at once (False: once it is up)


@dataclass(frozen=True)
class Tool:
    contract: ToolContract
    call: Call  # the use case: (deps, caller, input model) -> output model
    render: Render
    waits: Waits | None = None
    images: Extra | None = None  # content after the text: a run's charts, for a model to see

    @property
    def name(self) -> str:
        return self.contract.name

    def more_content(self, out: dict[str, Any]) -> list[types.ContentBlock]:
        return self.images(out) if self.images is not None else []

    @cached_property
    def definition(self) -> types.Tool:
        c = self.contract
        return types.Tool(
            name=c.name, title=c.title, description=c.description,
            input_schema=c.input_schema, output_schema=c.output_schema,
            annotations=types.ToolAnnotations(
                title=c.title, read_only_hint=c.read_only,
                destructive_hint=None if c.read_only else c.destructive,
                idempotent_hint=c.idempotent),
            # The calls that wait may run as tasks (2025-11-25; rift/api/mcp/tasks.py).
            execution=types.ToolExecution(task_support="optional") if self.waits
            else None,
        )


# -- text renderings: short, but carrying what an agent needs to go on ----------------

def _q(text: Any) -> str:
    """Other agents' text, quoted so that it reads as data."""
    return json.dumps(text, ensure_ascii=False)


def _task_line(t: dict[str, Any]) -> str:
    held = f"held by {_q(t['holder'])}" if t["holder"] else "held by no one"
    if t["status"] == "closed":
        state = f"closed {t['closed_at']} ({t['close_reason']})"
    else:
        state = f"open, {held}, closes itself at {t['closes_at']} unless used"
    vms = ", ".join(f"{v['id']} {v['status']}" for v in t["vms"]) or "no VMs"
    return f"{t['id']} {_q(t['name'])}: {state}; {vms}"


def _vm_line(v: dict[str, Any]) -> str:
    line = (f"VM {v['id']} {_q(v['name'])} of {v['task_id']}: {v['status']} on {v['host']}, "
            f"{v['image']}, {v['vcpus']} vCPU, {v['memory_mib']} MiB")
    if v["ssh"]:
        line += f", ssh {v['ssh']['host']}:{v['ssh']['port']}"
    for m in v["volumes"]:
        ro = " (read-only)" if m["read_only"] else ""
        line += f"; volume {m['volume_id']} at {m['path']}{ro}"
    return line + (f"; error: {v['error']}" if v["error"] else "")


def _volume_line(v: dict[str, Any]) -> str:
    where = ", ".join(f"{a['vm_id']} of {a['task_id']} at {a['path']}"
                      + (" (read-only)" if a["read_only"] else "") for a in v["attached_to"])
    return (f"volume {v['id']} {_q(v['name'])}: {v['size_gib']} GiB on {v['host']}; "
            f"attached to {where or 'no VM'}")


def _new(out: dict[str, Any]) -> str:
    return f"opened {_task_line(out['task'])}\nhandle: {out['handle']}"


def _attach(out: dict[str, Any]) -> str:
    previous = _q(out["previous_holder"]) if out["previous_holder"] else "no one"
    return (f"attached {_task_line(out['task'])}\nhandle: {out['handle']}\n"
            f"previous holder: {previous}")


def _close(out: dict[str, Any]) -> str:
    destroyed = ", ".join(out["destroyed"]) or "none"
    return f"{_task_line(out['task'])}\nVMs destroyed: {destroyed}"


def _list(out: dict[str, Any]) -> str:
    lines = [_task_line(t) for t in out["tasks"]] or ["no tasks"]
    if out["next_after"]:
        lines.append(f"more: call again with after={out['next_after']}")
    return "\n".join(lines)


def _events(out: dict[str, Any]) -> str:
    lines = [f"#{e['id']} {e['at']} {e['type']} by {_q(e['actor'])} {_q(e['details'])}"
             for e in out["events"]] or [f"no events of {out['task_id']} after that"]
    if out["has_more"]:
        lines.append(f"more: call again with after_id={out['next_after']}")
    return "\n".join(lines)


def _exec_line(e: dict[str, Any]) -> str:
    if e["status"] == "running":
        state = "running"
    elif e["status"] == "exited":
        state = (f"exit {e['exit_code']}" if e["exit_code"] is not None
                 else f"ended by signal {e['signal']}")
    else:
        state = e["status"].replace("_", " ")
    took = f" after {e['duration_ms']} ms" if e["duration_ms"] is not None else ""
    return (f"exec {e['exec_id']} on {e['vm_id']}: {state}{took}; stdout "
            f"{e['stdout_bytes']} bytes, stderr {e['stderr_bytes']} bytes")


def _exec(out: dict[str, Any]) -> str:
    head = _exec_line(out)
    if out["truncated"]:
        head += "\n(output before the oldest byte kept in the guest is gone)"
    more = [f"{name}_offset={out[f'{name}_offset']}" for name in ("stdout", "stderr")
            if out[f"{name}_offset"] < out[f"{name}_bytes"]]
    if more:
        head += f"\nmore output: rift_vm_exec_get with {' '.join(more)}"
    elif out["status"] == "running":
        head += (f"\nstill running: rift_vm_exec_get with stdout_offset={out['stdout_offset']} "
                 f"stderr_offset={out['stderr_offset']} wait_s=30 reads on")
    return f"{head}\n--- stdout ---\n{out['stdout']}\n--- stderr ---\n{out['stderr']}"


def _exec_list(out: dict[str, Any]) -> str:
    return "\n".join(_exec_line(e) + f": {_q(e['command'])}" for e in out["execs"]) or "no execs"


def _read(out: dict[str, Any]) -> str:
    cut = " (truncated)" if out["truncated"] else ""
    return f"{out['path']}: {out['bytes']} bytes{cut}\n{out['content']}"


def _task(out: dict[str, Any]) -> str:
    return _task_line(out["task"])


def _vm(out: dict[str, Any]) -> str:
    return _vm_line(out["vm"])


def _snapshot(snap: dict[str, Any]) -> str:
    return (f"snapshot {snap['id']} {snap['name']!r} of {snap['vm_id']}: "
            f"{snap['bytes'] / (1 << 20):.0f} MiB")


# -- how a cancelled call ends what it made -------------------------------------------

def _destroy_made(deps: Deps, caller: Caller, handle: str | None, vm_id: str) -> None:
    vms.destroy(deps, caller, c.VmDestroyIn.model_construct(handle=handle, vm_id=vm_id,
                                                            takeover=False))


def _interrupt_watched(deps: Deps, caller: Caller, handle: str | None, target: str) -> None:
    """A run's kernel interrupted (KeyboardInterrupt): the context goes on."""
    code.interrupt(deps, caller, handle, target)


def _kill_watched(deps: Deps, caller: Caller, handle: str | None, exec_id: str) -> None:
    """TERM, then KILL 5 s later."""
    execs.kill(deps, caller, c.VmExecKillIn.model_construct(handle=handle, exec_id=exec_id,
                                                            signal="TERM"))


# -- the table ------------------------------------------------------------------------

TOOLS: tuple[Tool, ...] = (
    Tool(c.TASK_NEW, tasks.new, _new),
    Tool(c.TASK_ATTACH, leases.attach, _attach),
    Tool(c.TASK_RELEASE, leases.release, _task),
    Tool(c.TASK_CLOSE, tasks.close, _close),
    Tool(c.TASK_LIST, tasks.list_tasks, _list),
    Tool(c.TASK_GET, tasks.get, _task),
    Tool(c.TASK_EVENTS, tasks.events, _events),
    Tool(c.VM_NEW, vms.new, _vm, Waits(vms.new, _destroy_made, plain_cancel_stops=True,
                                       task_cancel_stops_now=False)),
    Tool(c.VM_GET, vms.get, _vm),
    Tool(c.VM_DESTROY, vms.destroy, _vm),
    Tool(c.VM_PAUSE, pauses.pause, _vm),
    Tool(c.VM_RESUME, pauses.resume, _vm),
    Tool(c.VM_SNAPSHOT, snapshots.make, lambda out: _snapshot(out["snapshot"])),
    Tool(c.VM_SNAPSHOT_DELETE, snapshots.delete,
         lambda out: "deleted " + _snapshot(out["snapshot"])),
    Tool(c.VM_FORK, forks.fork, lambda out: "\n".join(_vm_line(vm) for vm in out["vms"])),
    Tool(c.VM_EXPOSE, exposures.expose,
         lambda out: (f"port {out['exposure']['port']} of {out['exposure']['vm_id']} is at "
                      f"{out['exposure']['url']} (shown only now; anyone with it reaches the "
                      "port)")),
    Tool(c.VM_UNEXPOSE, exposures.unexpose, _vm),
    Tool(c.VM_EXEC, execs.start, _exec, Waits(execs.start, _kill_watched,
                                              plain_cancel_stops=True,
                                              task_cancel_stops_now=True)),
    Tool(c.VM_EXEC_GET, execs.get, _exec, Waits(execs.get, _kill_watched,
                                                plain_cancel_stops=False,
                                                task_cancel_stops_now=True)),
    Tool(c.VM_EXEC_INPUT, execs.send_input,
         lambda out: f"wrote {out['bytes']} bytes to {out['exec_id']}'s stdin"),
    Tool(c.VM_EXEC_KILL, execs.kill, _exec),
    Tool(c.VM_EXEC_LIST, execs.list_execs, _exec_list),
    Tool(c.VM_RUN_CODE, code.run, run_code, Waits(code.run, _interrupt_watched,
                                                   plain_cancel_stops=True,
                                                   task_cancel_stops_now=True),
         images=charts),
    Tool(c.VM_RUN_CODE_GET, code.get_run, run_code, Waits(code.get_run, _interrupt_watched,
                                                          plain_cancel_stops=False,
                                                          task_cancel_stops_now=True),
         images=charts),
    Tool(c.VM_CODE_CONTEXT_NEW, code.new_context, lambda out: context_line(out["context"])),
    Tool(c.VM_CODE_CONTEXT_LIST, code.list_contexts,
         lambda out: "\n".join(context_line(x) for x in out["contexts"]) or "no contexts"),
    Tool(c.VM_CODE_CONTEXT_RESTART, code.restart,
         lambda out: "restarted " + context_line(out["context"])),
    Tool(c.VM_CODE_CONTEXT_DELETE, code.delete,
         lambda out: f"deleted context {out['context']['id']} on {out['context']['vm_id']}"),
    Tool(c.VM_WRITE_FILE, files.write, lambda out: f"wrote {out['bytes']} bytes to {out['path']}"),
    Tool(c.VM_READ_FILE, files.read, _read),
    Tool(c.VM_ATTACH_VOLUME, volume_attach.attach, _vm),
    Tool(c.VM_DETACH_VOLUME, volume_attach.detach, _vm),
    Tool(c.VOLUME_NEW, volumes.new, lambda out: _volume_line(out["volume"])),
    Tool(c.VOLUME_LIST, volumes.list_volumes,
         lambda out: "\n".join(_volume_line(v) for v in out["volumes"]) or "no volumes"),
    Tool(c.VOLUME_GET, volumes.get, lambda out: _volume_line(out["volume"])),
    Tool(c.VOLUME_DELETE, volumes.delete,
         lambda out: f"deleted volume {out['volume']['id']} {_q(out['volume']['name'])}"),
    Tool(c.VOLUME_RESIZE, volumes.resize, lambda out: _volume_line(out["volume"])),
    Tool(c.VOLUME_CLONE, volumes.clone, lambda out: _volume_line(out["volume"])),
)

_BY_NAME = {tool.name: tool for tool in TOOLS}  # an index of the table, for calls by name


def tool_named(name: str) -> Tool | None:
    """The tool a call names (MCP calls a tool by its name)."""
    return _BY_NAME.get(name)
