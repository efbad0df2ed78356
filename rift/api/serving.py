"""`rift serve`'s server: uvicorn, stopping within `STOP_S` of SIGTERM or SIGINT
whatever a guest, a client or a worker thread is doing (SPEC §15).

A stop first goes as uvicorn's does: no new connection, calls in flight get
`GRACE_S` to answer, then the app's shutdown (the pool filler, the sweep, the
SSH pool). A thread stuck in a guest's stall or a libvirt call would hold the
process past that (the interpreter joins its worker threads at exit), so a
watchdog started with the signal ends the process at `STOP_S`. Nothing is lost
by it: every state change is a transaction, and the next start reconciles what
a cut-off call left (as after a `kill -9`, which the crash campaign tries).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from types import FrameType
from typing import Any

import uvicorn

log = logging.getLogger("rift.serve")

GRACE_S = 4.0  # calls in flight may still answer for this long after a stop is asked
STOP_S = 9.0  # the process is gone this long after the first signal, come what may


class PromptServer(uvicorn.Server):
    """uvicorn's server with a deadline on its stop."""

    def __init__(self, config: uvicorn.Config, stop_s: float = STOP_S) -> None:
        super().__init__(config)
        self.stop_s = stop_s
        self._watchdog: threading.Thread | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._watchdog is None:
            self._watchdog = threading.Thread(target=_exit_after, args=(self.stop_s,),
                                              name="rift-stop-watchdog", daemon=True)
            self._watchdog.start()
        super().handle_exit(sig, frame)


def _exit_after(seconds: float) -> None:
    time.sleep(seconds)
    busy = [t.name for t in threading.enumerate()
            if t is not threading.current_thread() and not t.daemon and t.is_alive()]
    log.warning("stop forced: still busy after %.0f s", seconds, extra={"threads": busy})
    logging.shutdown()
    os._exit(0)


def serve(app: Any, *, host: str, port: int, http: Any,
          tls: tuple[str, str] | None = None) -> None:
    """Serve `app` until a signal; back within `STOP_S` of it. `tls`: the certificate's
    and key's files (RIFT_TLS_CERT, RIFT_TLS_KEY): https on the one port."""
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", http=http,
                            timeout_graceful_shutdown=int(GRACE_S),
                            ssl_certfile=tls[0] if tls else None,
                            ssl_keyfile=tls[1] if tls else None)
    PromptServer(config).run()
