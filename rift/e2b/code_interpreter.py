"""E2B's code interpreter (SPEC §20; its SDK `e2b-code-interpreter`: `Sandbox.run_code`,
contexts, charts) through the door. With E2B_SANDBOX_URL pointed at the door, the
SDK sends its Jupyter port's calls to the door itself, the sandbox in
`E2b-Sandbox-Id` and the port (49999) in `E2b-Sandbox-Port`: `POST /execute`
(`{code, context_id, language}`, answered as NDJSON lines), `GET|POST /contexts`,
`DELETE /contexts/{id}` and `POST /contexts/{id}/restart`, here answered by Rift's
code contexts (rift.services.lifecycle.code), as every door's are. (Reached by name,
`49999-<id>.<domain>`, the port is relayed to rift-code in the guest, which speaks
the same routes itself, its output streamed as it comes.)

Who calls: the sandbox's envd access token (`X-Access-Token`, the task's handle), or
its traffic token (`E2B-Traffic-Access-Token`, which the SDK sends for the contexts'
calls) with the handle this process answered for the sandbox. A run's lines stream as the
kernel makes them (rift.services.lifecycle.code_stream: each stdout or stderr
piece, each result, the error), then its execution count and its end, so the SDK's
`on_stdout`/`on_stderr`/`on_result` hear each as it comes; a client that goes away
interrupts the run; `env_vars` are the run's own. E2B's template
`code-interpreter-v1` (the SDK's
default) starts a VM of the `python` image where it is built (else of
RIFT_DEFAULT_IMAGE: `debian` runs rift-code's own kernel), its kernel already
running (rift.e2b.sandboxes).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rift.api.waiting import HeldStream
from rift.contract import tools as c
from rift.contract.base import command
from rift.contract.code import ExecutionView
from rift.domain.errors import HandleRequired, InvalidArgument, RiftError
from rift.e2b import ports
from rift.e2b.envd import Call, EnvdPart, call_for, files_refusal
from rift.services.context import Deps
from rift.services.lifecycle import code, code_stream
from rift.services.lifecycle.exposures import Target
from rift.services.read.code_views import Part

JUPYTER_PORT = 49999  # the SDK's JUPYTER_PORT
RUN_S = 300  # a run's timeout: the SDK's DEFAULT_TIMEOUT
FORMS = {"text/plain": "text", "text/html": "html", "text/markdown": "markdown",
         "image/png": "png", "image/svg+xml": "svg", "application/json": "json"}


def _line(item: dict[str, Any]) -> bytes:
    return json.dumps(item).encode() + b"\n"


def part_line(part: Part) -> bytes:
    """One piece of a run's output as E2B's `/execute` streams it: a JSON line."""
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if part.kind in ("stdout", "stderr"):
        return _line({"type": part.kind, "text": part.text, "timestamp": at})
    if part.result is not None:
        return _line({"type": "result", "is_main_result": part.result.is_main_result,
                      **{FORMS[m]: v for m, v in part.result.data.items() if m in FORMS}})
    assert part.error is not None
    return _line({"type": "error", **part.error.model_dump()})


def execution_lines(items: Iterator[Part | ExecutionView]) -> Iterator[bytes]:
    """A run's lines as they come, then its execution count and its end; a refusal
    mid-run (its guest went) as the run's error. On the waiting threads; closed
    early (the client went), it closes the run's stream, which interrupts it."""
    try:
        for item in items:
            if isinstance(item, Part):
                yield part_line(item)
            else:
                yield _line({"type": "number_of_executions",
                             "execution_count": item.execution_count})
        yield _line({"type": "end_of_execution"})
    except RiftError as err:
        yield _line({"type": "error", "name": err.code, "value": err.message,
                     "traceback": ""})
        yield _line({"type": "end_of_execution"})
    finally:
        close = getattr(items, "close", None)
        if close is not None:
            close()


def _context(view: c.ContextOut) -> dict[str, Any]:
    return {"id": view.context.id, "language": view.context.language, "cwd": view.context.cwd}


