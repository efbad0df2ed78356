"""APScheduler runs the sweep every `RIFT_SWEEP_INTERVAL_S` in a worker thread."""

from __future__ import annotations

import logging

from apscheduler.schedulers.background import BackgroundScheduler

from rift.domain.errors import StoreUnavailable
from rift.services.context import Deps
from rift.services.sweeps import sweep

log = logging.getLogger("rift.scheduler")


def _run(deps: Deps) -> None:
    try:
        sweep(deps)
    except StoreUnavailable:  # said once per interval, without a traceback
        log.warning("sweep skipped: the database did not answer")
    except Exception:  # the next run tries again; a sweep never takes the process down
        log.exception("sweep failed")


def start_scheduler(deps: Deps, interval_s: int) -> BackgroundScheduler:
    scheduler = BackgroundScheduler(timezone="UTC")
    scheduler.add_job(_run, "interval", seconds=interval_s, args=[deps], id="sweep",
                      max_instances=1, coalesce=True, misfire_grace_time=interval_s)
    scheduler.start()
    return scheduler
