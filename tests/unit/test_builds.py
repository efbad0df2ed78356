"""Images from a recipe (SPEC §19) on a fake build guest and fake layer files: which
steps run and in what VM, which layers a rebuild reuses, a failed step, a CMD
waited for, the refusals before any VM, and whose the image is."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from rift.catalog import StaticImages
from rift.contract import tools as c
from rift.contract.base import command
from rift.contract.builds import BuildGetIn, BuildOut, ImageBuildIn, ImagePublishIn
from rift.contract.operator import PoolSetIn
from rift.domain.builds import OwnedImage
from rift.domain.clock import FakeClock
from rift.domain.errors import BuildFailed
from rift.services.builds import builder, restarts
from rift.services.builds.builder import BuildParts
from rift.services.builds.context import Context
from rift.services.context import Caller, Deps
from rift.services.lifecycle import pool_filler, pools, tasks, vms
from rift.services.operator.images import remove_image
from tests.support.engine import ALICE, BOB, event_types, refused

RECIPE = """\
FROM tiny
ARG GREETING=hello
RUN echo $GREETING > /greeting
COPY site/ /srv/www/
ENV PORT=8080
RUN echo two
"""


@dataclass
class FakeGuest:
    """A build's VM: what it was started from, the scripts it ran, the layers saved."""

    layers: FakeLayers
    fail_on: str | None = None  # a RUN whose script holds this exits 3
    answers_after: int = 0  # a port answers on this try (-1: never)
    started: list[str] = field(default_factory=list)
    scripts: list[str] = field(default_factory=list)
    files: dict[str, bytes] = field(default_factory=dict)
    tries: int = 0
    closed: bool = False
    stopped: bool = False  # its last layer was saved: the VM ran no further

    def start(self, image: str) -> None:
        self.started.append(image)

    def run(self, script: str, timeout_s: int) -> tuple[int | None, str]:
        assert not self.stopped, "a step run after the last layer"
        self.scripts.append(script)
        if self.fail_on and self.fail_on in script:
            return 3, "E: Unable to locate package nodejz\n"
        return 0, ""

    def put(self, path: str, data: bytes) -> None:
        self.files[path] = data

    def answers(self, port: int) -> bool:
        self.tries += 1
        return self.answers_after >= 0 and self.tries > self.answers_after

    def save_layer(self, name: str, *, last: bool = False) -> None:
        assert not self.stopped, "a layer saved after the last"
        self.layers.names.add(name)
        self.stopped = last

    def close(self) -> None:
        self.closed = True


@dataclass
class FakeLayers:
    names: set[str] = field(default_factory=set)
    images: dict[str, str] = field(default_factory=dict)  # image -> the layer it copies
    parents: dict[str, str] = field(default_factory=dict)  # layer -> what its disk backs on
    half: set[str] = field(default_factory=set)  # layers' work folders a cut left

    def exists(self, name: str) -> bool:
        return name in self.names or name in self.images

    def identity(self, image: str) -> str:
        return f"{image}-v1"

    def image_from(self, layer: str, name: str) -> None:
        self.images[name] = layer

    def remove(self, name: str) -> None:
        self.names.discard(name)
        self.half.discard(name)
        self.images.pop(name, None)

    def stray(self) -> list[str]:
        return sorted({n for n in self.names if n.startswith("layer-")} | self.half)

    def backing(self, name: str) -> str | None:
        return self.parents.get(name)


@pytest.fixture
def context(tmp_path: Path) -> Context:
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "index.html").write_text("<h1>hi</h1>\n")
    (tmp_path / "secret").write_text("no")
    return Context(tmp_path)


def _build(deps: Deps, recipe: str, context: Context, layers: FakeLayers,
           caller: Caller = ALICE, name: str = "site", no_cache: bool = False,
           ready: str | None = None, **guest: object) -> tuple[FakeGuest, BuildOut]:
    made = FakeGuest(layers, **guest)  # type: ignore[arg-type]
    assert isinstance(deps.clock, FakeClock)
    deps.clock.advance(1)  # builds are told apart by when they began
    parts = BuildParts(context=context, guest=lambda _c, _b: made, layers=layers,
                       ready_s=0.5, background=False, ready=ready)
    out = builder.submit(deps, caller, ImageBuildIn(name=name, recipe=recipe,
                                                    no_cache=no_cache), parts)
    return made, out


def test_a_build_runs_each_step_in_one_vm_from_its_from_image_and_leaves_a_layer_each(
        deps: Deps, context: Context) -> None:
    layers = FakeLayers()
    guest, out = _build(deps, RECIPE, context, layers)
    assert out.build.state == "succeeded", out.build.log
    assert guest.started == ["tiny"] and guest.closed and guest.stopped
    assert len(guest.scripts) == 3  # RUN, COPY's unpacking, RUN
    assert "export GREETING=hello" in guest.scripts[0]
    assert "export PORT=8080" in guest.scripts[2]
    assert next(iter(guest.files.values())).count(b"<h1>hi</h1>") == 1
    assert len(layers.names) == 3
    assert layers.images["site"] in layers.names
    assert (out.build.steps, out.build.cached) == (5, 0)
    assert "step 3/5: COPY site/ /srv/www/" in out.build.log


