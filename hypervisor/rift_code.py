"""rift-code, the guest half of code contexts (SPEC §20): a standalone Python 3 script
(standard library only) that Rift puts into a guest and starts there. It keeps one
kernel per context and serves HTTP on the guest's loopback, which Rift reaches
through an SSH `direct-tcpip` channel (the guest port; nothing listens outside).

A context's kernel is Jupyter's ipykernel, driven through jupyter_client, where the
guest has both (the `python` image: Debian's python3-ipykernel); elsewhere it is
rift-code's own (`python3 rift_code.py worker`: code run in one namespace that
persists, the last expression's rich forms, `display()`, matplotlib figures drawn
with Agg and sent as PNG), so any guest with python3 runs code. Either runs in a
process of its own: a timeout or a cancel interrupts it (SIGINT: KeyboardInterrupt)
and the context goes on; a kernel that died says so, and its context starts a new
one on its next run.

Routes (JSON in and out): `GET /health?wait_ms=N` (answered once the default
context's kernel started with `--default` is warm, or the wait passed: `warm`);
`GET /contexts`; `POST /contexts` {id?,
language, cwd?}; `POST /contexts/ID/restart`; `POST /contexts/ID/interrupt` {run_id?};
`DELETE /contexts/ID`; `POST /runs` {run_id, context_id, code, timeout_s, wait_ms,
parts?} and `GET /runs/ID?wait_ms=N`: a run's view once it ended or the wait passed;
`GET /runs/ID?wait_ms=N&parts=K` (or `parts: 0` in the POST): its output after its
first K parts as it comes (answered once there is some, it ended, or the wait passed).
A run's output is capped here (each stream, each text form, each image; the
control plane checks again): what it drops it says (`truncated`, `omitted`).

Usage: rift_code.py serve PORT [--default]  |  rift_code.py worker
"""

from __future__ import annotations

import ast
import base64
import contextlib
import ctypes
import io
import json
import linecache
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

STREAM_CAP = 1 << 20  # bytes of stdout, of stderr and of each text form a run keeps
IMAGE_CAP = 4 << 20  # bytes of one image (decoded)
RESULTS_CAP = 16 << 20  # bytes of all of a run's results
MIMES = ("text/plain", "text/html", "text/markdown", "image/png", "image/svg+xml",
         "application/json")
IMAGES = ("image/png",)  # base64 in a bundle; SVG is text
INTERRUPT_GRACE_S = 10.0  # after an interrupt, how long a kernel has to stop
RUNS_KEPT = 64
# The kernel's warm-up (JupyterKernel.warm): what a counted cell changes is kept
# before it (silent cells bind no name but on the shell itself) and put back after.
_UNDERS = ("_", "__", "___", "_i", "_ii", "_iii")
WARM_SAVE = (f"get_ipython()._rift_warm = (get_ipython().execution_count, "
             f"{{k: get_ipython().user_ns[k] for k in {_UNDERS!r} "
             f"if k in get_ipython().user_ns}})")
WARM_UNDO = f"""def _rift_undo():
    ip = get_ipython()
    count, saved = ip._rift_warm
    del ip._rift_warm
    hm, dh = ip.history_manager, ip.displayhook
    hm.reset(new_session=True)  # In, Out and a session of their own, as at the start
    hm._i00 = hm._i = hm._ii = hm._iii = ''
    dh._ = dh.__ = dh.___ = ''
    for k in {_UNDERS!r} + ('_' + str(count), '_i' + str(count)):
        ip.user_ns.pop(k, None)
    ip.user_ns.update(saved)
    ip.execution_count = count
_rift_undo()
del _rift_undo
"""
# a MIME form's name in E2B's code interpreter's results
E2B_FORMS = {"text/plain": "text", "text/html": "html", "text/markdown": "markdown",
             "image/png": "png", "image/svg+xml": "svg", "application/json": "json"}
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _size(mime: str, value: Any) -> int:
    if mime in IMAGES and isinstance(value, str):  # base64: the bytes it decodes to
        return len(value) * 3 // 4 - value[-2:].count("=")
    return len(value.encode()) if isinstance(value, str) else len(json.dumps(value))