class CodeInterpreterApi(EnvdPart):
    def routes(self) -> list[Route]:
        return [Route("/execute", self.execute, methods=["POST"]),
                Route("/contexts", self.list_contexts, methods=["GET"]),
                Route("/contexts", self.new_context, methods=["POST"]),
                Route("/contexts/{context}", self.delete_context, methods=["DELETE"]),
                Route("/contexts/{context}/restart", self.restart_context, methods=["POST"])]

    def _call(self, request: Request) -> Call:
        """The sandbox's call: by its access token, else by its traffic token (or a
        public sandbox's port) and the handle this process answered for it."""
        sandbox = request.headers.get("e2b-sandbox-id", "")
        token = request.headers.get("x-access-token")
        if not token:
            found = ports.reach(self.deps, sandbox, JUPYTER_PORT,
                                request.headers.get("e2b-traffic-access-token") or None,
                                self.registry.public_ports)
            if isinstance(found, Target):
                token = self.registry.handle_of(sandbox)
            if not token:
                raise HandleRequired()
        return call_for(self.deps, token, sandbox)

    async def _json(self, request: Request) -> dict[str, Any]:
        try:
            body = json.loads(await request.body() or b"{}")
        except ValueError as exc:
            raise InvalidArgument("body", "a JSON object") from exc
        if not isinstance(body, dict):
            raise InvalidArgument("body", "a JSON object")
        return body

    async def execute(self, request: Request) -> Response:
        """A run whose lines stream as the kernel makes them: the call and the run's
        start are ordinary calls (a refusal is the whole answer); then its output,
        holding one of the caller's waiting places until the stream ends."""
        try:
            call = await self.state.waiting.run(None, self._call, request)
            body = await self._json(request)
            cmd = command(c.VmRunCodeIn, handle=call.handle, vm_id=call.vm_id,
                          code=body.get("code") or "", language=body.get("language") or "python",
                          context_id=body.get("context_id") or None, timeout_s=RUN_S,
                          env=body.get("env_vars") or None)
            give = self.state.waiting.take(call.caller.user)
        except RiftError as err:
            return files_refusal(err)
        try:
            started = await self.state.waiting.run(None, code_stream.start, self.deps,
                                                   call.caller, cmd)
        except RiftError as err:
            give()
            return files_refusal(err)
        except BaseException:
            give()
            raise
        lines = execution_lines(code_stream.parts(self.deps, started))
        return HeldStream(self.state.waiting.iterate(lines), give,
                          media_type="application/x-ndjson")

    async def list_contexts(self, request: Request) -> Response:
        try:
            call = await self.state.waiting.run(None, self._call, request)
            listed = await self.state.waiting.run(None, _list, self.deps, call)
        except RiftError as err:
            return files_refusal(err)
        return JSONResponse(listed)

    async def new_context(self, request: Request) -> Response:
        try:
            call = await self.state.waiting.run(None, self._call, request)
            body = await self._json(request)
            made = await self.state.waiting.run(
                None, code.new_context, self.deps, call.caller, command(
                    c.VmCodeContextNewIn, handle=call.handle, vm_id=call.vm_id,
                    language=body.get("language") or "python", cwd=body.get("cwd") or None))
        except RiftError as err:
            return files_refusal(err)
        return JSONResponse(_context(made))

    async def delete_context(self, request: Request) -> Response:
        return await self._one(request, code.delete)

    async def restart_context(self, request: Request) -> Response:
        return await self._one(request, code.restart)

    async def _one(self, request: Request, use_case: Any) -> Response:
        try:
            call = await self.state.waiting.run(None, self._call, request)
            done = await self.state.waiting.run(
                None, use_case, self.deps, call.caller, command(
                    c.VmCodeContextIn, handle=call.handle, vm_id=call.vm_id,
                    context_id=request.path_params["context"]))
        except RiftError as err:
            return files_refusal(err)
        return JSONResponse(_context(done))


def _list(deps: Deps, call: Call) -> list[dict[str, Any]]:
    listed = code.list_contexts(deps, call.caller, command(
        c.VmCodeContextListIn, handle=call.handle, vm_id=call.vm_id))
    return [{"id": x.id, "language": x.language, "cwd": x.cwd} for x in listed.contexts]

