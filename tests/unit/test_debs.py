"""Debian packages a recipe installs from local files (hypervisor/debs.py,
rift/services/builds/offline.py): the set's key, apt's command against the
base's status, the machine-wide cache, the context with `debs/`, its limit, the
`python` image's built-in build, and the recipe examples read with their
contexts. apt itself is a fake here (tests/e2e/test_real_recipes.py and
test_real_python.py run the real one, in make soak)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

import pytest

from hypervisor.base import ImageError
from hypervisor.debs import (
    SETS,
    apt_argv,
    base_status,
    cache_of,
    context_with,
    fetch,
    set_key,
)
from hypervisor.python_image import PACKAGES, RECIPE
from rift.contract.builds import ImageBuildIn
from rift.domain.errors import BuildFailed
from rift.domain.recipes import parse
from rift.services.builds import builder, engine, offline
from rift.services.builds.builder import BuildParts
from rift.services.builds.context import MIB, Context
from rift.services.context import Deps
from rift.services.ports.builds import LayerFiles
from tests.support.engine import ALICE, refused

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def lists(tmp_path: Path) -> Path:
    folder = tmp_path / "lists"
    folder.mkdir()
    (folder / "deb.debian.org_debian_dists_bookworm_InRelease").write_text("Date: one\n")
    (folder / "deb.debian.org_debian_dists_bookworm_main_binary-amd64_Packages").write_text("x")
    return folder


@pytest.fixture
def images(tmp_path: Path) -> Path:
    """An images folder whose `debian` names its root, the root's dpkg status there."""
    folder = tmp_path / "images"
    (folder / "debian").mkdir(parents=True)
    (folder / "debian" / "manifest.json").write_text(json.dumps({"disk": {"root": "abc"}}))
    status = folder / ".cache" / "roots" / "abc" / "var" / "lib" / "dpkg" / "status"
    status.parent.mkdir(parents=True)
    status.write_text("Package: libc6\nStatus: install ok installed\n")
    return folder


class FakeApt:
    """apt-get: `install --download-only` leaves a .deb a package in its archives
    folder; the first `fails` calls fail as a stale list does."""

    def __init__(self, fails: int = 0, leaves: bool = True) -> None:
        self.calls: list[list[str]] = []
        self.fails, self.leaves = fails, leaves

    def __call__(self, argv: list[str], *, timeout_s: float) -> str:
        self.calls.append(argv)
        if "update" in argv:
            return ""
        if self.fails:
            self.fails -= 1
            raise ImageError("apt-get failed (100): E: Failed to fetch … 404 Not Found")
        archives = Path(next(a for a in argv if a.startswith("Dir::Cache::archives="))
                        .split("=", 1)[1])
        assert (archives / "partial").is_dir()
        for name in argv[argv.index("install") + 1:] if self.leaves else []:
            (archives / f"{name}_1.0_all.deb").write_bytes(b"!<arch>\n" + name.encode())
        return ""


def test_a_sets_key_is_its_packages_in_any_order_the_bases_status_and_the_mirrors_release(
        images: Path, lists: Path) -> None:
    status = base_status(images)
    key = set_key(["npm", "nodejs"], status, lists)
    assert key == set_key(["nodejs", "npm", "npm"], status, lists)
    assert key != set_key(["nodejs"], status, lists)
    (lists / "deb.debian.org_debian_dists_bookworm_InRelease").write_text("Date: two\n")
    moved = set_key(["npm", "nodejs"], status, lists)
    assert moved != key
    status.write_text(status.read_text() + "\nPackage: zlib1g\n")
    assert set_key(["npm", "nodejs"], status, lists) not in (key, moved)


def test_apt_resolves_against_the_bases_status_into_a_folder_of_its_own(tmp_path: Path) -> None:
    argv = apt_argv(["npm", "nodejs"], Path("/s/status"), tmp_path)
    assert argv[:4] == ["apt-get", "-q", "-y", "--download-only"]
    assert "--no-install-recommends" in argv
    assert argv[-3:] == ["install", "nodejs", "npm"]
    assert {"Dir::State::status=/s/status", f"Dir::Cache::archives={tmp_path / 'debs'}",
            f"Dir::State::extended_states={tmp_path / 'extended_states'}",
            "Debug::NoLocking=1"} <= set(argv)


