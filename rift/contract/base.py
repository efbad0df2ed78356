"""What every tool contract is made of: the ranges of SPEC §3, the input base
model, and the one mapping of a pydantic `ValidationError` to `invalid_argument`.

An input model is what both doors publish and enforce: MCP's `inputSchema` and
FastAPI's OpenAPI are generated from it, and the same model validates the call.
An optional field is *left out*, never `null`: its schema shows only the value's
own type, and an explicit `null` is refused like any other wrong type.

MCP validates strictly (JSON's types as they are: `"5"` is not an integer, `1` is
not a boolean; `5.0` is the integer 5, as JSON Schema reads it); REST keeps
FastAPI's usual coercion of query strings and bodies.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Mapping
from typing import Annotated, Any, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
)
from pydantic_core import PydanticCustomError

from rift.domain.errors import InvalidArgument
from rift.domain.ids import is_exec_id, is_snapshot_id, is_task_id, is_vm_id

MAX_TEXT = 200
MAX_COMMAND = 64 * 1024
MAX_EXEC_S = 24 * 3600  # an exec's timeout_s: a day at most
MAX_WAIT_S = 600  # a call's wait_s: ten minutes at most
MAX_OFFSET = 2**62  # an exec stream's offset
MAX_CONTENT = 16 * 1024 * 1024
MAX_CONTENT_BASE64 = math.ceil(MAX_CONTENT / 3) * 4  # 16 MiB of data, base64-encoded
MAX_PATH = 4096
MAX_EVENT_ID = 2**62
MAX_DISK_GIB = 1024  # a VM's overlay is sparse: this bounds what it may grow to
MAX_VCPUS = 64
MIN_MEMORY_MIB, MAX_MEMORY_MIB = 64, 65536
_FIELD_SHOWN = 64  # how much of an unknown field's name a refusal repeats


def _whole(value: Any) -> Any:
    """JSON has one number type: an integral float is the integer (5.0 is 5)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return int(value)
    return value


Whole = BeforeValidator(_whole)


def _task_id(value: str) -> str:
    if not is_task_id(value):
        raise PydanticCustomError("task_id", "a task id is task_ and 8 lowercase base32 "
                                  "characters")
    return value


def _vm_id(value: str) -> str:
    if not is_vm_id(value):
        raise PydanticCustomError("vm_id", "a VM id is vm_ and 8 lowercase base32 characters")
    return value


def _exec_id(value: str) -> str:
    if not is_exec_id(value):
        raise PydanticCustomError("exec_id", "an exec id is exec_ and 8 lowercase base32 "
                                  "characters")
    return value


def _snapshot_id(value: str) -> str:
    if not is_snapshot_id(value):
        raise PydanticCustomError("snapshot_id", "a snapshot id is snap_ and 8 lowercase "
                                  "base32 characters")
    return value


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise PydanticCustomError("nul", "must not contain NUL characters")
    return value


def _absolute(value: str) -> str:
    if not value.startswith("/"):
        raise PydanticCustomError("path", "must be absolute (start with /)")
    return value


NoNul = AfterValidator(_no_nul)
TASK_ID_PATTERN = "^task_[a-z2-7]{8}$"
VM_ID_PATTERN = "^vm_[a-z2-7]{8}$"
TaskId = Annotated[str, AfterValidator(_task_id), Field(
    description="A task id (`task_` + 8 characters).",
    json_schema_extra={"pattern": TASK_ID_PATTERN})]
VmId = Annotated[str, AfterValidator(_vm_id), Field(
    description="A VM id (`vm_` + 8 characters).",
    json_schema_extra={"pattern": VM_ID_PATTERN})]
SnapshotId = Annotated[str, AfterValidator(_snapshot_id), Field(
    description="A snapshot id (`snap_` + 8 characters), from rift_vm_snapshot.",
    json_schema_extra={"pattern": "^snap_[a-z2-7]{8}$"})]
ExecId = Annotated[str, AfterValidator(_exec_id), Field(
    description="An exec id (`exec_` + 8 characters), from rift_vm_exec.",
    json_schema_extra={"pattern": "^exec_[a-z2-7]{8}$"})]
