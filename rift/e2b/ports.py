"""A sandbox's ports at `<port>-<sandbox id>.<RIFT_PREVIEW_DOMAIN>` (SPEC §16, the
SDK's `get_host(port)`), proxied as exposures are (rift.api.exposures.relay_to:
the same relays, headers and refusals; no second proxy).

An ASGI middleware in front of the app, beside the exposures' one: a request
whose `Host` is such a name goes to that port of the sandbox's VM when it carries
the sandbox's `trafficAccessToken` in `e2b-traffic-access-token`, or when the
sandbox allows public traffic (`network.allowPublicTraffic`, E2B's default) and
the operator does too (RIFT_E2B_PUBLIC_PORTS, default off). A sandbox that is
unknown, not the door's, or gone is one 404; a missing or wrong token 403 (as E2B
answers).

The envd port (49983, where E2B's SDK sends its data plane when no
E2B_SANDBOX_URL is set) is not relayed to the guest: such a request is Rift's
own envd routes (rift.e2b.envd, under `/e2b`) for that sandbox, as if it had come
with its `E2b-Sandbox-Id` header; its access token is checked there.
"""

from __future__ import annotations

import re

import anyio
from starlette.types import ASGIApp, Receive, Scope, Send

from rift.api.exposure_headers import header, refuse
from rift.api.exposures import relay_to
from rift.api.rebinding import VOUCHED
from rift.api.state import AppState
from rift.domain.secrets import matches
from rift.e2b import asleep, shapes
from rift.e2b.asleep import SandboxPaused
from rift.e2b.gate import PREFIX
from rift.services.context import Deps
from rift.services.lifecycle.exposures import Target

TOKEN_HEADER = b"e2b-traffic-access-token"
ENVD_PORT = 49983  # envd's port in E2B's SDKs (ConnectionConfig.envd_port)
_LABEL = re.compile(r"([0-9]{1,5})-([a-z2-7]{8})")


def port_host(scope: Scope, domain: str | None) -> tuple[int, str] | None:
    """(port, sandbox id) a request's `Host` names under the domain; else None."""
    if not domain or scope["type"] not in ("http", "websocket"):
        return None
    host = header(scope, b"host").decode("latin-1").lower()
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    label, dot, rest = name.partition(".")
    match = _LABEL.fullmatch(label) if dot and rest == domain else None
    if match is None or not 0 < int(match.group(1)) < 65536:
        return None
    return int(match.group(1)), match.group(2)


def reach(deps: Deps, sandbox: str, port: int, token: str | None,
          public_ports: bool) -> Target | int:
    """The VM and port a request may reach, or the status refusing it."""
    vm_id = shapes.vm_id(sandbox)
    with deps.store.read() as tx:
        record = tx.sandboxes.get(vm_id) if vm_id else None
        vm = tx.vms.get(vm_id) if vm_id and record else None
    if record is None or vm is None or not vm.is_live:
        return 404
    try:
        asleep.admit(deps, record if asleep.paused(vm.status, record) else None)
    except SandboxPaused:
        return 502
    if record.public_traffic and public_ports:
        return Target(vm, port)
    return Target(vm, port) if token and matches(token, record.traffic_digest) else 403


def envd_scope(scope: Scope, sandbox: str) -> Scope:
    """A request to `49983-<id>.<domain>` as the envd route under `/e2b` it names,
    with the sandbox id as its `E2b-Sandbox-Id` (any such header sent is replaced).
    Its `Host` is the operator's preview domain, so the DNS rebinding guard lets it
    by (VOUCHED); envd's routes ask for the sandbox's access token, never a cookie."""
    path = PREFIX + scope["path"]
    raw = scope.get("raw_path") or scope["path"].encode()
    headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"e2b-sandbox-id"]
    state = {**scope.get("state", {}), VOUCHED: True}
    return {**scope, "path": path, "raw_path": PREFIX.encode() + raw, "state": state,
            "headers": [*headers, (b"e2b-sandbox-id", sandbox.encode())]}


class SandboxPorts:
    def __init__(self, app: ASGIApp, state: AppState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        settings = self.state.settings
        found = port_host(scope, settings.preview_domain)
        if found is None:
            await self.app(scope, receive, send)
            return
        port, sandbox = found
        if port == ENVD_PORT:
            await self.app(envd_scope(scope, sandbox), receive, send)
            return
        token = header(scope, TOKEN_HEADER).decode("latin-1") or None
        deps = self.state.deps
        target = await anyio.to_thread.run_sync(reach, deps, sandbox, port, token,
                                                settings.e2b_public_ports)
        if isinstance(target, int):
            text = {404: f"no sandbox {sandbox[:8]!r} of the E2B door",
                    502: f"sandbox {sandbox[:8]!r} is paused (autoResume off): "
                         "Sandbox.connect resumes it",
                    403: "this sandbox's ports need its trafficAccessToken in the "
                         "e2b-traffic-access-token header"}[target]
            await refuse(scope, send, target, text)
            return
        path = scope.get("raw_path") or scope["path"].encode()
        query = scope.get("query_string", b"")
        await relay_to(deps, scope, receive, send,
                       (target, path + (b"?" + query if query else b""), False))
