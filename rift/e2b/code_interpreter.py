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
calls) with the handle this process answered for the sandbox. A run answers when it
ends (at most MAX_WAIT_S), its lines in E2B's order: stdout, stderr, results, the
error, the execution count; `env_vars` are the run's own. E2B's template
`code-interpreter-v1` (the SDK's
default) starts a VM of the `python` image where it is built (else of
RIFT_DEFAULT_IMAGE: `debian` runs rift-code's own kernel), its kernel already
running (rift.e2b.sandboxes).
"""

from __future__ import annotations

import json
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rift.contract import tools as c
from rift.contract.base import MAX_WAIT_S, command
from rift.contract.code import ExecutionView
from rift.domain.errors import HandleRequired, InvalidArgument, RiftError
from rift.e2b import ports
from rift.e2b.envd import Call, EnvdPart, call_for, files_refusal
from rift.services.context import Deps
from rift.services.lifecycle import code
from rift.services.lifecycle.exposures import Target

JUPYTER_PORT = 49999  # the SDK's JUPYTER_PORT
RUN_S = 300  # a run's timeout: the SDK's DEFAULT_TIMEOUT
FORMS = {"text/plain": "text", "text/html": "html", "text/markdown": "markdown",
         "image/png": "png", "image/svg+xml": "svg", "application/json": "json"}


def execution_lines(execution: ExecutionView) -> bytes:
    """A run as E2B's `/execute` streams it: one JSON object a line."""
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    lines: list[dict[str, Any]] = []
    if execution.stdout:
        lines.append({"type": "stdout", "text": execution.stdout, "timestamp": at})
    if execution.stderr:
        lines.append({"type": "stderr", "text": execution.stderr, "timestamp": at})
    for result in execution.results:
        lines.append({"type": "result", "is_main_result": result.is_main_result,
                      **{FORMS[m]: v for m, v in result.data.items() if m in FORMS}})
    if execution.error is not None:
        lines.append({"type": "error", **execution.error.model_dump()})
    lines.append({"type": "number_of_executions", "execution_count": execution.execution_count})
    lines.append({"type": "end_of_execution"})
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


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
        try:
            call = await self.state.waiting.run(None, self._call, request)
            body = await self._json(request)
            language = body.get("language") or "python"
            ran = await self.state.waiting.run(
                call.caller.user, code.run, self.deps, call.caller, command(
                    c.VmRunCodeIn, handle=call.handle, vm_id=call.vm_id,
                    code=body.get("code") or "", language=language,
                    context_id=body.get("context_id") or None, timeout_s=RUN_S,
                    env=body.get("env_vars") or None, wait_s=MAX_WAIT_S))
        except RiftError as err:
            return files_refusal(err)
        return Response(execution_lines(ran.execution), media_type="application/x-ndjson")

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