def test_a_rebuild_reuses_every_layer_up_to_the_first_changed_step(
        deps: Deps, context: Context) -> None:
    layers = FakeLayers()
    _first, _ = _build(deps, RECIPE, context, layers)
    again, out = _build(deps, RECIPE.replace("echo two", "echo TWO"), context, layers)
    assert out.build.state == "succeeded"
    assert len(again.scripts) == 1 and "echo TWO" in again.scripts[0]
    assert again.started[0].startswith("layer-") and again.started[0] in layers.names
    assert out.build.cached == 4
    assert "step 1/5: ARG GREETING=hello (cached)" in out.build.log
    same, out = _build(deps, RECIPE.replace("echo two", "echo TWO"), context, layers)
    assert same.started == [] and same.scripts == [] and out.build.cached == 5


def test_a_changed_copy_source_or_arg_changes_the_layers_from_its_step_on(
        deps: Deps, context: Context) -> None:
    layers = FakeLayers()
    _build(deps, RECIPE, context, layers)
    assert context.root is not None
    (context.root / "site" / "index.html").write_text("<h1>changed</h1>\n")
    guest, _ = _build(deps, RECIPE, context, layers)
    assert len(guest.scripts) == 2  # the COPY and the RUN after it
    guest, _ = _build(deps, RECIPE.replace("hello", "bye"), context, layers)
    assert len(guest.scripts) == 3 and guest.started == ["tiny"]


def test_no_cache_reuses_no_layer_and_keeps_the_ones_before_beside_its_own(
        deps: Deps, context: Context) -> None:
    layers = FakeLayers()
    _build(deps, RECIPE, context, layers)
    before = set(layers.names)
    guest, out = _build(deps, RECIPE, context, layers, no_cache=True)
    assert guest.started == ["tiny"] and len(guest.scripts) == 3 and out.build.cached == 0
    made = layers.names - before
    assert len(made) == 3 and all(name.endswith(out.build.build_id[-8:]) for name in made)
    assert layers.images["site"] in made  # the image is this run's
    assert layers.names == made  # the layers no image's latest build uses are swept
    with deps.store.read() as tx:
        rows = [r for r in tx.owned_images.all() if r.kind == "layer"]
    assert {r.name for r in rows} == layers.names
    again, out = _build(deps, RECIPE, context, layers)  # the next build reuses them
    assert again.started == [] and out.build.cached == 5


def test_the_layers_an_images_latest_build_uses_stay_with_what_they_back_onto(
        deps: Deps, context: Context) -> None:
    layers = FakeLayers()
    _build(deps, RECIPE, context, layers)
    first = set(layers.names)
    _build(deps, RECIPE.replace("echo two", "echo TWO"), context, layers)
    assert len(layers.names) == 3 and len(first & layers.names) == 2  # the old last went
    layers.parents = {name: "layer-kept-parent" for name in layers.names}
    layers.names.add("layer-kept-parent")
    with deps.store.write() as tx:
        tx.owned_images.add(OwnedImage("layer-kept-parent", "alice", "layer", False, "build_old",
                                       "0" * 64, deps.clock.now()))
    _build(deps, RECIPE.replace("echo two", "echo 2"), context, layers)
    assert "layer-kept-parent" in layers.names  # the kept layers' disks back onto it
    assert len(layers.names) == 4  # two reused, the new last, and that parent


def test_a_layer_is_no_ones_to_start_but_its_owners_builds(deps: Deps, context: Context) -> None:
    layers = FakeLayers()
    _build(deps, RECIPE, context, layers)
    layer = sorted(layers.names)[0]
    deps = replace(deps, images=StaticImages(["debian", layer, "layer-" + "0" * 24]))
    handle = str(tasks.new(deps, ALICE, command(c.TaskNewIn)).handle)
    for name in (layer, "layer-" + "0" * 24):  # the latter: files a crash left, no row
        refused("image_not_found", vms.new, deps, ALICE,
                command(c.VmNewIn, handle=handle, image=name))