class Run:
    """One run of code in a context: its output as it comes, capped."""

    def __init__(self, run_id: str, context_id: str) -> None:
        self.id, self.context_id = run_id, context_id
        self.started = time.time()
        self.streams = {"stdout": io.StringIO(), "stderr": io.StringIO()}
        self.sizes = {"stdout": 0, "stderr": 0}
        self.results: list[dict[str, Any]] = []
        self.results_bytes = 0
        self.omitted: list[dict[str, Any]] = []
        self.error: dict[str, Any] | None = None
        self.count: int | None = None
        self.status = "running"
        self.truncated = False
        self.newest = ""
        self.tail = ""
        self.ended_at: float | None = None
        self.done = threading.Event()
        self.events: list[dict[str, Any]] = []  # its parts, as they come
        self.changed = threading.Condition()

    def _event(self, event: dict[str, Any]) -> None:
        with self.changed:
            self.events.append(event)
            self.changed.notify_all()

    def out(self, name: str, text: str) -> None:
        self.tail = (self.tail + text)[-400:]  # a print writes its parts one by one
        lines = [line for line in self.tail.replace("\r", "\n").split("\n") if line.strip()]
        if lines:
            self.newest = lines[-1].strip()[:200]
        left = STREAM_CAP - self.sizes[name]
        data = text.encode()
        if len(data) > left:
            self.truncated = True
            text = data[:max(0, left)].decode(errors="ignore")
        self.sizes[name] += len(text.encode())
        if text:
            self._event({"type": name, "text": text, "timestamp": _now()})
        self.streams[name].write(text)

    def result(self, data: dict[str, Any], main: bool) -> None:
        kept: dict[str, Any] = {}
        for mime in MIMES:
            if mime not in data:
                continue
            value = data[mime]
            if mime in IMAGES and isinstance(value, str):
                value = "".join(value.split())  # ipykernel's base64 comes in lines
            size = _size(mime, value)
            if mime in IMAGES and size > IMAGE_CAP:
                self.omitted.append({"mime": mime, "bytes": size,
                                     "reason": f"an image may be at most {IMAGE_CAP} bytes"})
                continue
            if mime.startswith("text/") and size > STREAM_CAP:
                value, size, self.truncated = value.encode()[:STREAM_CAP].decode(
                    errors="ignore"), STREAM_CAP, True
            if self.results_bytes + size > RESULTS_CAP:
                self.omitted.append({"mime": mime, "bytes": size,
                                     "reason": f"a run's results may be at most {RESULTS_CAP} "
                                               "bytes"})
                continue
            self.results_bytes += size
            kept[mime] = value
        if kept:
            self.results.append({"data": kept, "is_main_result": main})
            self._event({"type": "result", "data": kept, "is_main_result": main})

    def fail(self, name: str, value: str, tb: list[str]) -> None:
        lines = [ANSI.sub("", line).rstrip("\n") for line in tb]
        self.error = {"name": name, "value": value, "traceback": "\n".join(lines)[:STREAM_CAP]}
        self._event({"type": "error", **self.error})

    def end(self, status: str) -> None:
        if self.status == "running":
            self.status = status
        self.ended_at = time.time()
        with self.changed:
            self.done.set()
            self.changed.notify_all()

    def stream(self, write: Any) -> None:
        """Its events as E2B's code interpreter streams them (NDJSON), as they come,
        then its execution count and its end."""
        sent = 0
        while True:
            with self.changed:
                while len(self.events) == sent and not self.done.is_set():
                    self.changed.wait(1)
                batch, finished = self.events[sent:], self.done.is_set()
            sent += len(batch)
            for event in batch:
                line = event if event["type"] != "result" else {  # E2B's: forms by name
                    "type": "result", "is_main_result": event["is_main_result"],
                    **{E2B_FORMS[m]: v for m, v in event["data"].items()}}
                write(json.dumps(line).encode() + b"\n")
            if finished and sent == len(self.events):
                break
        write(json.dumps({"type": "number_of_executions",
                          "execution_count": self.count}).encode() + b"\n")
        write(b'{"type": "end_of_execution"}\n')

    def parts_after(self, seen: int, wait: float) -> dict[str, Any]:
        """Its output after the first `seen` parts, once there is some or it ended or
        `wait` passed: each part as it came (`stdout`/`stderr` text, a `result`'s
        MIME forms, the `error`), and its whole view once it ended."""
        deadline = time.monotonic() + wait
        with self.changed:
            while len(self.events) <= seen and not self.done.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.changed.wait(left)
            parts, ended = self.events[seen:], self.done.is_set()
        # its status is set a moment before it ends: until then it is running
        answer = {"run_id": self.id, "context_id": self.context_id,
                  "status": self.status if ended else "running", "newest_line": self.newest,
                  "parts": parts, "parts_seen": seen + len(parts)}
        if ended:
            answer["execution"] = self.view()["execution"]
        return answer

    def view(self) -> dict[str, Any]:
        return {"run_id": self.id, "context_id": self.context_id, "status": self.status,
                "newest_line": self.newest, "execution": {
                    "results": self.results, "stdout": self.streams["stdout"].getvalue(),
                    "stderr": self.streams["stderr"].getvalue(), "error": self.error,
                    "execution_count": self.count, "truncated": self.truncated,
                    "omitted": self.omitted,
                    "duration_ms": round(((self.ended_at or time.time()) - self.started)
                                         * 1000)}}


