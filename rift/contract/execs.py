"""The execs' tools (SPEC §10): run a command in a VM, read it, write its stdin, kill
it, list them; their input models, answers and contracts."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from rift.contract.base import (
    MAX_COMMAND,
    MAX_CONTENT,
    MAX_CONTENT_BASE64,
    MAX_EXEC_S,
    MAX_OFFSET,
    MAX_WAIT_S,
    ExecId,
    HandleText,
    Input,
    NoNul,
    Output,
    VmId,
    Whole,
)
from rift.contract.files import Encoding
from rift.contract.tool import EXEC, GUEST, HELD, ToolContract
from rift.contract.views import ExecView

MAX_TERMINAL_SIDE = 1000  # the most rows or columns of an exec's terminal

TerminalSide = Annotated[int, Field(ge=1, le=MAX_TERMINAL_SIDE, description=(
    f"1 to {MAX_TERMINAL_SIDE}.")), Whole]


class TerminalSize(Input):
    rows: TerminalSide
    cols: TerminalSide


class ExecBody(Input):
    command: Annotated[str, Field(min_length=1, max_length=MAX_COMMAND,
                                  description="The shell command (at most 64 KiB)."), NoNul]
    stdin: Annotated[str, Field(max_length=MAX_CONTENT,
                                description="Standard input (at most 16 MiB).")] | None = None
    timeout_s: Annotated[int, Field(ge=1, le=MAX_EXEC_S, description=(
        "Seconds before it is killed (TERM, then KILL 5 s later): status timed_out."
    )), Whole] = 60
    wait_s: Annotated[int, Field(ge=0, le=MAX_WAIT_S, description=(
        "Seconds to wait for its end before answering (default RIFT_EXEC_WAIT_S, 45); "
        "0 answers at once. It runs on either way: rift_vm_exec_get reads it.")),
        Whole] | None = None
    pty: Annotated[TerminalSize, Field(description=(
        "Run it on a terminal of rows x cols: stdout is all the terminal shows (stderr "
        "stays empty), stdin the terminal's input."))] | None = None


class VmExecIn(ExecBody):
    handle: HandleText | None = None
    vm_id: VmId


class ExecStreamQuery(Input):
    stdout_offset: Annotated[int, Field(ge=0, le=MAX_OFFSET, description=(
        "Read stdout from this byte on (stdout_offset of the last answer)."
    )), Whole] = 0
    stderr_offset: Annotated[int, Field(ge=0, le=MAX_OFFSET, description="The same for stderr."),
                             Whole] = 0


class ExecGetQuery(ExecStreamQuery):
    wait_s: Annotated[int, Field(ge=0, le=MAX_WAIT_S, description=(
        "Seconds to wait for output past the offsets, or the end.")), Whole] = 0


class VmExecGetIn(ExecGetQuery):
    handle: HandleText | None = None
    exec_id: ExecId


class ExecInputBody(Input):
    data: Annotated[str, Field(max_length=MAX_CONTENT_BASE64, description=(
        "Bytes for its stdin, encoded as `encoding` says (at most 16 MiB decoded)."))] = ""
    encoding: Encoding = "utf-8"
    eof: Annotated[bool, Field(description="Close its stdin after the data.")] = False


class VmExecInputIn(ExecInputBody):
    handle: HandleText | None = None
    exec_id: ExecId


class VmExecResizeIn(TerminalSize):
    """A new size for the terminal of a running exec started with `pty`."""

    handle: HandleText | None = None
    exec_id: ExecId


class ExecKillBody(Input):
    signal: Annotated[Literal["TERM", "KILL"], Field(description=(
        "TERM (then KILL 5 s later) or KILL, to its whole process group."))] = "TERM"


class VmExecKillIn(ExecKillBody):
    handle: HandleText | None = None
    exec_id: ExecId


class ExecListQuery(Input):
    status: Annotated[Literal["running", "all"], Field(description="Which execs.")] = "running"


class VmExecListIn(ExecListQuery):
    handle: HandleText | None = None
    vm_id: VmId | None = None


class ExecInputOut(Output):
    exec_id: str
    bytes: int


class ExecListOut(Output):
    execs: list[ExecView]


VM_EXEC = ToolContract(
    "rift_vm_exec", "Run a command in a VM",
    "Run a shell command in a running VM of the handle's task. It runs detached in the "
    "guest (it outlives this call): the answer, its exec view, comes at its end or after "
    "wait_s with status running; then rift_vm_exec_get reads on from stdout_offset. A "
    "sleeping VM is woken first (its view's `woke` says how long that took).",
    GUEST, VmExecIn, ExecView, slow=True)


VM_EXEC_GET = ToolContract(
    "rift_vm_exec_get", "Read an exec",
    "Read an exec of the handle's task: its status and its output from the offsets, "
    "waiting up to wait_s for more output or its end.",
    (*EXEC, "invalid_argument"), VmExecGetIn, ExecView, read_only=True,
    idempotent=True, slow=True)


VM_EXEC_INPUT = ToolContract(
    "rift_vm_exec_input", "Write to an exec's stdin",
    "Write to the stdin of a running exec of the handle's task; eof closes it.",
    (*EXEC, "invalid_argument"), VmExecInputIn, ExecInputOut, slow=True)


VM_EXEC_KILL = ToolContract(
    "rift_vm_exec_kill", "Kill an exec",
    "Signal a running exec's whole process group: TERM, then KILL 5 s later (or KILL at "
    "once). A repeat changes nothing.",
    (*EXEC, "invalid_argument"), VmExecKillIn, ExecView, destructive=True,
    idempotent=True, slow=True)


VM_EXEC_LIST = ToolContract(
    "rift_vm_exec_list", "List execs",
    "List the execs of the handle's task (of one VM): running ones, or all.",
    (*HELD, "vm_not_found", "invalid_argument"), VmExecListIn, ExecListOut,
    read_only=True, idempotent=True)
