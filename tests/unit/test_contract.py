"""The tool contracts' own rules: what an input model accepts, and how a
validation error reads as Rift's `invalid_argument`."""

from __future__ import annotations

from typing import Any

import pytest

from rift.contract.base import parse, refusal_of
from rift.contract.files import VmReadFileIn
from rift.contract.tasks import TaskListIn
from rift.contract.vms import VM_NEW, VmNewIn
from rift.domain.errors import InvalidArgument


def refused(model: Any, args: dict[str, Any]) -> InvalidArgument:
    with pytest.raises(InvalidArgument) as caught:
        parse(model, args, "rift_tool")
    return caught.value


def test_json_numbers_are_read_as_json_schema_reads_them() -> None:
    assert parse(VmNewIn, {"vcpus": 2.0}).vcpus == 2
    assert refused(VmNewIn, {"vcpus": 2.5}).details["field"] == "vcpus"
    assert refused(VmNewIn, {"vcpus": "2"}).details["field"] == "vcpus"
    assert refused(VmNewIn, {"vcpus": True}).details["field"] == "vcpus"


def test_vm_sizes_left_out_are_the_engines_to_choose_except_the_disks() -> None:
    """memory_mib's default depends on the image (512 for debian), so the engine
    picks it; the disk's is 10 GiB for every image."""
    args = parse(VmNewIn, {})
    assert (args.image, args.memory_mib, args.vcpus, args.disk_gib) == (None, None, 1, 10)
    assert (parse(VmNewIn, {"disk_gib": 1}).disk_gib,
            parse(VmNewIn, {"disk_gib": 1024.0}).disk_gib) == (1, 1024)
    props = VM_NEW.input_schema["properties"]
    assert (props["disk_gib"]["minimum"], props["disk_gib"]["maximum"],
            props["disk_gib"]["default"]) == (1, 1024, 10)
    assert "default" not in props["memory_mib"] and "512 for debian" in \
        props["memory_mib"]["description"]


def test_an_optional_field_is_left_out_never_null() -> None:
    assert parse(VmNewIn, {}).name is None
    error = refused(VmNewIn, {"name": None})
    assert error.details["field"] == "name" and "leave the field out" in error.message
    assert "null" not in str(VM_NEW.input_schema)


def test_refusals_name_the_field_and_say_why() -> None:
    unknown = refused(TaskListIn, {"colour": "red"})
    assert unknown.details["field"] == "colour" and "status, limit, after" in unknown.message
    long_name = refused(VmNewIn, {"name": "x" * 201})
    assert long_name.details["field"] == "name" and "at most 200" in long_name.message
    assert "got 201" in long_name.message
    low = refused(VmNewIn, {"memory_mib": 63})
    assert low.details["field"] == "memory_mib" and "at least 64" in low.message
    for disk, why in ((0, "at least 1, got 0"), (1025, "at most 1024, got 1025"),
                      (2.5, "must be an integer"), ("10", "must be an integer")):
        error = refused(VmNewIn, {"disk_gib": disk})
        assert error.details["field"] == "disk_gib" and why in error.message, (disk, error)
    choice = refused(TaskListIn, {"status": "gone"})
    assert "open" in choice.message and "all" in choice.message
    task = refused(TaskListIn, {"after": "task_x"})
    assert task.details["field"] == "after" and "base32" in task.message
    # A field named `path` is the field, not REST's location of a query parameter.
    assert refused(VmReadFileIn, {"vm_id": "vm_aaaaaaaa"}).details["field"] == "path"


def test_rest_locations_lose_only_their_source() -> None:
    error = refusal_of([{"type": "missing", "loc": ("query", "path"), "msg": "x"}],
                       located=True)
    assert error.details["field"] == "path" and error.message.endswith("is required")
    body = refusal_of([{"type": "missing", "loc": ("body",), "msg": "x"}], located=True)
    assert body.details["field"] == "body"
