"""Every refusal of SPEC §4 carries a stable code, a status and a hint naming a tool."""

from __future__ import annotations

import re
from typing import Any

import pytest

from rift.domain import errors

SPEC_CODES = {
    "handle_required": 400, "handle_invalid": 400, "task_not_found": 404, "task_closed": 409,
    "task_released": 409, "lease_stale": 409, "task_held": 409, "vm_not_found": 404,
    "vm_not_running": 409, "quota_exceeded": 429, "no_capacity": 503, "image_not_found": 404,
    "invalid_argument": 422, "idempotency_conflict": 409, "rate_limited": 429,
    "unauthorized": 401, "guest_unreachable": 503, "hypervisor_error": 503,
}

SAMPLES: dict[str, Any] = {
    "handle_required": lambda: errors.HandleRequired(),
    "handle_invalid": lambda: errors.HandleInvalid(),
    "task_not_found": lambda: errors.TaskNotFound("task_abcdefgh"),
    "task_closed": lambda: errors.TaskClosed("task_abcdefgh", "2026-01-01T00:00:00Z", "idle"),
    "task_released": lambda: errors.TaskReleased("task_abcdefgh"),
    "lease_stale": lambda: errors.LeaseStale("task_abcdefgh", "mcp:x", "2026-01-01T00:00:00Z"),
    "task_held": lambda: errors.TaskHeld("task_abcdefgh", "mcp:x", 5, "2026-01-01T00:30:00Z"),
    "vm_not_found": lambda: errors.VmNotFound("vm_abcdefgh"),
    "vm_not_running": lambda: errors.VmNotRunning("vm_abcdefgh", "failed"),
    "quota_exceeded": lambda: errors.QuotaExceeded("open tasks", 32, "rift_task_close"),
    "no_capacity": lambda: errors.NoCapacity(1, 256, 0, 0),
    "image_not_found": lambda: errors.ImageNotFound("x", ["tiny"]),
    "invalid_argument": lambda: errors.InvalidArgument("vcpus", "too many"),
    "idempotency_conflict": lambda: errors.IdempotencyConflict("rift_task_new"),
    "rate_limited": lambda: errors.RateLimited("task creations", 120, 30),
    "unauthorized": lambda: errors.Unauthorized(),
    "guest_unreachable": lambda: errors.GuestUnreachable("vm_abcdefgh", "test driver"),
    "hypervisor_error": lambda: errors.HypervisorFailed("internal error"),
}
MENDING = re.compile(r"rift_(task|vm)_[a-z_]+|rift (token|doctor)|call again|wait|ask for less")


def test_the_error_tree_has_exactly_the_codes_of_the_spec() -> None:
    assert {e.code: e.status for e in errors.ALL_ERRORS} == SPEC_CODES


@pytest.mark.parametrize("code", sorted(SPEC_CODES))
def test_each_refusal_names_what_mends_it(code: str) -> None:
    err = SAMPLES[code]()
    body = err.to_dict()
    assert body["code"] == code and body["message"] and body["hint"]
    assert MENDING.search(body["hint"]), body["hint"]
    assert str(err).startswith(f"{code}: ")
