"""One build's steps (SPEC §19): which layers are reused, which steps run, and in
what VM.

The layers: each step that changes the guest (RUN, COPY) leaves one, and a CMD
leaves the last (its command started and its ports answering); a layer is a
hidden image, `layer-<key>` (rift.domain.builds.layer_name), whose VMs start from
its saved memory and disk. The settings steps (ENV, ARG, WORKDIR, USER, EXPOSE,
CMD's text) change only what later steps run under, so they leave no files; their
keys still chain, so a changed ARG changes every key after it.

A rebuild reuses the leading layers that exist (none with `no_cache`); at the first
missing one a VM starts from the last reused layer (or the FROM image) and runs
the rest of the steps, each leaving its layer as it goes (the VM runs on from the
state it saved, which is that layer's). A failed step leaves no image, and the
layers before it stay for the next try. The image is a standalone copy of the
last layer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from rift.domain.builds import layer_name
from rift.domain.errors import BuildFailed, RiftError
from rift.domain.recipes import Planned, Recipe, Settings, layer_key, plan, root_key
from rift.services.builds import scripts
from rift.services.builds.context import Context
from rift.services.ports.builds import BuildGuest, LayerFiles

OUTPUT_TAIL = 2000
STEP_TIMEOUT_S = 3600
COPY_TAR = "/run/rift-copy.tar"


@dataclass(frozen=True)
class Stage:
    """A step that leaves a layer: a RUN or COPY (`planned`), or the start of the
    CMD (or, for a recipe with neither, the FROM image saved as it is)."""

    key: str
    planned: Planned | None

    @property
    def layer(self) -> str:
        return layer_name(self.key)


@dataclass(frozen=True)
class Plan:
    recipe: Recipe
    planned: list[Planned]
    stages: list[Stage]


def make_plan(recipe: Recipe, identity: str, owner: str, context: Context,
              ready: str | None = None) -> Plan:
    """The steps with their keys (`ready`, a CMD's ready command, in the last's);
    build_failed for a COPY whose source is outside the context or missing (before
    any VM starts)."""
    digests = {p.step.line: context.digest(p.step.line, p.copy)
               for p in plan(recipe, "-") if p.copy is not None}
    root = root_key(recipe.base, identity, owner)
    planned = plan(recipe, root, digests)
    stages = [Stage(p.key, p) for p in planned if p.changes_guest]
    last = planned[-1].key if planned else root
    final = recipe.settings
    if final.cmd is not None:
        started = f"START {final.cmd} PORTS {final.ports}" + (f" READY {ready}" if ready else "")
        stages.append(Stage(layer_key(last, started, {}), None))
    elif not stages:
        stages.append(Stage(layer_key(last, "SAVE", {}), None))
    return Plan(recipe, planned, stages)


def reused(the_plan: Plan, found: Mapping[str, str], no_cache: bool) -> int:
    """How many leading stages have a layer already (`found`: key -> layer name)."""
    if no_cache:
        return 0
    count = 0
    for stage in the_plan.stages:
        if stage.key not in found:
            break
        count += 1
    return count


Say = Callable[[str], None]


@dataclass(frozen=True)
class Job:
    """What a build's steps run with: its guest, its context, how long a CMD's
    ports may take to answer (RIFT_BUILD_READY_S) and where its log lines go."""

    guest: BuildGuest
    context: Context
    ready_s: float
    say: Say
    layers: LayerFiles
    build_id: str
    keep: Callable[[str, str], None] = lambda name, key: None  # records a layer made
    found: Mapping[str, str] = field(default_factory=dict)  # key -> its layer, made before
    ready: str | None = None  # a command that exits 0 once the CMD is ready (E2B's readyCmd)
    saved: list[tuple[str, str]] = field(default_factory=list)  # (layer, key) made

    def save(self, key: str, *, last: bool = False) -> str:
        """The VM as it is now becomes the layer of `key`, and its name. A layer of
        that key made before (a `no_cache` build) stays: other layers' disks may be
        overlays on it; this one is kept beside it, under the build's name."""
        name = layer_name(key)
        if self.layers.exists(name):
            name = f"{name}-{self.build_id.removeprefix('build_')}"
        self.guest.save_layer(name, last=last)
        self.keep(name, key)
        self.saved.append((name, key))
        return name


def steps_reused(the_plan: Plan, hits: int) -> int:
    """How many of the recipe's steps the first `hits` stages' layers cover (none when
    no layer is reused: every step runs, from the FROM image)."""
    if hits == 0:
        return 0
    missing = the_plan.stages[hits].planned if hits < len(the_plan.stages) else None
    return the_plan.planned.index(missing) if missing is not None else len(the_plan.planned)