class WorkerKernel:
    """rift-code's own kernel: `python3 rift_code.py worker` in a session of its own,
    spoken to in JSON lines over its stdin and stdout."""

    backend = "rift"

    def __init__(self, cwd: str | None) -> None:
        env = dict(os.environ, MPLBACKEND="Agg", PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(  # noqa: S603 (this script, run by this python)
            [sys.executable, os.path.abspath(__file__), "worker"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, cwd=cwd or None, env=env, start_new_session=True)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def interrupt(self) -> None:
        if self.alive():
            os.kill(self.proc.pid, signal.SIGINT)

    def stop(self) -> None:
        if self.alive():
            self.proc.kill()
        self.proc.wait(10)

    def warm(self) -> None:
        return None  # its first cell costs what the next does

    def execute(self, code: str, run: Run, env: dict[str, str]) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"code": code, "env": env}).encode() + b"\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:
            event = json.loads(line)
            kind = event["type"]
            if kind in ("stdout", "stderr"):
                run.out(kind, event["text"])
            elif kind == "result":
                run.result(event["data"], event["main"])
            elif kind == "error":
                run.fail(event["name"], event["value"], event["traceback"])
            elif kind == "end":
                run.count = event["execution_count"]
                return
        raise EOFError("the kernel died")


class JupyterKernel:
    """Jupyter's ipykernel through jupyter_client."""

    backend = "ipykernel"

    def __init__(self, cwd: str | None) -> None:
        from jupyter_client.manager import KernelManager
        self.km = KernelManager(kernel_name="python3")
        # debugpy's warning about frozen modules, printed at each kernel's start
        env = dict(os.environ, PYDEVD_DISABLE_FILE_VALIDATION="1")
        self.km.start_kernel(cwd=cwd or None, env=env)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=300)

    def alive(self) -> bool:
        return bool(self.km.is_alive())

    def interrupt(self) -> None:
        self.km.interrupt_kernel()

    def warm(self) -> None:
        """A cell run as a user's is (counted, kept in the history, its result shown),
        then what it left put back as it was: ipykernel's first such run costs more
        than its next ones (some 60 ms under TCG), and a pooled VM's first run should
        not pay it. A kernel that did not take the cells is warm all the same."""
        for code, silent in ((WARM_SAVE, True), ("1+1", False), (WARM_UNDO, True)):
            msg_id = self.kc.execute(code, silent=silent, store_history=not silent)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    msg = self.kc.get_iopub_msg(timeout=1)
                except queue.Empty:
                    continue
                if msg["parent_header"].get("msg_id") == msg_id \
                        and msg["msg_type"] == "status" \
                        and msg["content"]["execution_state"] == "idle":
                    break

    def stop(self) -> None:
        self.kc.stop_channels()
        with contextlib.suppress(Exception):  # a kernel that died is gone already
            self.km.shutdown_kernel(now=True)

    def execute(self, code: str, run: Run, env: dict[str, str]) -> None:
        if env:  # for this run only: set before it, put back after (silent cells)
            self.kc.execute(f"import os as _rift_os\n_rift_env = {{k: _rift_os.environ.get(k) "
                            f"for k in {list(env)!r}}}\n_rift_os.environ.update({env!r})",
                            silent=True, store_history=False)
        try:
            self._execute(code, run)
        finally:
            if env:
                self.kc.execute("for _k, _v in _rift_env.items():\n    _rift_os.environ.pop(_k)"
                                " if _v is None else _rift_os.environ.__setitem__(_k, _v)",
                                silent=True, store_history=False)

    def _execute(self, code: str, run: Run) -> None:
        msg_id = self.kc.execute(code, allow_stdin=False)
        while True:
            try:
                msg = self.kc.get_iopub_msg(timeout=0.5)
            except queue.Empty:
                if not self.alive():
                    raise EOFError("the kernel died") from None
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                run.out(content["name"], content["text"])
            elif kind == "execute_input":
                run.count = content["execution_count"]
            elif kind in ("execute_result", "display_data"):
                run.result(content["data"], kind == "execute_result")
            elif kind == "error":
                run.fail(content["ename"], content["evalue"], content["traceback"])
            elif kind == "status" and content["execution_state"] == "idle":
                return


