"""The refusal tree of SPEC §4: one stable `code`, an HTTP status and a hint
that names the tool that mends it. Every door renders these the same way."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, ClassVar


class RiftError(Exception):
    code: ClassVar[str] = "internal"
    status: ClassVar[int] = 500

    def __init__(self, message: str, hint: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.details = details

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "hint": self.hint, **self.details}

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class HandleRequired(RiftError):
    code = "handle_required"
    status = 400

    def __init__(self) -> None:
        super().__init__(
            "this call needs a task handle and got none",
            "no handle: rift_task_new opens one, rift_task_attach <id> takes up an existing task",
        )


class HandleInvalid(RiftError):
    code = "handle_invalid"
    status = 400

    def __init__(self) -> None:
        super().__init__(
            "a handle has the form task_<id>.<secret>",
            "rift_task_new opens a task with a fresh handle; rift_task_attach <id> mints a new "
            "handle for an existing one",
            field="handle",
        )


class TaskNotFound(RiftError):
    code = "task_not_found"
    status = 404

    def __init__(self, task_id: str) -> None:
        super().__init__(
            f"no task {task_id} of yours",
            "rift_task_list shows yours",
            task_id=task_id,
        )


class TaskClosed(RiftError):
    code = "task_closed"
    status = 409

    def __init__(self, task_id: str, closed_at: str | None, reason: str | None) -> None:
        super().__init__(
            f"task {task_id} was closed {closed_at} ({reason}); its VMs are gone",
            "rift_task_new opens another",
            task_id=task_id,
            closed_at=closed_at,
            close_reason=reason,
        )


class TaskReleased(RiftError):
    code = "task_released"
    status = 409

    def __init__(self, task_id: str) -> None:
        super().__init__(
            f"task {task_id} was released by its holder; no one holds it",
            f"rift_task_attach {task_id} takes it up",
            task_id=task_id,
        )


class LeaseStale(RiftError):
    code = "lease_stale"
    status = 409

    def __init__(self, task_id: str, holder: str | None, since: str | None) -> None:
        super().__init__(
            f"this handle is no longer the lease of {task_id}: held by {holder} since {since}",
            f"rift_task_attach {task_id} with takeover takes it over — tell the user first",
            task_id=task_id,
            holder=holder,
            held_since=since,
        )


class TaskHeld(RiftError):
    code = "task_held"
    status = 409

    def __init__(self, task_id: str, holder: str | None, active_ago_s: int, quiet_at: str) -> None:
        super().__init__(
            f"task {task_id} is held by {holder}, active {active_ago_s}s ago",
            f"rift_task_attach {task_id} with takeover takes it over — tell the user first; "
            f"without takeover it is free at {quiet_at}",
            task_id=task_id,
            holder=holder,
            active_ago_s=active_ago_s,
            lease_quiet_at=quiet_at,
        )


class VmNotFound(RiftError):
    code = "vm_not_found"
    status = 404

    def __init__(self, vm_id: str) -> None:
        super().__init__(
            f"no VM {vm_id} in your tasks",
            "rift_task_get lists the task's VMs",
            vm_id=vm_id,
        )


class SnapshotNotFound(RiftError):
    """An unknown snapshot id and another task's get the same answer: no probing."""

    code = "snapshot_not_found"
    status = 404

    def __init__(self, snapshot_id: str) -> None:
        super().__init__(
            f"no snapshot {snapshot_id} in the handle's task",
            "rift_task_get lists the task's snapshots",
            snapshot_id=snapshot_id,
        )


class BuildFailed(RiftError):
    """A recipe line the builder cannot take (before any VM starts), or a step that
    failed in its VM (its exit code and the tail of its output) (SPEC §19)."""

    code = "build_failed"
    status = 422

    def __init__(self, why: str, line: int | None = None, *, exit_code: int | None = None,
                 output: str | None = None, build_id: str | None = None) -> None:
        where = f"line {line}: " if line is not None else ""
        super().__init__(
            f"{where}{why}",
            "mend the recipe (or its context) and build again: rift image build NAME "
            "--recipe FILE; rift image build-log BUILD_ID shows the whole log",
            line=line, exit_code=exit_code, output=output, build_id=build_id,
        )


class VolumeNotFound(RiftError):
    """An unknown volume id and another user's get the same answer: no probing."""

    code = "volume_not_found"
    status = 404

    def __init__(self, volume_id: str) -> None:
        super().__init__(
            f"no volume {volume_id} of yours",
            "rift_volume_list lists yours",
            volume_id=volume_id,
        )


class VolumeBusy(RiftError):
    """A volume another VM writes (or, for a writer, that any VM holds), or one
    deleted, resized or cloned while attached: names the VM and task that hold it."""

    code = "volume_busy"
    status = 409

    def __init__(self, volume_id: str, vm_id: str, task_id: str, doing: str) -> None:
        super().__init__(
            f"volume {volume_id} is attached to VM {vm_id} of task {task_id}; {doing}",
            f"rift_vm_detach_volume detaches it from {vm_id} first",
            volume_id=volume_id, vm_id=vm_id, task_id=task_id,
        )


