"""The exposures' door (SPEC §13): HTTP/1.1 and WebSocket to a guest port, proxied
through the VM's SSH connection (a `direct-tcpip` channel per request or
WebSocket), at `/x/<secret>/…` or at `<secret>.<RIFT_PREVIEW_DOMAIN>`.

An ASGI middleware in front of the app: a request for an exposure never reaches
the API's guards (its body is the guest's business, streamed both ways by the
relays, `relays.py`; what is forwarded and answered, `exposure_headers.py`).
The engine decides (`services.exposures.resolve`); an unknown secret, an ended
one and one whose VM is gone all answer the same 404, after the same lookup.
Served under Rift's own origin (`/x/`), a guest's page gets an opaque origin
(`Content-Security-Policy: sandbox`) and its cookies are dropped, so it can read
nothing of Rift's; a preview domain gives each exposure an origin of its own.
Either way the guest never sees the client's `Authorization`, `Cookie` or
`Rift-Handle`, and every answer says `Referrer-Policy: no-referrer` (the URL
holds the exposure's secret). A request for a sleeping VM wakes it first (SPEC §17)."""

from __future__ import annotations

import anyio
from starlette.types import ASGIApp, Receive, Scope, Send

from rift.api.exposure_headers import header, refuse
from rift.api.rebinding import vouched
from rift.api.relays import Relay
from rift.api.state import AppState
from rift.api.websocket_relay import WebSocketRelay
from rift.domain.errors import GuestUnreachable, RiftError
from rift.services.context import Deps
from rift.services.lifecycle.exposures import Target, resolve
from rift.services.lifecycle.guest_kinds import reach
from rift.services.lifecycle.sleeps import wake
from rift.services.ports import PortChannel, PortClosed

PREFIX = b"/x/"


OPEN_S = 10.0  # to open the channel to the guest's port


def match(scope: Scope, preview_domain: str | None) -> tuple[str, bytes, bool] | None:
    """(secret, the guest's request target, under Rift's own origin) of a request for
    an exposure; None for any other request."""
    query = scope.get("query_string", b"")
    if preview_domain:
        host = header(scope, b"host").decode("latin-1").lower()
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        secret, dot, domain = name.partition(".")
        if dot and domain == preview_domain and secret:
            return secret, _target(scope.get("raw_path") or scope["path"].encode(), query), False
    raw = scope.get("raw_path") or scope["path"].encode()
    if not raw.startswith(PREFIX):
        return None
    secret, _slash, rest = raw[len(PREFIX):].partition(b"/")
    return secret.decode("latin-1"), _target(b"/" + rest, query), True


def _target(path: bytes, query: bytes) -> bytes:
    return path + (b"?" + query if query else b"")


class ExposureProxy:
    def __init__(self, app: ASGIApp, state: AppState, preview_domain: str | None) -> None:
        self.app = app
        self.state = state
        self.preview_domain = preview_domain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = (match(scope, self.preview_domain)
                 if scope["type"] in ("http", "websocket") and not vouched(scope) else None)
        if found is None:
            await self.app(scope, receive, send)
            return
        secret, target_path, own_origin = found
        deps = self.state.deps
        target = await anyio.to_thread.run_sync(resolve, deps, secret)
        if target is None:
            await refuse(scope, send, 404, "no such exposure")
            return
        await relay_to(deps, scope, receive, send, (target, target_path, own_origin))


EXPOSURE = "exposure"  # the actor of a wake a request to an exposure URL made


async def relay_to(deps: Deps, scope: Scope, receive: Receive, send: Send,
                   where: tuple[Target, bytes, bool]) -> None:
    """Relay one request (HTTP or WebSocket) to a guest's port: `where` is the VM and
    port, the guest's request target and whether it is served under Rift's own
    origin. The E2B door's port host names (rift.e2b.ports) come here too."""
    target, target_path, own_origin = where
    vm = target.vm
    if vm.status == "sleeping" or vm.change in ("falling_asleep", "waking"):
        try:  # SPEC §17: a request wakes it, answered once the guest's server answers
            # no warm-up before the first byte: an exec's helper does not serve it
            woken = await anyio.to_thread.run_sync(
                lambda: wake(deps, vm.id, EXPOSURE, woken_by="exposure"))
            target = Target(woken, target.port)
        except RiftError as exc:
            await refuse(scope, send, 503, f"VM {vm.id} did not wake: {exc.message}")
            return
    if target.vm.status != "running":
        await refuse(scope, send, 503, f"VM {target.vm.id} is {target.vm.status}: "
                     "rift_vm_resume brings it back")
        return
    try:
        chan = await anyio.to_thread.run_sync(_open, deps, target)
    except PortClosed:
        await refuse(scope, send, 502, f"nothing listens on port {target.port} in the guest")
        return
    except GuestUnreachable as exc:
        await refuse(scope, send, 502, f"the guest does not answer: {exc.message}")
        return
    relay = Relay if scope["type"] == "http" else WebSocketRelay
    try:
        await relay(chan, scope, receive, send, target.port, target_path, own_origin).run()
    finally:
        chan.close()


def _open(deps: Deps, target: Target) -> PortChannel:
    chan = reach(target.vm, deps.guests.files).open_port(target.vm, target.port, OPEN_S)
    chan.setblocking(False)
    return chan


def redact(path: str) -> str:
    """A path for the logs: an exposure's secret never appears in them."""
    return "/x/…" if path.startswith("/x/") else path
