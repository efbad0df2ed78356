"""The code contexts' tools (SPEC §20): run code in a kernel that keeps its state, and
make, list, restart and delete a VM's contexts; their input models, answers and
contracts. The execution and context views are the guest's answers checked against
these shapes (rift.services.read.code_views)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from rift.contract.base import (
    MAX_EXEC_S,
    MAX_PATH,
    MAX_WAIT_S,
    HandleText,
    Input,
    NoNul,
    Output,
    VmId,
    Whole,
)
from rift.contract.tool import GUEST, ToolContract

MAX_CODE = 1 << 20  # the code of one run: 1 MiB
LANGUAGES = ("python",)
CONTEXT_ID_PATTERN = "^(default|ctx_[a-z2-7]{8})$"

Language = Annotated[Literal["python"], Field(description=(
    "The kernel's language; the languages there are: python."))]
ContextId = Annotated[str, Field(pattern=CONTEXT_ID_PATTERN, description=(
    "A code context's id (`ctx_` + 8 characters, from rift_vm_code_context_new), or "
    "`default`, the VM's own Python context."))]
MAX_ENV = 100  # a run's environment variables
EnvName = Annotated[str, Field(pattern="^[A-Za-z_][A-Za-z0-9_]{0,127}$")]
EnvValue = Annotated[str, Field(max_length=32 * 1024), NoNul]
RunId = Annotated[str, Field(pattern="^run_[a-z2-7]{8}$", description=(
    "A run's id (`run_` + 8 characters), from rift_vm_run_code's execution."))]
RunStatus = Literal["running", "ok", "error", "timed_out", "interrupted", "kernel_died"]


class RunCodeBody(Input):
    code: Annotated[str, Field(max_length=MAX_CODE, description=(
        "The code to run (at most 1 MiB): its last expression's value is the main result, "
        "as in a notebook cell.")), NoNul]
    language: Language = "python"
    context_id: ContextId | None = None
    timeout_s: Annotated[int, Field(ge=1, le=MAX_EXEC_S, description=(
        "Seconds before the kernel is interrupted (status timed_out; the context keeps its "
        "state).")), Whole] = 60
    env: Annotated[dict[EnvName, EnvValue], Field(max_length=MAX_ENV, description=(
        "Environment variables for this run only (at most 100; E2B's envs): set in the "
        "kernel before it, put back after."))] | None = None
    wait_s: Annotated[int, Field(ge=0, le=MAX_WAIT_S, description=(
        "Seconds to wait for the end before answering (default RIFT_EXEC_WAIT_S, 45); the "
        "run goes on either way: rift_vm_run_code_get reads it on, and the context's next "
        "run waits for it.")),
        Whole] | None = None


class VmRunCodeIn(RunCodeBody):
    handle: HandleText | None = None
    vm_id: VmId


class RunWaitQuery(Input):
    wait_s: Annotated[int, Field(ge=0, le=MAX_WAIT_S, description=(
        "Seconds to wait for its end before answering.")), Whole] = 0


class VmRunCodeGetIn(RunWaitQuery):
    handle: HandleText | None = None
    vm_id: VmId
    run_id: RunId


class ContextBody(Input):
    language: Language = "python"
    cwd: Annotated[str, Field(min_length=1, max_length=MAX_PATH, pattern="^/", description=(
        "The kernel's working folder (absolute; default: root's home).")), NoNul] | None = None


class VmCodeContextNewIn(ContextBody):
    handle: HandleText | None = None
    vm_id: VmId


class VmCodeContextListIn(Input):
    handle: HandleText | None = None
    vm_id: VmId


class VmCodeContextIn(Input):
    handle: HandleText | None = None
    vm_id: VmId
    context_id: ContextId


class ResultView(Output):
    """One display of a run: its MIME forms (`text/plain`, `text/html`, `text/markdown`,
    `image/png` (base64), `image/svg+xml`, `application/json`), and whether it is the
    value of the code's last expression."""

    data: dict[str, Any]
    is_main_result: bool


class OmittedView(Output):
    """A form left out of the answer, with its size and why (an image over 4 MiB)."""

    mime: str
    bytes: int
    reason: str


class ExecutionError(Output):
    name: str
    value: str
    traceback: str


class ExecutionView(Output):
    """One run of code (SPEC §20). `status` is `running` (it goes on past the wait),
    `ok`, `error`, `timed_out` or `interrupted` (a KeyboardInterrupt in `error`; the
    context keeps its state), or `kernel_died` (the next run starts a new kernel).
    `truncated`: a stream or text form was cut at 1 MiB."""

    run_id: str
    context_id: str
    status: RunStatus
    results: list[ResultView]
    stdout: str
    stderr: str
    error: ExecutionError | None
    execution_count: int | None
    truncated: bool
    omitted: list[OmittedView]
    duration_ms: int


class RunCodeOut(Output):
    execution: ExecutionView


class ContextView(Output):
    """A code context of a VM: its kernel (`ipykernel`, or `rift`'s own where the guest
    has no ipykernel), whether it is alive, the run it is busy with, its last run's end."""

    id: str
    vm_id: str
    language: str
    cwd: str | None
    backend: str | None
    alive: bool
    running: str | None
    last_run_at: str | None


class ContextOut(Output):
    context: ContextView


class ContextListOut(Output):
    contexts: list[ContextView]


CODE = (*GUEST, "context_not_found")

VM_RUN_CODE = ToolContract(
    "rift_vm_run_code", "Run code in a kernel",
    "Run code in a kernel of a running VM that keeps its state between runs (a notebook "
    "cell): the answer's execution has the results with their MIME forms (a PNG or SVG "
    "chart also comes as an image), stdout, stderr, the error (name, value, traceback) "
    "and the execution count. Without context_id it runs in the VM's default Python "
    "context. Past timeout_s the kernel is interrupted and the context goes on.",
    CODE, VmRunCodeIn, RunCodeOut, slow=True)

VM_RUN_CODE_GET = ToolContract(
    "rift_vm_run_code_get", "Read a run of code",
    "Read a run of code of a running VM (one that went on past its call's wait_s): its "
    "execution as it is now, waiting up to wait_s for its end. The guest keeps a VM's "
    "last 64 runs.",
    (*CODE, "invalid_argument"), VmRunCodeGetIn, RunCodeOut, read_only=True, idempotent=True,
    slow=True)

VM_CODE_CONTEXT_NEW = ToolContract(
    "rift_vm_code_context_new", "Make a code context",
    "Start a new kernel (a context of its own, in cwd) in a running VM; run code in it "
    "with rift_vm_run_code's context_id.",
    GUEST, VmCodeContextNewIn, ContextOut, slow=True)

VM_CODE_CONTEXT_LIST = ToolContract(
    "rift_vm_code_context_list", "List code contexts",
    "List a running VM's code contexts: language, kernel, whether it runs code now, its "
    "last run.",
    GUEST, VmCodeContextListIn, ContextListOut, read_only=True, idempotent=True, slow=True)

VM_CODE_CONTEXT_RESTART = ToolContract(
    "rift_vm_code_context_restart", "Restart a code context",
    "Start the context's kernel anew: its variables are gone, its id stays.",
    CODE, VmCodeContextIn, ContextOut, destructive=True, slow=True)

VM_CODE_CONTEXT_DELETE = ToolContract(
    "rift_vm_code_context_delete", "Delete a code context",
    "Stop the context's kernel and forget the context.",
    CODE, VmCodeContextIn, ContextOut, destructive=True, idempotent=False, slow=True)
