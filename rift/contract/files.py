"""The files' tools: write and read a file in a VM; their input models, answers and
contracts."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from rift.contract.base import MAX_CONTENT_BASE64, HandleText, Input, Output, Path, VmId, Whole
from rift.contract.tool import GUEST, ToolContract

Encoding = Annotated[Literal["utf-8", "base64"], Field(description="How `content` is encoded.")]


class FileBody(Input):
    content: Annotated[str, Field(max_length=MAX_CONTENT_BASE64, description=(
        "The file's content, encoded as `encoding` says (at most 16 MiB once decoded)."))]
    encoding: Encoding = "utf-8"
    mode: Annotated[int, Field(ge=0, le=0o7777,
                               description="Permission bits, e.g. 420 for 0644."),
                    Whole] | None = None


class VmWriteFileIn(FileBody):
    handle: HandleText | None = None
    vm_id: VmId
    path: Path


class VmReadFileIn(Input):
    handle: HandleText | None = None
    vm_id: VmId
    path: Path
    encoding: Encoding = "utf-8"


class FileWrittenOut(Output):
    path: str
    bytes: int


class FileReadOut(Output):
    path: str
    content: str
    bytes: int
    truncated: bool


VM_WRITE_FILE = ToolContract(
    "rift_vm_write_file", "Write a file in a VM",
    "Write a file in a running VM of the handle's task (at most 16 MiB once decoded).",
    GUEST, VmWriteFileIn, FileWrittenOut, idempotent=True, slow=True)


VM_READ_FILE = ToolContract(
    "rift_vm_read_file", "Read a file in a VM",
    "Read a file in a running VM of the handle's task.",
    GUEST, VmReadFileIn, FileReadOut, read_only=True, idempotent=True, slow=True)

# Every tool, in the order `tools/list` shows them.
