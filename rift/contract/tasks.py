"""The tasks' tools: open, attach, release, close, list, read and read the events of
a task; their input models (a REST body or query first, then the tool's input that
extends it), output models and contracts."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from rift.contract.base import (
    MAX_EVENT_ID,
    HandleText,
    Input,
    Key,
    Limit,
    Name,
    Output,
    SleepAfterS,
    Takeover,
    TaskId,
    Whole,
)
from rift.contract.tool import HELD, ToolContract
from rift.contract.views import EventView, TaskView


class TaskNewIn(Input):
    name: Name | None = None
    idempotency_key: Key | None = None
    sleep_after_s: SleepAfterS | None = None
    sleep: Annotated[Literal["idle", "always"], Field(description=(
        "Which quiet VMs sleep: `idle`, those with no exec running (a running exec "
        "keeps its VM awake); `always`, every one (its execs wait, saved with it)."))] = \
        "idle"


class TakeoverBody(Input):
    takeover: Takeover = False


class TaskAttachIn(TakeoverBody):
    task_id: TaskId


class TaskReleaseIn(Input):
    handle: HandleText | None = None


class TaskCloseIn(TakeoverBody):
    handle: HandleText | None = None
    task_id: TaskId | None = None


class TaskListIn(Input):
    status: Annotated[Literal["open", "closed", "all"], Field(description="Which tasks.")] = \
        "open"
    limit: Limit = 50
    after: Annotated[TaskId | None, Field(description=(
        "Continue after this task id (next_after of the last page)."))] = None


class TaskGetIn(Input):
    task_id: TaskId | None = None
    handle: HandleText | None = None


class EventsQuery(Input):
    after_id: Annotated[int, Field(ge=0, le=MAX_EVENT_ID,
                                   description="Only events after this id."), Whole] = 0
    limit: Limit = 50


class TaskEventsIn(EventsQuery):
    task_id: TaskId


class TaskOut(Output):
    task: TaskView


class TaskNewOut(Output):
    task: TaskView
    handle: str


class TaskAttachOut(Output):
    task: TaskView
    handle: str
    previous_holder: str | None


class TaskCloseOut(Output):
    task: TaskView
    destroyed: list[str]


class TaskListOut(Output):
    tasks: list[TaskView]
    next_after: str | None


class TaskEventsOut(Output):
    task_id: str
    events: list[EventView]
    next_after: int
    has_more: bool


TASK_NEW = ToolContract(
    "rift_task_new", "Open a task",
    "Open a new task (the unit you claim VMs for) and hold it: answers the task and its "
    "handle, which every later call on the task needs. Its running VMs sleep when it is "
    "quiet for sleep_after_s; the next call that needs one wakes it.",
    ("invalid_argument", "idempotency_conflict", "quota_exceeded", "rate_limited",
     "task_closed"), TaskNewIn, TaskNewOut, idempotent=True)


TASK_ATTACH = ToolContract(
    "rift_task_attach", "Attach to a task",
    "Take up an existing task of yours: mints a new handle (the previous one stops "
    "working at once). Free when the task is released or its lease quiet; else it "
    "needs takeover.",
    ("invalid_argument", "task_not_found", "task_closed", "task_held"),
    TaskAttachIn, TaskAttachOut, destructive=True)


TASK_RELEASE = ToolContract(
    "rift_task_release", "Release a task",
    "Let go of a task: it stays open, its VMs keep running, no one holds it; "
    "rift_task_attach takes it up again.",
    HELD, TaskReleaseIn, TaskOut, idempotent=True)


TASK_CLOSE = ToolContract(
    "rift_task_close", "Close a task",
    "Close a task and destroy every VM in it. With its handle; or with task_id (for "
    "tasks an earlier conversation left behind), under rift_task_attach's rules.",
    (*HELD[1:], "task_held", "invalid_argument"), TaskCloseIn, TaskCloseOut,
    destructive=True, idempotent=True, slow=True)


TASK_LIST = ToolContract(
    "rift_task_list", "List your tasks",
    "List your own tasks, newest first, with their holders, countdowns and VMs.",
    ("invalid_argument",), TaskListIn, TaskListOut, read_only=True, idempotent=True)


TASK_GET = ToolContract(
    "rift_task_get", "Read a task",
    "Read one task of yours by task_id, or by handle (which also counts as activity "
    "on it and keeps it from closing itself).",
    ("invalid_argument", "handle_invalid", "task_not_found", "task_closed",
     "task_released", "lease_stale"), TaskGetIn, TaskOut, read_only=True, idempotent=True)


TASK_EVENTS = ToolContract(
    "rift_task_events", "Read a task's events",
    "Read a task's event log (opened, attached, taken_over, vm_running, …) in order.",
    ("invalid_argument", "task_not_found"), TaskEventsIn, TaskEventsOut, read_only=True,
    idempotent=True)