def _jupyter() -> bool:
    if os.environ.get("RIFT_CODE_BACKEND") == "rift":
        return False
    try:
        import ipykernel  # noqa: F401
        import jupyter_client  # noqa: F401
    except ImportError:
        return False
    return True


class Context:
    def __init__(self, context_id: str, language: str, cwd: str | None) -> None:
        self.id, self.language, self.cwd = context_id, language, cwd
        self.lock = threading.Lock()  # one run at a time; the next waits
        self.kernel: WorkerKernel | JupyterKernel | None = None
        self.running: Run | None = None
        self.last_run_at: float | None = None
        self.count = 0

    def start(self) -> None:
        self.kernel = JupyterKernel(self.cwd) if _jupyter() else WorkerKernel(self.cwd)

    def warm(self) -> None:
        with self.lock:
            if self.kernel is None:
                self.start()
                assert self.kernel is not None
                self.kernel.warm()

    def view(self) -> dict[str, Any]:
        return {"id": self.id, "language": self.language, "cwd": self.cwd,
                "backend": self.kernel.backend if self.kernel else None,
                "alive": bool(self.kernel and self.kernel.alive()),
                "running": self.running.id if self.running else None,
                "last_run_at": self.last_run_at}

    def stop(self) -> None:
        if self.kernel is not None:
            self.kernel.stop()
            self.kernel = None

    def interrupt(self, runs: list[Run]) -> None:
        """Interrupt the context's runs not ended (`runs`): one waiting for its turn
        does not start; the one running hears SIGINT until it ends (a kernel between
        cells ignores it), and past INTERRUPT_GRACE_S its kernel is ended."""
        for run in runs:
            if run.status == "running":
                run.status = "interrupted"
        threading.Thread(target=self._interrupt_until_done, args=(runs,), daemon=True).start()

    def _interrupt_until_done(self, runs: list[Run]) -> None:
        until = time.monotonic() + INTERRUPT_GRACE_S
        for run in runs:
            while not run.done.is_set():
                kernel = self.kernel
                if time.monotonic() > until:
                    self._still_running(run)
                    break
                if self.running is run and kernel is not None:
                    kernel.interrupt()
                run.done.wait(0.2)

    def run(self, run: Run, code: str, timeout_s: float, env: dict[str, str]) -> None:
        with self.lock:
            self.running = run
            try:
                if run.status == "interrupted":  # before its turn came
                    run.fail("KeyboardInterrupt", "interrupted before it ran", [])
                    return
                self._run(run, code, timeout_s, env)
            finally:
                self.running = None
                self.last_run_at = time.time()
                run.end("error" if run.error else "ok")

    def _run(self, run: Run, code: str, timeout_s: float, env: dict[str, str]) -> None:
        if self.kernel is None or not self.kernel.alive():
            self.stop() if self.kernel is not None else None
            self.start()
        kernel = self.kernel
        assert kernel is not None
        timer = threading.Timer(timeout_s, self._timed_out, (run,))
        timer.start()
        try:
            kernel.execute(code, run, env)
        except (EOFError, OSError, ValueError) as exc:
            if run.status == "running":
                run.status = "kernel_died"
            run.fail("KernelDied", f"the kernel ended ({exc}); the context starts a new one "
                     "on its next run", [])
        finally:
            timer.cancel()

    def _timed_out(self, run: Run) -> None:
        if self.running is run and run.status == "running":
            run.status = "timed_out"
            threading.Thread(target=self._interrupt_until_done, args=([run],),
                             daemon=True).start()

    def _still_running(self, run: Run) -> None:
        if self.running is run and self.kernel is not None:  # it ignored the interrupt
            self.kernel.stop()