def run(the_plan: Plan, hits: int, job: Job) -> str:
    """Run the stages after the first `hits` in one VM; answers the last layer's name."""
    guest, say = job.guest, job.say
    stages, planned = the_plan.stages, the_plan.planned
    total = len(planned)
    resume = steps_reused(the_plan, hits)
    for number, p in enumerate(planned[:resume], start=1):
        say(f"step {number}/{total}: {p.step.text} (cached)")
    if hits == len(stages):
        return job.found[stages[-1].key]
    start = job.found[stages[hits - 1].key] if hits else the_plan.recipe.base
    say(f"starting a VM of {start}")
    clock = time.monotonic()
    guest.start(start)
    say(f"the VM runs after {time.monotonic() - clock:.1f} s")
    last = stages[-1]
    for number, p in enumerate(planned[resume:], start=resume + 1):
        say(f"step {number}/{total}: {p.step.text}")
        if p.changes_guest:
            clock = time.monotonic()
            try:
                _change(p, guest, job.context, say)
            except BuildFailed:
                raise
            except RiftError as exc:  # the guest's or the host's: its step named too
                raise BuildFailed(f"{p.step.instruction}: {exc.message}", p.step.line) from exc
            ran = time.monotonic()
            job.save(p.key, last=p is last.planned)  # the last: its VM need not run on
            say(f"step {number}/{total}: done in {time.monotonic() - clock:.1f} s "
                f"(ran {ran - clock:.1f} s, saved {time.monotonic() - ran:.1f} s)")
    if last.planned is None:
        _start(the_plan.recipe.settings, guest, job, say)
        clock = time.monotonic()
        name = job.save(last.key, last=True)
        say(f"saved the running VM in {time.monotonic() - clock:.1f} s")
        return name
    return job.saved[-1][0]


def _change(p: Planned, guest: BuildGuest, context: Context, say: Say) -> None:
    line = p.step.line
    if p.copy is not None:
        targets = [target for _, target in context.files(line, p.copy)]
        guest.put(COPY_TAR, context.pack(line, p.copy))
        script = scripts.copy_script(p.copy, COPY_TAR, targets)
    else:
        script = scripts.run_script(p)
    code, output = guest.run(script, STEP_TIMEOUT_S)
    if output:
        say(output[-OUTPUT_TAIL:].rstrip("\n"))
    if code != 0:
        why = "was killed or timed out" if code is None else f"exited {code}"
        raise BuildFailed(f"{p.step.instruction} {why}", line, exit_code=code,
                          output=output[-OUTPUT_TAIL:])


def _start(s: Settings, guest: BuildGuest, job: Job, say: Say) -> None:
    """Start the CMD, then wait (at most RIFT_BUILD_READY_S in all) until each EXPOSEd
    port answers and the ready command, when there is one, exits 0."""
    if s.cmd is None:
        return
    say(f"starting CMD {s.cmd}")
    code, output = guest.run(scripts.start_script(s), 60)
    if code != 0:
        raise BuildFailed(f"CMD could not start (exit {code})", None, exit_code=code,
                          output=output[-OUTPUT_TAIL:])
    ready_s = job.ready_s
    deadline = time.monotonic() + ready_s

    def too_late(what: str) -> None:
        if time.monotonic() > deadline:
            _, log = guest.run(scripts.tail_script(OUTPUT_TAIL), 30)
            raise BuildFailed(f"CMD: {what} within RIFT_BUILD_READY_S ({ready_s:g} s)", None,
                              output=log)
        time.sleep(0.2)

    for port in s.ports:
        while not guest.answers(port):
            too_late(f"port {port} did not answer")
        say(f"port {port} answers")
    if job.ready is not None:
        script = scripts.ready_script(s, job.ready)
        while True:
            code, said = guest.run(script, max(1, int(deadline - time.monotonic())) + 1)
            if code == 0:
                break
            if time.monotonic() > deadline:
                raise BuildFailed(f"CMD: the ready command did not succeed within "
                                  f"RIFT_BUILD_READY_S ({ready_s:g} s); it said: "
                                  f"{said[-200:].strip() or '(nothing)'}", None, exit_code=code,
                                  output=guest.run(scripts.tail_script(OUTPUT_TAIL), 30)[1])
            time.sleep(0.2)
        say("the ready command succeeded")
