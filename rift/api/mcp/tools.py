"""The tools as MCP sees them: each tool's contract (rift/contract/tools.py), the
engine call it makes (rift/services/lifecycle/tools.py), and its short text rendering."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import mcp_types as types

from rift.contract.tools import CONTRACTS, ToolContract
from rift.services.lifecycle.tools import CALLS, WATCHED, Call

Render = Callable[[dict[str, Any]], str]


@dataclass(frozen=True)
class Tool:
    contract: ToolContract
    call: Call  # the engine call: (deps, caller, input model) -> output model
    render: Render

    @property
    def name(self) -> str:
        return self.contract.name

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
            # The calls that wait may run as tasks (2025-11-25; rift/api/mcp_tasks.py).
            execution=types.ToolExecution(task_support="optional") if c.name in WATCHED
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
    return line + (f"; error: {v['error']}" if v["error"] else "")


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


# -- the table ------------------------------------------------------------------------

_RENDERS: dict[str, Render] = {
    "rift_task_new": _new,
    "rift_task_attach": _attach,
    "rift_task_release": _task,
    "rift_task_close": _close,
    "rift_task_list": _list,
    "rift_task_get": _task,
    "rift_task_events": _events,
    "rift_vm_new": _vm,
    "rift_vm_get": _vm,
    "rift_vm_destroy": _vm,
    "rift_vm_pause": _vm,
    "rift_vm_resume": _vm,
    "rift_vm_snapshot": lambda out: _snapshot(out["snapshot"]),
    "rift_vm_snapshot_delete": lambda out: "deleted " + _snapshot(out["snapshot"]),
    "rift_vm_fork": lambda out: "\n".join(_vm_line(vm) for vm in out["vms"]),
    "rift_vm_expose": lambda out: (f"port {out['exposure']['port']} of "
                                   f"{out['exposure']['vm_id']} is at {out['exposure']['url']} "
                                   "(shown only now; anyone with it reaches the port)"),
    "rift_vm_unexpose": _vm,
    "rift_vm_exec": _exec,
    "rift_vm_exec_get": _exec,
    "rift_vm_exec_input": lambda out: f"wrote {out['bytes']} bytes to {out['exec_id']}'s stdin",
    "rift_vm_exec_kill": _exec,
    "rift_vm_exec_list": _exec_list,
    "rift_vm_write_file": lambda out: f"wrote {out['bytes']} bytes to {out['path']}",
    "rift_vm_read_file": _read,
}

TOOLS: dict[str, Tool] = {name: Tool(contract, CALLS[name], _RENDERS[name])
                          for name, contract in CONTRACTS.items()}
