"""Images from a recipe (SPEC §19, issue #31) on real `tiny` guests, qemu:///system
(TCG here), through the engine's own use case (`builder.submit`, as `rift image
build` runs it), in this process.

1. A five-step recipe (two RUNs of work, a COPY, a RUN, a last RUN): built with
   `no_cache` (cold), then rebuilt after a change to its last step, SAMPLES times
   each. Goal: the rebuild at most 15% of the cold build.
2. A `CMD` image (busybox httpd serving a page) built once; then from the call to
   `rift_vm_new` until the first HTTP answer from the guest's port 8080 (through
   the VM's SSH, as an exposure reaches it): a VM of the image handed out of a
   saved pool, a VM of the image with no pool (a fork of its saved state), and
   the work it saves, a cold boot of `tiny` plus starting the server. Goal: the
   pool's at most 0.3x the cold one.

    .venv/bin/python -m bench builds      (`make bench BENCH=builds`)

RIFT_BENCH_BUILD_SAMPLES (default 3) sets the samples.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from bench.common import print_table, work_dir
from bench.starts import load, ms, p50
from rift.services.context import Deps
from tests.support.servers import REAL_URI, real_vms_missing, seed_images

SAMPLES = int(os.environ.get("RIFT_BENCH_BUILD_SAMPLES", "3"))
FIVE = """\
FROM tiny
RUN dd if=/dev/urandom of=/root/blob bs=1M count=16 2>/dev/null && sha256sum /root/blob > /root/sum
RUN i=0; while [ $i -lt 3000 ]; do echo "line $i"; i=$((i+1)); done > /root/lines
COPY site/ /srv/www/
RUN tar -czf /root/www.tgz /srv/www /root/lines
RUN echo {last} > /root/last
"""
HELLO = """\
FROM tiny
COPY site/ /srv/www/
EXPOSE 8080
CMD ["httpd", "-f", "-p", "8080", "-h", "/srv/www"]
"""
START_HTTPD = ("mkdir -p /srv/www && echo '<h1>built from a recipe</h1>' > /srv/www/index.html && "
               "setsid httpd -f -p 8080 -h /srv/www </dev/null >/dev/null 2>&1 &")


def _engine(data: Path) -> Deps:
    from rift.bootstrap import build_deps
    from rift.config import Settings

    seed_images(data)
    return build_deps(Settings(data_dir=data, hypervisor_uri=REAL_URI, log_level="WARNING"))


PHASES: list[str] = []  # the last build's log lines that time its phases


def _build(deps: Deps, name: str, recipe: str, context: Path, no_cache: bool) -> float:
    from rift.contract.builds import ImageBuildIn
    from rift.services.builds import builder
    from rift.services.builds.builder import BuildParts
    from rift.services.builds.context import Context
    from rift.services.context import Caller

    began = time.monotonic()
    out = builder.submit(deps, Caller("admin", "bench"),
                         ImageBuildIn(name=name, recipe=recipe, no_cache=no_cache),
                         BuildParts(context=Context(context), background=False)).build
    took = time.monotonic() - began
    assert out.state == "succeeded", out.log
    PHASES[:] = [line for line in out.log.splitlines() if " in " in line or " after " in line]
    PHASES.append(f"the whole build: {took:.2f} s")
    return took


def _first_answer(deps: Deps, image: str, start_server: bool) -> float:
    """From `rift_vm_new` until the guest's port 8080 answers HTTP 200."""
    from rift.contract import tools as c
    from rift.contract.base import command
    from rift.services.context import Caller
    from rift.services.lifecycle import execs, tasks, vms

    me = Caller("admin", "bench")
    handle = str(tasks.new(deps, me, command(c.TaskNewIn, name="bench")).handle)
    try:
        began = time.monotonic()
        vm = vms.new(deps, me, command(c.VmNewIn, handle=handle, image=image)).vm
        assert vm.status == "running", vm
        if start_server:
            execs.start(deps, me, command(c.VmExecIn, handle=handle, vm_id=vm.id,
                                          command=START_HTTPD, wait_s=10))
        while not _answers(deps, vm.id):
            if time.monotonic() - began > 120:
                raise AssertionError(f"{image}: port 8080 never answered")
            time.sleep(0.02)
        return time.monotonic() - began
    finally:
        tasks.close(deps, me, command(c.TaskCloseIn, handle=handle))