class ExecNotFound(RiftError):
    """An unknown exec id and another task's get the same answer: no probing."""

    code = "exec_not_found"
    status = 404

    def __init__(self, exec_id: str) -> None:
        super().__init__(
            f"no exec {exec_id} in the handle's task",
            "rift_vm_exec_list lists the task's execs",
            exec_id=exec_id,
        )


class ContextNotFound(RiftError):
    """A code context (SPEC §20) the VM's guest does not keep: never made, deleted, or
    gone with a reboot of the guest."""

    code = "context_not_found"
    status = 404

    def __init__(self, context_id: str, vm_id: str) -> None:
        super().__init__(
            f"no code context {context_id} on VM {vm_id}",
            "rift_vm_code_context_list lists the VM's contexts; rift_vm_code_context_new "
            "makes one",
            context_id=context_id, vm_id=vm_id,
        )


class VmNotRunning(RiftError):
    code = "vm_not_running"
    status = 409

    def __init__(self, vm_id: str, status: str, doing: str | None = None) -> None:
        super().__init__(
            f"VM {vm_id} is {doing or status}, not running",
            "rift_vm_resume brings it back" if status == "paused"
            else "rift_vm_get shows when it is done" if doing is not None
            else "rift_vm_exec wakes it" if status == "sleeping"
            else "rift_vm_new makes another",
            vm_id=vm_id,
            vm_status=status,
        )


class VmAsleep(VmNotRunning):
    """The VM a call needs is asleep, or going to sleep or waking (SPEC §17): the
    engine wakes it and runs the call again (rift.services.lifecycle.sleeps.awake).
    Seen by a caller only where nothing wakes it: then `vm_not_running`."""

    def __init__(self, vm_id: str, status: str, doing: str | None = None) -> None:
        super().__init__(vm_id, status, doing)
        self.vm_id = vm_id


class QuotaExceeded(RiftError):
    code = "quota_exceeded"
    status = 429

    def __init__(self, what: str, limit: int, mend: str) -> None:
        super().__init__(
            f"at most {limit} {what}",
            f"{mend} frees room",
            limit=limit,
        )


class HostDiskFull(QuotaExceeded):
    """A host's disk is under its floor (RIFT_HOST_DISK_RESERVE_GIB): it takes no new
    VM, snapshot or pause until disk is freed there."""

    def __init__(self, host: str, free_bytes: int) -> None:
        RiftError.__init__(
            self,
            f"host {host} has {free_bytes / (1 << 30):.1f} GiB of disk free, under its "
            "floor (RIFT_HOST_DISK_RESERVE_GIB): it takes no new VM, snapshot or pause",
            "rift_vm_snapshot_delete or rift_vm_destroy frees disk; an operator may free "
            "disk on the host (rift host list)",
            host=host, free_bytes=free_bytes,
        )


class NoCapacity(RiftError):
    code = "no_capacity"
    status = 503

    def __init__(self, vcpus: int, memory_mib: int, free_vcpus: int, free_memory_mib: int) -> None:
        super().__init__(
            f"no host can fit {vcpus} vCPUs and {memory_mib} MiB; the most any host has free is "
            f"{free_vcpus} vCPUs and {free_memory_mib} MiB",
            "ask for less, or rift_vm_destroy / rift_task_close frees room",
            asked={"vcpus": vcpus, "memory_mib": memory_mib},
            largest_free={"vcpus": free_vcpus, "memory_mib": free_memory_mib},
        )


class NoVolumeHost(NoCapacity):
    """No host takes a new volume (SPEC §18): each is drained or does not answer."""

    def __init__(self) -> None:
        RiftError.__init__(
            self, "no host takes a new volume now: each host is drained or does not "
            "answer", "call again later; the operator's rift host list says why")


class VolumeHostDown(NoCapacity):
    """A volume whose host does not answer (SPEC §18): no VM can hold it until its
    host answers, or until Rift takes it to another host of this machine (its file
    is here) once the host is lost (RIFT_HOST_LOST_S); one on a host elsewhere
    waits for its host."""

    def __init__(self, volume_id: str, host: str, since: str, lost_at: str | None,
                 *, elsewhere: bool = False) -> None:
        if elsewhere:
            hint = (f"call again once host {host} answers: the volume's file is on that "
                    "host's machine (a host elsewhere), so the volume waits for it; the "
                    "operator's rift host list says why")
        elif lost_at is not None:
            hint = (f"call again once host {host} answers, or after {lost_at} "
                    "(RIFT_HOST_LOST_S), when Rift takes the volume to a host of this "
                    "machine that answers; delete, grow and clone work meanwhile")
        else:
            hint = ("no other host of this machine takes VMs to take it to; the operator's "
                    "rift host list says why; delete, grow and clone work meanwhile")
        RiftError.__init__(
            self, f"volume {volume_id} is on host {host}, which has not answered since "
            f"{since}; its file waits there", hint,
            volume_id=volume_id, host=host, unreachable_since=since)


