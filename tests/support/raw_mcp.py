"""Bare JSON-RPC over Rift's MCP door, for the flows the SDK's client does not
speak (MCP Tasks of either era, `subscriptions/listen` with `taskIds`): every
message as a test would write it by hand, and every answer as the server sent
it, notifications included."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

MODERN = "2026-07-28"
LEGACY = "2025-11-25"
TASKS = "io.modelcontextprotocol/tasks"
NAMED = {"tools/call": "name", "tasks/get": "taskId", "tasks/cancel": "taskId",
         "tasks/update": "taskId"}


@dataclass
class Answer:
    """One request's answer: its JSON-RPC result or error, and the notifications
    that came before it on its stream."""

    status: int
    result: dict[str, Any] | None
    error: dict[str, Any] | None
    notifications: list[dict[str, Any]] = field(default_factory=list)


def sse_messages(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    data: list[str] = []
    for line in lines:
        if line.startswith("data:"):
            data.append(line[5:].strip())
        elif not line.strip() and data:
            yield json.loads("\n".join(data))
            data = []
    if data:
        yield json.loads("\n".join(data))


@dataclass
class RawMcp:
    url: str  # the server's base URL
    token: str
    era: str = MODERN
    declare_tasks: bool = True  # 2026-07-28: name the tasks extension in each request's _meta
    session_id: str | None = None
    ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def headers(self, method: str, params: dict[str, Any]) -> dict[str, str]:
        out = {"Authorization": f"Bearer {self.token}",
               "Accept": "application/json, text/event-stream"}
        if self.era == MODERN:
            out |= {"MCP-Protocol-Version": MODERN, "Mcp-Method": method}
            if method in NAMED and isinstance(params.get(NAMED[method]), str):
                out["Mcp-Name"] = params[NAMED[method]]
        elif self.session_id is not None:
            out |= {"MCP-Protocol-Version": self.era, "Mcp-Session-Id": self.session_id}
        return out

    def body(self, method: str, params: dict[str, Any], *, notify: bool = False,
             request_id: int | None = None) -> dict[str, Any]:
        if self.era == MODERN:
            capabilities: dict[str, Any] = {"extensions": {TASKS: {}}} if self.declare_tasks \
                else {}
            params = dict(params, _meta={
                **params.get("_meta", {}),
                "io.modelcontextprotocol/protocolVersion": MODERN,
                "io.modelcontextprotocol/clientInfo": {"name": "raw-tests", "version": "1"},
                "io.modelcontextprotocol/clientCapabilities": capabilities})
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
        if not notify:
            message["id"] = request_id if request_id is not None else next(self.ids)
        return message

    def initialize(self) -> dict[str, Any]:
        """The handshake era's `initialize` and `notifications/initialized`."""
        assert self.era != MODERN
        answer = httpx.post(self.url + "/mcp", headers=self.headers("initialize", {}),
                            timeout=30, json=self.body("initialize", {
                                "protocolVersion": self.era, "capabilities": {},
                                "clientInfo": {"name": "raw-tests", "version": "1"}}))
        assert answer.status_code == 200, answer.text
        self.session_id = answer.headers.get("mcp-session-id")
        result = _answer(answer).result
        assert result is not None
        self.notify("notifications/initialized", {})
        return result

    def notify(self, method: str, params: dict[str, Any]) -> int:
        return httpx.post(self.url + "/mcp", headers=self.headers(method, params), timeout=30,
                          json=self.body(method, params, notify=True)).status_code

    def request(self, method: str, params: dict[str, Any], timeout_s: float = 120,
                request_id: int | None = None) -> Answer:
        answer = httpx.post(self.url + "/mcp", headers=self.headers(method, params),
                            timeout=timeout_s,
                            json=self.body(method, params, request_id=request_id))
        return _answer(answer)

    def ok(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """A request that must be answered with a result: the result."""
        answer = self.request(method, params)
        assert answer.error is None and answer.result is not None, answer
        return answer.result

    def err(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """A request that must be answered with a JSON-RPC error: the error."""
        answer = self.request(method, params)
        assert answer.error is not None, answer
        return answer.error

    def call(self, tool: str, arguments: dict[str, Any], **params: Any) -> Answer:
        return self.request("tools/call", {"name": tool, "arguments": arguments, **params})

    def stream(self, method: str, params: dict[str, Any],
               timeout_s: float = 120) -> Iterator[dict[str, Any]]:
        """Each message of one request's event stream, as it comes."""
        with httpx.stream("POST", self.url + "/mcp", headers=self.headers(method, params),
                          json=self.body(method, params), timeout=timeout_s) as response:
            assert response.status_code == 200, response.read()
            yield from sse_messages(response.iter_lines())


def _answer(response: httpx.Response) -> Answer:
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        messages = list(sse_messages(iter(response.text.splitlines())))
    elif response.content:
        messages = [response.json()]
    else:
        messages = []
    final = next((m for m in messages if "id" in m and ("result" in m or "error" in m)), {})
    return Answer(response.status_code, final.get("result"), final.get("error"),
                  [m for m in messages if "method" in m])


def call_tool(client: Any, token: str, tool: str, arguments: dict[str, Any]) -> Any:
    """One bare 2026-07-28 `tools/call` through an in-process client of the app
    (FastAPI's TestClient): its result."""
    raw = RawMcp("", token, declare_tasks=False)
    params = {"name": tool, "arguments": arguments}
    answer = _answer(client.post("/mcp", headers=raw.headers("tools/call", params),
                                 json=raw.body("tools/call", params)))
    assert answer.status == 200 and answer.result is not None, answer
    return answer.result