def test_a_failed_run_leaves_no_image_its_exit_code_and_output_and_the_layers_before(
        deps: Deps, context: Context) -> None:
    layers = FakeLayers()
    guest, out = _build(deps, RECIPE, context, layers, fail_on="echo two")
    assert out.build.state == "failed" and guest.closed
    assert out.build.error is not None and "line 6: RUN exited 3" in out.build.error
    assert "Unable to locate package nodejz" in out.build.log
    assert layers.images == {} and len(layers.names) == 2
    with deps.store.read() as tx:
        assert tx.owned_images.get("site") is None
        assert sorted(r.kind for r in tx.owned_images.all()) == ["layer", "layer"]
    again, out = _build(deps, RECIPE, context, layers)
    assert out.build.state == "succeeded" and len(again.scripts) == 1


def test_a_cmd_is_started_and_saved_once_each_exposed_port_answers(
        deps: Deps, context: Context) -> None:
    layers = FakeLayers()
    recipe = "FROM tiny\nEXPOSE 8080\nCMD httpd -f -p 8080\n"
    guest, out = _build(deps, recipe, context, layers, answers_after=2)
    assert out.build.state == "succeeded", out.build.log
    assert "setsid /bin/sh -c 'httpd -f -p 8080'" in guest.scripts[0]
    assert guest.tries == 3 and "port 8080 answers" in out.build.log
    assert len(layers.names) == 1 and layers.images["site"] in layers.names
    _never, out = _build(deps, recipe.replace("8080\nCMD", "9090\nCMD"), context, layers,
                        answers_after=-1)
    assert out.build.state == "failed" and out.build.error is not None
    assert "port 9090 did not answer within RIFT_BUILD_READY_S" in out.build.error


def test_a_cmds_ready_command_runs_under_its_settings_until_it_succeeds_or_time_is_up(
        deps: Deps, context: Context) -> None:
    layers = FakeLayers()
    recipe = "FROM tiny\nWORKDIR /srv\nUSER web\nCMD ./serve\n"
    guest, out = _build(deps, recipe, context, layers, ready="[ -f /tmp/ready ]")
    assert out.build.state == "succeeded", out.build.log
    check = guest.scripts[-1]
    assert "cd /srv" in check and "su -s /bin/sh web" in check and "/tmp/ready" in check
    assert "the ready command succeeded" in out.build.log
    again, out = _build(deps, recipe, context, layers, ready="pgrep serve",
                        fail_on="pgrep")  # another ready command: not the layer saved before
    assert again.started == ["tiny"] and out.build.state == "failed"
    assert "the ready command did not succeed within RIFT_BUILD_READY_S (0.5 s); it said: " \
        "E: Unable" in (out.build.error or ""), out.build.error


@pytest.mark.parametrize(("recipe", "line"), [
    ("FROM tiny\nRUN true\nADD x /x\n", 3),
    ("FROM nowhere\nRUN true\n", 1),
    ("FROM tiny\nCOPY missing /x\n", 2),
    ("FROM tiny\nCOPY site/../../etc /x\n", 2),
])
def test_a_recipe_it_cannot_take_is_refused_naming_the_line_before_any_vm(
        deps: Deps, context: Context, recipe: str, line: int) -> None:
    layers = FakeLayers()
    with pytest.raises(BuildFailed) as caught:
        _build(deps, recipe, context, layers)
    assert caught.value.details["line"] == line
    with deps.store.read() as tx:
        assert tx.builds.of_owner("alice") == []


def test_a_copy_through_a_link_out_of_the_context_is_refused(
        deps: Deps, context: Context, tmp_path: Path) -> None:
    (tmp_path / "site" / "out").symlink_to("/etc")
    with pytest.raises(BuildFailed) as caught:
        _build(deps, "FROM tiny\nCOPY site /srv\n", context, FakeLayers())
    assert caught.value.details["line"] == 2


def test_a_context_over_its_limit_is_refused_by_the_builder_for_every_door_before_any_vm(
        deps: Deps, tmp_path: Path) -> None:
    root = tmp_path / "context"
    (root / "site").mkdir(parents=True)
    big = root / "big"
    big.write_bytes(b"x" * (1024 * 1024 + 1))
    (root / "site" / "link").symlink_to(big)  # a link is not counted twice
    context = Context(root)
    made = FakeGuest(FakeLayers())
    parts = BuildParts(context=context, guest=lambda _c, _b: made, layers=made.layers,
                       background=False, context_mib=1)
    err = refused("invalid_argument", builder.submit, deps, ALICE,
                  ImageBuildIn(name="site", recipe="FROM tiny\nCOPY site /srv\n"), parts)
    assert err.details["field"] == "context" and "RIFT_BUILD_CONTEXT_MIB (1 MiB)" in err.message
    assert made.started == [] and made.scripts == []
    with deps.store.read() as tx:
        assert tx.builds.of_owner("alice") == []
    big.write_bytes(b"x" * (1024 * 1024 - 1))  # under the limit (the link's not counted)
    assert builder.submit(deps, ALICE, ImageBuildIn(name="site", recipe="FROM tiny\nCOPY "
                          "site /srv\n"), parts).build.state == "succeeded"


