"""Background work: APScheduler runs the sweep every `RIFT_SWEEP_INTERVAL_S` in a
worker thread; the pool filler (`PoolFiller`) has a thread of its own."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
import threading

from apscheduler.schedulers.background import BackgroundScheduler

from rift.domain.errors import StoreUnavailable
from rift.services.background.sweeps import sweep
from rift.services.background.usage import sample_usage
from rift.services.context import Deps
from rift.services.lifecycle.pool_filler import refill

log = logging.getLogger("rift.scheduler")

POOL_TICK_S = 5  # the pool filler looks this often, and whenever a pool changes
STOP_WAIT_S = 2.0  # how long a stop waits for the filler's boot under way


def _run(deps: Deps) -> None:
    try:
        sweep(deps)
    except StoreUnavailable:  # said once per interval, without a traceback
        log.warning("sweep skipped: the database did not answer")
    except Exception:  # the next run tries again; a sweep never takes the process down
        log.exception("sweep failed")


class PoolFiller:
    """A thread that fills the pools every `POOL_TICK_S` and as soon as it is woken
    (a pooled VM was taken, a pool was set); a wake while it fills makes it look
    again right after. Named in the database by `filler`, so one replica fills a
    given pool at a time."""

    def __init__(self, deps: Deps) -> None:
        self.deps = deps
        self.filler = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self._woken = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rift-pools", daemon=True)

    def start(self) -> None:
        self.deps.observers.pool_changes.append(self.wake)
        self._woken.set()  # look at once: pools may have emptied while Rift was down
        self._thread.start()

    def wake(self) -> None:
        self._woken.set()

    def stop(self, timeout_s: float | None = STOP_WAIT_S) -> None:
        """Ask it to stop and wait for the start under way (a boot) to end, for at
        most `timeout_s`: a boot cut off by the process's end is a `creating` row
        the next start's reconciliation settles."""
        with contextlib.suppress(ValueError):
            self.deps.observers.pool_changes.remove(self.wake)
        self._stopping.set()
        self._woken.set()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.warning("pool filler still starting a VM at stop; left to reconciliation")

    def _loop(self) -> None:
        while not self._stopping.is_set():
            self._woken.wait(POOL_TICK_S)
            self._woken.clear()
            if self._stopping.is_set():
                return
            try:
                while refill(self.deps, self.filler) and not self._stopping.is_set():
                    pass  # a VM was made: look again before waiting
            except StoreUnavailable:
                log.warning("pool refill skipped: the database did not answer")
            except Exception:
                log.exception("pool refill failed")


def _sample(deps: Deps, net_every_s: float) -> None:
    try:
        sample_usage(deps, net_every_s)
    except StoreUnavailable:
        log.warning("usage not sampled: the database did not answer")
    except Exception:  # the next run tries again; the figures wait (never an error)
        log.warning("usage sampling failed", exc_info=True)


def start_scheduler(deps: Deps, interval_s: int, stats_interval_s: int = 0
                    ) -> BackgroundScheduler:
    """The sweep every `interval_s`, and usage sampling every `stats_interval_s` (0: none)."""
    scheduler = BackgroundScheduler(timezone="UTC")
    scheduler.add_job(_run, "interval", seconds=interval_s, args=[deps], id="sweep",
                      max_instances=1, coalesce=True, misfire_grace_time=interval_s)
    if stats_interval_s:
        scheduler.add_job(_sample, "interval", seconds=stats_interval_s,
                          args=[deps, interval_s], id="usage", max_instances=1,
                          coalesce=True, misfire_grace_time=stats_interval_s)
    scheduler.start()
    return scheduler