def _answers(deps: Deps, vm_id: str) -> bool:
    from rift.services.ports import PortClosed

    with deps.store.read() as tx:
        vm = tx.vms.get(vm_id)
    try:
        channel = deps.guests.files.open_port(vm, 8080, 2.0)
    except PortClosed:
        return False
    try:
        channel.send(b"GET / HTTP/1.0\r\n\r\n")
        head = channel.recv(64)
    finally:
        channel.close()
    return head.startswith(b"HTTP/1.") and b" 200" in head


def _pool_ready(deps: Deps, image: str) -> None:
    from rift.contract.base import command
    from rift.contract.operator import PoolSetIn
    from rift.services.lifecycle import pool_filler, pools

    pools.set_pool(deps, command(PoolSetIn, image=image, saved=1))
    deadline = time.monotonic() + 300
    while not any(r.pool.image == image and r.saved_ready >= 1
                  for r in pools.pool_rows(deps)):
        assert time.monotonic() < deadline, "the pool did not fill"
        pool_filler.refill(deps, "bench")


def main() -> int:
    missing = real_vms_missing()
    if missing is not None:
        print(f"\n## builds: skipped, {missing}")
        return 0
    logging.getLogger("rift").setLevel(logging.WARNING)
    with work_dir("rift-bench-builds-") as tmp:
        data, context = tmp / "data", tmp / "context"
        (context / "site").mkdir(parents=True)
        (context / "site" / "index.html").write_text("<h1>built from a recipe</h1>\n")
        deps = _engine(data)
        try:
            _run(deps, context)
        finally:
            from rift.services.lifecycle import pools

            pools.clear_pool(deps, "hello")
    return 0


def _run(deps: Deps, context: Path) -> None:
    cold, warm = [], []
    for n in range(SAMPLES):
        cold.append(_build(deps, "five", FIVE.format(last=f"cold{n}"), context, True))
        warm.append(_build(deps, "five", FIVE.format(last=f"warm{n}"), context, False))
    print(f"five steps: cold {[round(x, 2) for x in cold]} s, "
          f"last changed {[round(x, 2) for x in warm]} s", flush=True)
    print("the last rebuild's phases:\n  " + "\n  ".join(PHASES), flush=True)
    _build(deps, "hello", HELLO, context, False)
    booted = [_first_answer(deps, "tiny", True) for _ in range(SAMPLES)]
    forked = [_first_answer(deps, "hello", False) for _ in range(SAMPLES)]
    pooled = []
    for _ in range(SAMPLES):
        _pool_ready(deps, "hello")
        pooled.append(_first_answer(deps, "hello", False))
    rows = [
        ("five steps, cold (no cache)", ms(p50(cold)), f"{ms(min(cold))}-{ms(max(cold))}", ""),
        ("five steps, last one changed", ms(p50(warm)), f"{ms(min(warm))}-{ms(max(warm))}",
         f"{p50(warm) / p50(cold):.2f}x cold (goal <= 0.15)"),
        ("CMD image: cold boot of tiny + start httpd, to first answer", ms(p50(booted)),
         f"{ms(min(booted))}-{ms(max(booted))}", ""),
        ("CMD image: a VM of it, no pool (fork of its state), to first answer",
         ms(p50(forked)), f"{ms(min(forked))}-{ms(max(forked))}",
         f"{p50(forked) / p50(booted):.2f}x cold"),
        ("CMD image: from a saved pool, to first answer", ms(p50(pooled)),
         f"{ms(min(pooled))}-{ms(max(pooled))}",
         f"{p50(pooled) / p50(booted):.2f}x cold (goal <= 0.3)"),
    ]
    print_table(f"builds (issue #31), {SAMPLES} samples each, load {load()}", rows,
                ("what", "p50", "range", "against"))


if __name__ == "__main__":
    raise SystemExit(main())