def test_a_built_image_is_its_builders_until_published(deps: Deps, context: Context) -> None:
    _build(deps, RECIPE, context, FakeLayers())
    deps = replace(deps, images=StaticImages(["debian", "site"]))  # its files are there
    refused("invalid_argument", _build, deps, RECIPE, context, FakeLayers(), caller=BOB)
    opened = tasks.new(deps, BOB, command(c.TaskNewIn))
    new_vm = command(c.VmNewIn, handle=str(opened.handle), image="site")
    refused("image_not_found", vms.new, deps, BOB, new_vm)
    refused("image_not_found", builder.publish, deps, BOB, ImagePublishIn(name="site"))
    assert builder.publish(deps, ALICE, ImagePublishIn(name="site")).image.published
    assert vms.new(deps, BOB, new_vm).vm.image == "site"
    # its files are read by a live VM: a rebuild would pull them from under it
    refused("invalid_argument", _build, deps, RECIPE, context, FakeLayers())


def test_a_rebuild_or_removal_of_an_image_a_pool_holds_names_rift_pool_clear(
        deps: Deps, context: Context) -> None:
    """A pooled VM's overlay reads the image too, running or saved: a rebuild, which
    replaces the image's files, waits for `rift pool clear`, as removing it does."""
    _build(deps, RECIPE, context, FakeLayers())
    deps = replace(deps, images=StaticImages(["debian", "site"]))  # its files are there
    pools.set_pool(deps, command(PoolSetIn, image="site", saved=1))
    while pool_filler.refill(deps, "test-filler"):
        pass
    with deps.store.read() as tx:
        assert [pvm.image for pvm in tx.pool_vms.all()] == ["site"]
    for attempt in (lambda: _build(deps, RECIPE, context, FakeLayers()),
                    lambda: remove_image(deps, "site")):
        err = refused("invalid_argument", attempt)
        assert "pooled VMs" in err.message and "rift pool clear site" in err.message, err
    pools.clear_pool(deps, "site")
    _build(deps, RECIPE, context, FakeLayers())  # nothing reads it now


def test_a_build_is_read_by_its_owner_alone_with_its_log_from_an_offset(
        deps: Deps, context: Context) -> None:
    _, out = _build(deps, RECIPE, context, FakeLayers())
    got = builder.get(deps, ALICE, BuildGetIn(build_id=out.build.build_id, log_from=10))
    assert got.build.log == out.build.log[10:]
    refused("invalid_argument", builder.get, deps, BOB, BuildGetIn(build_id=out.build.build_id))


def test_a_build_a_restart_cut_fails_records_it_closes_its_task_and_drops_half_layers(
        deps: Deps, context: Context, tmp_path: Path) -> None:
    layers = FakeLayers()
    _, out = _build(deps, RECIPE, context, layers)
    kept = set(layers.names)
    with deps.store.write() as tx:
        row = tx.builds.get(out.build.build_id)
        assert row is not None
        gone = f"{socket.gethostname()}/999999999"  # a process of this machine that ended
        for build_id, host in [("build_cccccccc", gone),
                               ("build_dddddddd", f"{socket.gethostname()}/{os.getpid()}"),
                               ("build_eeeeeeee", "another-machine/1")]:  # runs; not ours
            tx.builds.add(replace(row, id=build_id, image="other", state="running",
                                  ended_at=None, host=host))
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn, name="build_cccccccc"))
    layers.names.add("layer-" + "f" * 64)  # saved whole when the restart came: no row yet
    layers.half.add(".add-layer-" + "0" * 64 + "-x1y2")  # being written when it came
    contexts = tmp_path / "build-contexts"  # what REST and the E2B door unpack, per build
    for build_id in ("build_cccccccc", "build_dddddddd"):
        (contexts / build_id).mkdir(parents=True)
        (contexts / build_id / "index.html").write_text("hi")
    assert restarts.fail_cut(deps, layers, contexts=contexts) == ["build_cccccccc"]
    assert [p.name for p in contexts.iterdir()] == ["build_dddddddd"]  # its build runs
    got = builder.get(deps, ALICE, BuildGetIn(build_id="build_cccccccc")).build
    assert got.state == "failed" and "cut by a restart" in (got.error or "")
    assert [builder.get(deps, ALICE, BuildGetIn(build_id=b)).build.state
            for b in ("build_dddddddd", "build_eeeeeeee")] == ["running", "running"]
    assert tasks.get(deps, ALICE, command(c.TaskGetIn, task_id=opened.task.id)).task.status \
        == "closed"
    assert event_types(deps, opened.task.id)[-2:] == ["build_cut", "closed"]
    assert (layers.names, layers.half) == (kept, set())  # the whole ones with rows stay
    assert restarts.fail_cut(deps, layers) == []  # settled once
