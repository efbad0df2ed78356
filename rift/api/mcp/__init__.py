"""The MCP door: `POST /mcp` on the official SDK's streamable-HTTP transport. The SDK
owns the protocol (eras, stateless sessions, JSON-RPC framing); what Rift adds sits
on its extension points, one part each:

- `server`: the SDK's server and session manager, mounted with the token check;
- `tools`: each tool as MCP lists it, from its contract (rift/contract/, by resource);
- `refusals`: a RiftError as a tool result with `isError` and a hint (SPEC §3);
- `callers`: who is calling (the holder label from the client's declared name);
- `door`: clear answers to malformed requests, and quiet logs for clients gone;
- `waits`: plain calls that wait (SPEC §10) and the calls in flight;
- `tasks`: MCP Tasks for the calls that wait (SPEC §10): the runtime, an SDK
  `Extension`; `task_book` (this replica's tasks and how each era shows them),
  `task_methods` (`tasks/get`, `cancel`, …), `task_notices` (`subscriptions/listen`).
"""
