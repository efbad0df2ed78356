"""The exposures' tools: expose a guest port at a URL of its own, end it; their input
models, the exposure answer and their contracts."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from rift.contract.base import HandleText, Input, Output, VmId, Whole
from rift.contract.tool import HELD, ToolContract
from rift.contract.views import ExposureView
from rift.contract.vms import VmOut

GuestPort = Annotated[int, Field(ge=1, le=65535, description=(
    "A TCP port the guest listens on (on any address, loopback included).")), Whole]


class PortBody(Input):
    port: GuestPort


class VmPortIn(PortBody):
    """A port of a VM of the handle's task: what expose and unexpose take."""

    handle: HandleText | None = None
    vm_id: VmId


class ExposureOut(Output):
    exposure: ExposureView


VM_EXPOSE = ToolContract(
    "rift_vm_expose", "Expose a port of a VM",
    "Make a TCP port of a running VM of the handle's task reachable over HTTP and "
    "WebSocket at a URL of its own, proxied by Rift; the URL's secret is its only key, "
    "shown only in this answer. Exposing the port again mints a new URL and ends the "
    "old one; rift_vm_unexpose, destroying the VM or closing the task ends it. A "
    "sleeping VM is woken first.",
    (*HELD, "vm_not_found", "vm_not_running", "guest_unreachable", "no_capacity",
     "invalid_argument"), VmPortIn, ExposureOut,
    destructive=True)


VM_UNEXPOSE = ToolContract(
    "rift_vm_unexpose", "End a port's exposure",
    "End the exposure of a port of a VM of the handle's task: its URL answers 404 from "
    "now on. A port not exposed changes nothing.",
    (*HELD, "vm_not_found", "invalid_argument"), VmPortIn, VmOut, destructive=True,
    idempotent=True)
