"""Request and response shapes of the REST door (SPEC §3/§5), for OpenAPI and
validation. The engine builds the views; these only describe them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

TASK_ID = r"^task_[a-z2-7]{8}$"
VM_ID = r"^vm_[a-z2-7]{8}$"
Text = Field(default=None, min_length=1, max_length=200)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SshView(BaseModel):
    host: str
    port: int


class VmView(BaseModel):
    id: str
    task_id: str
    name: str
    image: str
    status: Literal["creating", "running", "failed", "destroyed"]
    host: str
    vcpus: int
    memory_mib: int
    ssh: SshView | None
    created_at: str
    ready_at: str | None
    destroyed_at: str | None
    error: str | None


class TaskView(BaseModel):
    id: str
    name: str
    owner: str
    status: Literal["open", "closed"]
    holder: str | None
    held_since: str | None
    last_activity_at: str
    lease_quiet_at: str | None
    closes_at: str | None
    created_at: str
    closed_at: str | None
    close_reason: Literal["closed", "idle", "operator"] | None
    vms: list[VmView]


class EventView(BaseModel):
    id: int
    type: str
    at: str
    actor: str
    details: dict[str, Any]


class ErrorBody(BaseModel):
    code: str
    message: str
    hint: str


class ErrorOut(BaseModel):
    error: ErrorBody


# requests

class TaskNewIn(Strict):
    name: str | None = Text
    idempotency_key: str | None = Text


class TakeoverIn(Strict):
    takeover: bool = False


class VmNewIn(Strict):
    name: str | None = Text
    image: str | None = Text
    vcpus: int | None = Field(default=None, ge=1, le=64)
    memory_mib: int | None = Field(default=None, ge=64, le=65536)
    idempotency_key: str | None = Text


class ExecIn(Strict):
    command: str = Field(min_length=1, max_length=64 * 1024)
    stdin: str | None = Field(default=None, max_length=16 * 1024 * 1024)
    timeout_s: int | None = Field(default=None, ge=1, le=3600)


class FileIn(Strict):
    content: str = Field(max_length=22 * 1024 * 1024)
    encoding: Literal["utf-8", "base64"] | None = None
    mode: int | None = Field(default=None, ge=0, le=0o7777)


# responses

class TaskOut(BaseModel):
    task: TaskView


class TaskNewOut(BaseModel):
    task: TaskView
    handle: str


class AttachOut(TaskNewOut):
    previous_holder: str | None


class CloseOut(BaseModel):
    task: TaskView
    destroyed: list[str]


class TaskListOut(BaseModel):
    tasks: list[TaskView]
    next_after: str | None


class EventsOut(BaseModel):
    task_id: str
    events: list[EventView]
    next_after: int
    has_more: bool


class VmOut(BaseModel):
    vm: VmView


class ExecOut(BaseModel):
    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool
    truncated: bool
    duration_ms: int


class FileWrittenOut(BaseModel):
    path: str
    bytes: int


class FileReadOut(BaseModel):
    path: str
    content: str
    bytes: int
    truncated: bool