class Server:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.contexts: dict[str, Context] = {}
        self.runs: dict[str, Run] = {}
        self.warmed = threading.Event()  # the default kernel's start (--default) ended

    def warm_default(self) -> None:
        try:
            self.context("default").warm()
        finally:
            self.warmed.set()

    def context(self, context_id: str) -> Context:
        with self.lock:
            if context_id not in self.contexts:
                if context_id != "default":
                    raise LookupError(context_id)
                self.contexts[context_id] = Context("default", "python", None)
            return self.contexts[context_id]

    def new_context(self, body: dict[str, Any]) -> Context:
        ctx = Context(body.get("id") or f"ctx_{os.urandom(5).hex()}", body.get("language",
                      "python"), body.get("cwd"))
        ctx.start()
        with self.lock:
            self.contexts[ctx.id] = ctx
        return ctx

    def start_run(self, body: dict[str, Any]) -> Run:
        ctx = self.context(body.get("context_id") or "default")
        run = Run(body["run_id"], ctx.id)
        with self.lock:
            self.runs[run.id] = run
            for old in list(self.runs)[:-RUNS_KEPT]:
                if self.runs[old].done.is_set():
                    del self.runs[old]
        env = body.get("env") or {}
        if not isinstance(env, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise ValueError("env: names and values are strings")
        threading.Thread(target=ctx.run, daemon=True, args=(
            run, body["code"], float(body["timeout_s"]), env)).start()
        return run

    def route(self, method: str, path: str,  # noqa: PLR0911 (one answer per route)
              body: dict[str, Any]) -> tuple[int, Any]:
        parts = [p for p in urlsplit(path).path.split("/") if p]
        query = parse_qs(urlsplit(path).query)
        wait = int(query.get("wait_ms", [body.get("wait_ms", 0)])[0]) / 1000
        if parts == ["health"]:
            self.warmed.wait(wait)
            return 200, {"ok": True, "backend": "ipykernel" if _jupyter() else "rift",
                         "warm": self.warmed.is_set()}
        if parts == ["contexts"] and method == "GET":
            with self.lock:
                return 200, [c.view() for c in self.contexts.values()]
        if parts == ["contexts"] and method == "POST":
            return 200, self.new_context(body).view()
        if parts == ["runs"] and method == "POST":
            run = self.start_run(body)
            if isinstance(body.get("parts"), int):  # its output as it comes, from the start
                return 200, run.parts_after(body["parts"], wait)
            run.done.wait(wait)
            return 200, run.view()
        if len(parts) == 2 and parts[0] == "runs":
            found = self.runs.get(parts[1])
            if found is None:
                return 404, {"error": "run_not_found"}
            if "parts" in query:  # its output as it comes
                return 200, found.parts_after(int(query["parts"][0]), wait)
            found.done.wait(wait)
            return 200, found.view()
        if len(parts) >= 2 and parts[0] == "contexts":
            ctx = self.context(parts[1])
            action = parts[2] if len(parts) > 2 else ""
            if method == "DELETE" and not action:
                ctx.stop()
                with self.lock:
                    self.contexts.pop(ctx.id, None)
                return 200, {"id": ctx.id}
            if action == "interrupt":  # its runs not ended, or the one named
                wanted = body.get("run_id")
                with self.lock:
                    runs = [r for r in self.runs.values()
                            if r.context_id == ctx.id and not r.done.is_set()
                            and wanted in (None, r.id)]
                ctx.interrupt(runs)
                return 200, ctx.view()
            if action == "restart":
                ctx.stop()
                ctx.start()
                return 200, ctx.view()
        return 404, {"error": "not_found"}


def serve(port: int, default: bool) -> None:
    server = Server()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
                if (self.command, urlsplit(self.path).path) == ("POST", "/execute"):
                    self._execute(body)
                    return
                status, out = server.route(self.command, self.path, body)
            except LookupError as exc:
                status, out = 404, {"error": "context_not_found", "context_id": str(exc)}
            except Exception as exc:
                status, out = 500, {"error": "failed", "message": repr(exc)[:2000]}
            data = json.dumps(out).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _execute(self, body: dict[str, Any]) -> None:
            """E2B's code interpreter's `POST /execute`: a run streamed as NDJSON; a
            client that goes away interrupts it."""
            run = server.start_run({"run_id": f"e2b_{os.urandom(5).hex()}",
                                    "context_id": body.get("context_id") or "default",
                                    "code": body.get("code") or "", "timeout_s": 86400,
                                    "env": body.get("env_vars") or {}})
            self.send_response(200)
            self.send_header("Content-Type", "application/x-ndjson")
            self.end_headers()

            def write(data: bytes) -> None:
                self.wfile.write(data)
                self.wfile.flush()

            try:
                run.stream(write)
            except OSError:  # the client went away: its run is interrupted
                server.context(run.context_id).interrupt([run])

        do_GET = do_POST = do_DELETE = _answer

    httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    httpd.daemon_threads = True
    if default:  # the default context's kernel starts now, while the server answers
        threading.Thread(target=server.warm_default, daemon=True).start()
    else:
        server.warmed.set()
    httpd.serve_forever()


def worker() -> None:  # noqa: PLR0915 (one loop: read a cell, run it, say what it did)
    """rift-code's own kernel: cells from stdin, events to stdout (JSON lines)."""
    with contextlib.suppress(OSError, AttributeError):  # ends with its server (Linux)
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    out = os.fdopen(os.dup(1), "w", buffering=1)
    lock = threading.Lock()
    namespace: dict[str, Any] = {"__name__": "__main__"}

    def emit(event: dict[str, Any]) -> None:
        with lock:
            out.write(json.dumps(event) + "\n")

    class Stream(io.TextIOBase):
        """A cell's stdout or stderr, sent a whole line at a time (or 64 KiB)."""

        def __init__(self, name: str) -> None:
            self.name_ = name
            self.held = ""

        def write(self, text: str) -> int:
            self.held += text
            cut = self.held.rfind("\n") + 1 if len(self.held) < 1 << 16 else len(self.held)
            if cut:
                emit({"type": self.name_, "text": self.held[:cut]})
                self.held = self.held[cut:]
            return len(text)

        def flush(self) -> None:
            if self.held:
                emit({"type": self.name_, "text": self.held})
                self.held = ""

    def flushed() -> None:
        sys.stdout.flush()
        sys.stderr.flush()

    def bundle(value: Any) -> dict[str, Any]:
        data: dict[str, Any] = {"text/plain": repr(value)}
        for method, mime in (("_repr_html_", "text/html"), ("_repr_markdown_", "text/markdown"),
                             ("_repr_svg_", "image/svg+xml"), ("_repr_png_", "image/png"),
                             ("_repr_json_", "application/json")):
            try:
                form = getattr(value, method, None)
                got = form() if callable(form) else None
            except Exception:  # noqa: S112 (a form that fails is left out)
                continue
            if isinstance(got, tuple):
                got = got[0]
            if isinstance(got, bytes):
                got = base64.b64encode(got).decode()
            if got is not None:
                data[mime] = got
        return data

    def display(*values: Any) -> None:
        flushed()
        for value in values:
            emit({"type": "result", "data": bundle(value), "main": False})

    def figures() -> None:
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is None:
            return
        for number in plt.get_fignums():
            buf = io.BytesIO()
            plt.figure(number).savefig(buf, format="png", bbox_inches="tight")
            emit({"type": "result", "main": False, "data": {
                "text/plain": f"<Figure {number}>",
                "image/png": base64.b64encode(buf.getvalue()).decode()}})
        plt.close("all")

    namespace["display"] = display
    sys.stdout, sys.stderr = Stream("stdout"), Stream("stderr")
    sys.stdin = io.StringIO()
    cells = os.fdopen(os.dup(0), "r")
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    in_cell = threading.Event()

    def interrupted(signum: int, frame: Any) -> None:
        if in_cell.is_set():
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupted)
    for count, line in enumerate(cells, 1):
        cell = json.loads(line)
        code, env = cell["code"], cell.get("env") or {}
        saved = {name: os.environ.get(name) for name in env}
        os.environ.update(env)  # for this cell only
        # the cell's lines, for its tracebacks
        linecache.cache[f"<cell {count}>"] = (len(code), None, code.splitlines(True),
                                              f"<cell {count}>")
        in_cell.set()
        try:
            tree = ast.parse(code, f"<cell {count}>")
            last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
            exec(compile(tree, f"<cell {count}>", "exec"), namespace)  # noqa: S102
            flushed()
            if last is not None:
                expression = compile(ast.Expression(last.value), f"<cell {count}>", "eval")
                value = eval(expression, namespace)  # noqa: S307
                if value is not None:
                    namespace["_"] = value
                    emit({"type": "result", "data": bundle(value), "main": True})
            figures()
        except BaseException as exc:
            with contextlib.suppress(Exception):
                flushed()
            frames = traceback.extract_tb(exc.__traceback__)
            cell = [f for f in frames if f.filename != __file__]  # the cell's own frames
            emit({"type": "error", "name": type(exc).__name__, "value": str(exc),
                  "traceback": ["Traceback (most recent call last):\n",
                                *traceback.format_list(cell),
                                *traceback.format_exception_only(exc)]})
            with contextlib.suppress(Exception):
                figures()
        in_cell.clear()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        with contextlib.suppress(Exception):
            flushed()
        emit({"type": "end", "execution_count": count})


def main() -> None:
    if sys.argv[1:2] == ["worker"]:
        worker()
    elif sys.argv[1:2] == ["serve"]:
        serve(int(sys.argv[2]), "--default" in sys.argv[3:])
    else:
        sys.exit(__doc__.split("Usage: ")[1] if __doc__ else "usage")


if __name__ == "__main__":
    main()