def test_a_set_is_fetched_once_machine_wide_and_after_a_stale_list_updated_once(
        images: Path, lists: Path) -> None:
    status, cache = base_status(images), cache_of(images)
    apt = FakeApt(fails=1)
    debs = fetch(["npm", "nodejs"], status, cache, lists=lists, run=apt)
    assert sorted(p.name for p in debs.iterdir()) == ["nodejs_1.0_all.deb", "npm_1.0_all.deb"]
    assert debs == cache / SETS / set_key(["nodejs", "npm"], status, lists) / "debs"
    assert [a[1] if a[1] == "update" else "install" for a in apt.calls] == [
        "install", "update", "install"]
    assert (debs.parent / "packages").read_text() == "nodejs\nnpm\n"
    again = FakeApt()
    assert fetch(["nodejs", "npm"], status, cache, lists=lists, run=again) == debs
    assert again.calls == []
    assert [p.name for p in (cache / SETS).iterdir()] == [debs.parent.name]  # no work left


def test_a_set_the_base_has_whole_or_apt_cannot_fetch_leaves_nothing(
        images: Path, lists: Path) -> None:
    status, cache = base_status(images), cache_of(images)
    with pytest.raises(ImageError, match="the base has them all"):
        fetch(["libc6"], status, cache, lists=lists, run=FakeApt(leaves=False))
    with pytest.raises(ImageError, match="404"):
        fetch(["nodejz"], status, cache, lists=lists, run=FakeApt(fails=2))
    assert list((cache / SETS).iterdir()) == []


def test_the_bases_status_is_read_beside_its_real_folder_and_named_when_missing(
        images: Path, tmp_path: Path) -> None:
    seeded = tmp_path / "server" / "images"  # a server's images: debian a link
    seeded.mkdir(parents=True)
    (seeded / "debian").symlink_to(images / "debian", target_is_directory=True)
    assert base_status(seeded) == base_status(images)
    assert cache_of(seeded) == images / ".cache"
    (images / "debian" / "manifest.json").write_text(json.dumps({"disk": {"root": "gone"}}))
    with pytest.raises(ImageError, match="rift image build debian"):
        base_status(images)
    with pytest.raises(ImageError, match="names no Debian root"):
        base_status(tmp_path / "nowhere")


def test_a_context_with_debs_holds_the_operators_files_and_the_set(tmp_path: Path) -> None:
    folder, debs = tmp_path / "app", tmp_path / "set" / "debs"
    (folder / "lib").mkdir(parents=True)
    (folder / "lib" / "server.js").write_text("//\n")
    debs.mkdir(parents=True)
    (debs / "npm_1.0_all.deb").write_bytes(b"deb")
    made = context_with(folder, debs, tmp_path / "ctx")
    assert sorted(p.relative_to(made).as_posix() for p in made.rglob("*")) == [
        "debs", "debs/npm_1.0_all.deb", "lib", "lib/server.js"]
    assert (made / "debs" / "npm_1.0_all.deb").stat().st_ino == \
        (debs / "npm_1.0_all.deb").stat().st_ino  # a hard link: nothing copied
    (folder / "debs").mkdir()
    with pytest.raises(ImageError, match="debs/ of its own"):
        context_with(folder, debs, tmp_path / "ctx2")
    assert sorted(p.name for p in context_with(None, debs, tmp_path / "ctx3").iterdir()) == [
        "debs"]