HandleText = Annotated[str, Field(description=(
    "The task's handle `task_<id>.<secret>`, from rift_task_new or rift_task_attach. It is "
    "the lease: share it only with your own sub-agents."))]
Name = Annotated[str, Field(min_length=1, max_length=MAX_TEXT,
                            description="A short name people will read."), NoNul]
Key = Annotated[str, Field(min_length=1, max_length=MAX_TEXT, description=(
    "A key of your choosing: repeating the call with the same key and input answers the "
    "first call's result instead of making another.")), NoNul]
Takeover = Annotated[bool, Field(description=(
    "Take the task from a holder that is still active. Tell the user first: the other "
    "holder's handle stops working."))]
Limit = Annotated[int, Field(ge=1, le=100, description="At most this many."), Whole]
MAX_SLEEP_AFTER_S = 7 * 24 * 3600  # a week: longer than a task's idle close ever is
SleepAfterS = Annotated[int, Field(ge=0, le=MAX_SLEEP_AFTER_S, description=(
    "Seconds of quiet (no call under the handle) after which the task's running VMs "
    "sleep: memory saved, domain stopped, woken by the next call that needs them "
    "(SPEC §17). 0: never. Default: the operator's RIFT_TASK_SLEEP_S (900).")), Whole]
Path = Annotated[str, Field(min_length=1, max_length=MAX_PATH,
                            description="An absolute path in the guest."), NoNul,
                 AfterValidator(_absolute)]
Vcpus = Annotated[int, Field(ge=1, le=MAX_VCPUS, description="Virtual CPUs."), Whole]
MemoryMib = Annotated[int, Field(ge=MIN_MEMORY_MIB, le=MAX_MEMORY_MIB, description=(
    "Memory in MiB (default 256; 512 for debian).")), Whole]


def decoded(field: str, text: str, encoding: str) -> bytes:
    """The bytes `text` carries in `encoding` (utf-8 or base64), at most 16 MiB once
    decoded (the input's own bound is on its text)."""
    if len(text) > MAX_CONTENT * (4 / 3 if encoding == "base64" else 1) + 4:
        raise InvalidArgument(field, "at most 16 MiB")
    if encoding == "utf-8":
        data = text.encode("utf-8")
    else:
        try:
            data = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise InvalidArgument(field, f"not valid base64: {exc}") from exc
    if len(data) > MAX_CONTENT:
        raise InvalidArgument(field, "at most 16 MiB")
    return data


def _published(schema: dict[str, Any]) -> None:
    """An input's schema as clients read it: optional fields without their `null`
    branch (leave them out instead), and no generated titles."""
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
        branches = prop.get("anyOf")
        if isinstance(branches, list):
            kept = [b for b in branches if b.get("type") != "null"]
            if len(kept) == 1 and len(kept) < len(branches):
                del prop["anyOf"]
                for key, value in kept[0].items():
                    prop.setdefault(key, value)
        if prop.get("default", 0) is None:
            del prop["default"]


class Input(BaseModel):
    """A tool's input: unknown fields refused, `null` refused, ranges as SPEC §3."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_published)

    @field_validator("*", mode="before")
    @classmethod
    def _left_out_not_null(cls, value: Any) -> Any:
        if value is None:
            raise PydanticCustomError("null", "must not be null: leave the field out")
        return value

    def given(self) -> dict[str, Any]:
        """The fields the caller set, by name."""
        return {name: getattr(self, name) for name in self.model_fields_set}


def _outputs(schema: dict[str, Any]) -> None:
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)


class Output(BaseModel):
    """A tool's answer, or a view inside one: every field is always present."""

    model_config = ConfigDict(json_schema_extra=_outputs)


In = TypeVar("In", bound=Input)


def _shown(key: object) -> str:
    text = str(key)
    printable = "".join(c if c.isprintable() else "?" for c in text[:_FIELD_SHOWN])
    return printable + ("…" if len(text) > _FIELD_SHOWN else "")


_WHY = {
    "missing": "is required",
    "string_type": "must be a string",
    "int_type": "must be an integer",
    "int_parsing": "must be an integer",
    "int_from_float": "must be an integer",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
}


_SOURCES = ("body", "query", "path", "header")