class PoolDoesNotFit(RiftError):
    """A pool asked for more running VMs than its hosts hold, or a size none fits."""

    code = "no_capacity"
    status = 503

    def __init__(self, why: str, fits: int) -> None:
        super().__init__(
            why,
            f"rift pool set with --running {fits} or fewer, a smaller --memory-mib or "
            "--vcpus, or rift host add for more room" if fits else
            "rift pool set with a smaller --memory-mib or --vcpus, or rift host add",
            fits=fits,
        )


class ImageNotFound(RiftError):
    code = "image_not_found"
    status = 404

    def __init__(self, image: str, known: list[str], hint: str | None = None) -> None:
        super().__init__(
            f"no image {image!r}; the images there are: {', '.join(known) or 'none'}",
            hint or "rift_vm_new with one of those images",
            image=image,
            images=known,
        )


class InvalidArgument(RiftError):
    code = "invalid_argument"
    status = 422

    def __init__(self, field: str, why: str) -> None:
        super().__init__(
            f"{field}: {why}",
            f"correct {field} and call again",
            field=field,
        )


class IdempotencyConflict(RiftError):
    code = "idempotency_conflict"
    status = 409

    def __init__(self, tool: str) -> None:
        super().__init__(
            "this idempotency_key was used before with other input",
            f"{tool} with a new idempotency_key, or with the first call's input exactly",
            field="idempotency_key",
        )


class RateLimited(RiftError):
    code = "rate_limited"
    status = 429

    def __init__(self, what: str, per_hour: int, retry_after_s: int) -> None:
        super().__init__(
            f"over the budget of {per_hour} {what} per hour; try again in {retry_after_s}s",
            f"wait {retry_after_s}s; reads are free",
            retry_after_s=retry_after_s,
        )


class TooManyWaiting(RateLimited):
    """Over the budget of waiting calls at once (SPEC §15, RIFT_MAX_WAITING_PER_USER)."""

    def __init__(self, limit: int) -> None:
        RiftError.__init__(
            self,
            f"over the budget of {limit} waiting calls at once (exec waits, long polls, "
            "streams, MCP tasks working, live pages)",
            "let one end first: a shorter wait_s, rift_vm_exec_get with wait_s 0, closing a "
            "stream or a page; RIFT_MAX_WAITING_PER_USER is the budget",
            retry_after_s=1, limit=limit,
        )


class Unauthorized(RiftError):
    code = "unauthorized"
    status = 401

    def __init__(self) -> None:
        super().__init__(
            "a valid API token is needed (Authorization: Bearer rift_…)",
            "rift token new <user> makes one",
        )


class GuestUnreachable(RiftError):
    code = "guest_unreachable"
    status = 503

    def __init__(self, vm_id: str, why: str) -> None:
        super().__init__(
            f"the guest of {vm_id} does not answer SSH: {why}",
            "rift_vm_destroy + rift_vm_new",
            vm_id=vm_id,
        )


class HypervisorFailed(RiftError):
    code = "hypervisor_error"
    status = 503

    def __init__(self, words: str, host: str | None = None) -> None:
        super().__init__(
            f"libvirt refused: {words}",
            "rift_vm_new again later, or rift doctor on the host",
            host=host,
        )


class StoreUnavailable(RiftError):
    """The database did not answer (a restart, a network cut, a lock it gave up on).
    Not a refusal of SPEC §4: the code stays `internal`, answered with 503 because
    calling again shortly is the mend; the store reconnects by itself."""

    status = 503

    def __init__(self) -> None:
        super().__init__(
            "Rift's database did not answer; Rift reconnects by itself",
            "call again in a few seconds (a change this call asked for may not have been "
            "made: read before repeating it); if it keeps failing, tell the operator "
            "(rift doctor)",
        )


class IllegalTransition(RiftError):
    """A VM, exec, host, pool, pooled VM or snapshot asked to change from a state
    that change does not start from (the state tables in rift.domain.model,
    rift.domain.pools and rift.domain.records).
    Not a refusal of SPEC §4: the engine checks a state before it asks for a change,
    so this is a bug if it is ever seen; the code stays `internal`."""

    def __init__(self, kind: str, object_id: str, state: str, transition: str) -> None:
        super().__init__(
            f"{kind} {object_id} cannot be {transition} from {state}",
            "call again; if it keeps failing, tell the operator (rift doctor)",
            object_id=object_id, state=state, transition=transition,
        )


def check_from(kind: str, object_id: str, state: str, sources: Collection[str],
               transition: str) -> None:
    """`IllegalTransition` unless ``state`` is one of the ``sources`` the transition
    starts from."""
    if state not in sources:
        raise IllegalTransition(kind, object_id, state, transition)


ALL_ERRORS: tuple[type[RiftError], ...] = (
    HandleRequired, HandleInvalid, TaskNotFound, TaskClosed, TaskReleased, LeaseStale, TaskHeld,
    VmNotFound, VmNotRunning, QuotaExceeded, NoCapacity, ImageNotFound, InvalidArgument,
    IdempotencyConflict, RateLimited, Unauthorized, GuestUnreachable, HypervisorFailed,
)