def test_the_operators_folder_is_held_to_the_limit_and_the_fetched_debs_are_not(
        images: Path, tmp_path: Path) -> None:
    status = base_status(images)
    debs = cache_of(images) / SETS / set_key(["nodejs"], status) / "debs"
    debs.mkdir(parents=True)  # fetched before (the host's real lists make the key)
    (debs / "nodejs_1.0_all.deb").write_bytes(b"x" * (3 * MIB + 1))
    folder = tmp_path / "app"
    folder.mkdir()
    (folder / "server.js").write_bytes(b"x" * (MIB - 10))
    context, limit = offline.with_debs(images, ["nodejs"], folder, tmp_path / "c", 1)
    assert limit == 1 + 4 and context.root == (tmp_path / "c").resolve()
    context.check_size(limit)
    (folder / "server.js").write_bytes(b"x" * (MIB + 1))
    err = refused("invalid_argument", offline.with_debs, images, ["nodejs"], folder,
                  tmp_path / "d", 1)
    assert err.details["field"] == "context"
    err = refused("invalid_argument", offline.with_debs, tmp_path / "none", ["nodejs"],
                  None, tmp_path / "e", 1)
    assert err.details["field"] == "debs" and "rift image build debian" in err.message


def test_a_built_in_name_is_built_by_rift_alone(deps: Deps) -> None:
    layers = cast(LayerFiles, object())  # each refusal comes before any layer is read
    cmd = ImageBuildIn(name="python", recipe="FROM nothing\nRUN true\n")
    err = refused("invalid_argument", builder.submit, deps, ALICE, cmd,
                  BuildParts(layers=layers, background=False))
    assert "Rift's own" in err.message
    other = ImageBuildIn(name="site", recipe="FROM nothing\nRUN true\n")
    err = refused("invalid_argument", builder.submit, deps, ALICE, other,
                  BuildParts(layers=layers, background=False, builtin=True))
    assert "Rift's own" in err.message
    # Rift's own build of `python` passes the name's check, to the recipe's
    with pytest.raises(BuildFailed, match="FROM nothing names no image"):
        builder.submit(deps, ALICE, cmd, BuildParts(layers=layers, background=False,
                                                    builtin=True))


def _debs_context(tmp_path: Path, example: Path | None) -> Context:
    debs = tmp_path / "set"
    debs.mkdir()
    (debs / "a_1_all.deb").write_bytes(b"deb")
    return Context(context_with(example, debs, tmp_path / "context"))


def test_the_node_example_reads_and_its_context_with_debs_has_what_it_copies(
        tmp_path: Path) -> None:
    example = ROOT / "docs" / "examples" / "node"
    recipe = parse((example / "Recipe").read_text())
    made = engine.make_plan(recipe, "debian-v1", "alice", _debs_context(tmp_path, example))
    assert (recipe.base, recipe.settings.cmd, recipe.settings.ports) == (
        "debian", "node server.js", (8080,))
    assert [s.planned.step.text if s.planned else "START" for s in made.stages] == [
        "COPY debs/ /tmp/debs/",
        "RUN apt-get install -y --no-install-recommends -o Dpkg::Options::=--force-unsafe-io "
        "/tmp/debs/*.deb && rm -rf /tmp/debs /var/cache/apt/*.bin",
        "COPY package.json server.js ./",
        "RUN npm install --omit=dev --no-audit --no-fund --offline", "START"]


def test_the_python_recipe_installs_its_debs_and_keeps_the_reference_blas(
        tmp_path: Path) -> None:
    recipe = parse(RECIPE.read_text())
    assert (ROOT / "docs" / "examples" / "python" / "Recipe").read_text() == RECIPE.read_text()
    made = engine.make_plan(recipe, "debian-v1", "alice", _debs_context(tmp_path, None))
    steps = [s.planned.step.text for s in made.stages if s.planned]
    assert recipe.base == "debian" and recipe.settings.cmd is None
    assert steps[0] == "COPY debs/ /tmp/debs/" and "/tmp/debs/*.deb" in steps[1]
    assert "blas/libblas.so.3" in steps[1] and "lapack/liblapack.so.3" in steps[1]
    assert "python3-pandas" in PACKAGES and "python3-ipykernel" in PACKAGES
    assert {"libblas3", "liblapack3"} <= set(PACKAGES)  # what the alternatives are set to