def refusal_of(errors: list[Any], fields: Mapping[str, object] | None = None,
               tool: str = "", located: bool = False) -> InvalidArgument:
    """The first of pydantic's errors as Rift's `invalid_argument`, naming the field.
    Both doors come here: the MCP door with its `ValidationError`, REST with
    FastAPI's, whose locations start with where the field was (`located`: `body`,
    `query`, `path` or `header`)."""
    if not errors:
        return InvalidArgument("body", "malformed")
    first = _union_member(errors)
    loc = list(first.get("loc", ()))
    if located and loc and loc[0] in _SOURCES:
        loc = loc[1:]
    inner = ""
    if any(_is_union_tag(p) for p in loc):  # `egress`: the field, and where inside it
        inner = ".".join(_shown(p) for p in loc[1:] if not _is_union_tag(p))
        loc = loc[:1]
    field = ".".join(_shown(p) for p in loc) or "body"
    kind = first.get("type", "")
    ctx = first.get("ctx") or {}
    if kind == "extra_forbidden":
        takes = ", ".join(fields) if fields is not None else ""
        why = f"is not a field of {tool}; it takes {takes or 'no fields'}" if tool else \
            "unknown field"
    elif kind in ("string_too_short", "string_too_long"):
        got = first.get("input")
        low, high = ctx.get("min_length"), ctx.get("max_length")
        length = len(got) if isinstance(got, str) else "?"
        why = (f"must be at most {high} characters, got {length}" if kind == "string_too_long"
               else f"must be at least {low} characters, got {length}")
    elif kind in ("greater_than_equal", "less_than_equal"):
        got = first.get("input")
        shown = str(got) if isinstance(got, int) and abs(got) < 10**18 else "a number out of range"
        bound = ctx.get("ge", ctx.get("le"))
        why = (f"must be at least {bound}, got {shown}" if kind == "greater_than_equal"
               else f"must be at most {bound}, got {shown}")
    elif kind == "literal_error":
        why = f"must be one of {ctx.get('expected', '')}".replace("'", "")
    else:
        why = _WHY.get(kind) or str(first.get("msg", "invalid"))
    return InvalidArgument(field, f"{inner}: {why}" if inner else why)


def _is_union_tag(part: object) -> bool:
    """Whether a location part names a member of a union (`literal['open','none']`,
    `EgressAllow`) rather than a field (fields are snake_case)."""
    return isinstance(part, str) and (part[:1].isupper() or "[" in part)


def _union_member(errors: list[Any]) -> Any:
    """The first error, or, when it is a union's literal member refusing an input that
    is no string (an allowlist for `egress`), the first error of the member meant."""
    first = errors[0]
    if (any(_is_union_tag(p) and "[" in p for p in first.get("loc", ()))
            and not isinstance(first.get("input"), str)):
        field = first.get("loc", ())[:1]
        for other in errors[1:]:
            loc = other.get("loc", ())
            if loc[:1] == field and not any(_is_union_tag(p) and "[" in p for p in loc):
                return other
    return first


def parse(model: type[In], arguments: Mapping[str, Any] | None, tool: str = "") -> In:
    """A tool's arguments, checked strictly against its input model (the MCP door);
    else `invalid_argument` naming the first field at fault."""
    try:
        return model.model_validate(dict(arguments or {}), strict=True)
    except ValidationError as exc:
        raise refusal_of(exc.errors(), model.model_fields, tool) from None


def command(model: type[In], **fields: Any) -> In:
    """A door's own command (the CLI, the E2B door, the scheduler): `fields` as given,
    `None` ones left out, checked as a call's arguments are."""
    return parse(model, {k: v for k, v in fields.items() if v is not None})


def inline(schema: dict[str, Any], definitions: dict[str, Any] | None = None,
           prefix: str = "#/$defs/") -> dict[str, Any]:
    """A JSON schema with every local `$ref` replaced by what it names (by default
    the schema's own `$defs`), so clients that resolve no references (many MCP
    clients) read it whole."""
    defs = schema.get("$defs", {}) if definitions is None else definitions

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith(prefix):
                return walk(defs[ref.removeprefix(prefix)])
            return {k: walk(v) for k, v in node.items() if k != "$defs"}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    out = walk(schema)
    assert isinstance(out, dict)
    return out
