"""Images from a recipe (SPEC §19) through REST and the `rift image` command on
SQLite and libvirt's test driver: the recipe is checked before any VM starts
(`build_failed` naming the line), a context over RIFT_BUILD_CONTEXT_MIB is
refused, a build is recorded and read with its log, and streamed as Server-Sent
Events. The test driver's VMs run no guest, so a build's first RUN fails there,
saying so: what is checked is the doors and the record."""

from __future__ import annotations

import base64
import io
import json
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from hypervisor import write_test_host_xml
from rift.app import create_app
from rift.bootstrap import build_deps, close_deps
from rift.cli import main
from rift.config import Settings
from rift.services.access import accounts
from rift.services.context import Deps


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    uri = write_test_host_xml(str(tmp_path / "node.xml"), 8, 8192)
    monkeypatch.setenv("RIFT_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("RIFT_HYPERVISOR_URI", uri)
    monkeypatch.setenv("RIFT_BUILD_CONTEXT_MIB", "1")
    return Settings()


@pytest.fixture
def deps(settings: Settings) -> Iterator[Deps]:
    made = build_deps(settings)
    try:
        yield made
    finally:
        close_deps(made)


def _tar(files: dict[str, bytes]) -> str:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return base64.b64encode(buffer.getvalue()).decode()


def _ended(client: TestClient, rest: dict[str, str], build_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        build: dict[str, Any] = client.get(f"/api/v1/builds/{build_id}",
                                           headers=rest).json()["build"]
        if build["state"] != "running" or time.monotonic() > deadline:
            return build
        time.sleep(0.05)


def test_rest_checks_a_recipe_first_then_builds_in_the_background_and_streams_its_log(
        settings: Settings, deps: Deps) -> None:
    accounts.add_user(deps, "ada", "correct horse battery")
    rest = {"Authorization": f"Bearer {accounts.new_token(deps, 'ada').token.value}"}
    with TestClient(create_app(settings, deps), base_url="http://127.0.0.1") as client:
        bad = client.post("/api/v1/images", headers=rest, json={
            "name": "web", "recipe": "FROM tiny\nCOPY missing /srv/\n",
            "context": _tar({"index.html": b"hi"})})
        assert bad.status_code == 422, bad.text
        assert (bad.json()["error"]["code"], bad.json()["error"]["line"]) == ("build_failed", 2)
        big = client.post("/api/v1/images", headers=rest, json={
            "name": "web", "recipe": "FROM tiny\n",
            "context": _tar({"blob": b"x" * (1024 * 1024 + 1)})})
        assert big.status_code == 422 and big.json()["error"]["field"] == "context", big.text
        assert not list((settings.data_dir / "build-contexts").iterdir())  # none kept
        began = client.post("/api/v1/images", headers=rest, json={
            "name": "web", "recipe": "FROM tiny\nCOPY index.html /srv/\nRUN true\n",
            "context": _tar({"index.html": b"<h1>hi</h1>"})})
        assert began.status_code == 202, began.text
        build = began.json()["build"]
        assert (build["image"], build["owner"], build["steps"]) == ("web", "ada", 2)
        ended = _ended(client, rest, build["build_id"])
        # the test driver's VM has no guest: the COPY's upload fails, and says why
        assert ended["state"] == "failed" and "guest" in ended["error"], ended
        assert "step 1/2: COPY index.html /srv/" in ended["log"]
        assert not list((settings.data_dir / "build-contexts").iterdir())  # gone with it
        with client.stream("GET", f"/api/v1/builds/{build['build_id']}/log?log_from=5",
                           headers=rest) as stream:
            text = "".join(stream.iter_text())
        events = [block for block in text.split("\n\n") if block.strip()]
        assert events[0].startswith(f"id: {len(ended['log'])}\nevent: log\n")
        assert json.loads(events[0].split("data: ", 1)[1])["text"] == ended["log"][5:]
        assert events[-1].startswith("event: end\n")
        assert json.loads(events[-1].split("data: ", 1)[1])["state"] == "failed"
        accounts.add_user(deps, "bob", "correct horse battery")
        bob = {"Authorization": f"Bearer {accounts.new_token(deps, 'bob').token.value}"}
        other = client.get(f"/api/v1/builds/{build['build_id']}", headers=bob)
        assert other.status_code == 422 and other.json()["error"]["field"] == "build_id"


def test_the_command_line_refuses_a_recipe_line_and_lists_the_builds(
        settings: Settings, deps: Deps, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    recipe = tmp_path / "Recipe"
    recipe.write_text("FROM tiny\nRUN true\nHEALTHCHECK CMD true\n")
    assert main(["image", "build", "web", "--recipe", str(recipe)]) == 1
    assert "build_failed: line 3: HEALTHCHECK is not supported" in capsys.readouterr().err
    recipe.write_text("FROM tiny\nRUN true\n")
    assert main(["image", "build", "web", "--recipe", str(recipe)]) == 1
    said = capsys.readouterr()
    assert "step 1/1: RUN true" in said.out and "build_failed" in said.err
    assert main(["image", "builds", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["image"], r["state"]) for r in rows] == [("web", "failed")]
    assert main(["image", "build-log", rows[0]["build_id"]]) == 0
    assert "step 1/1: RUN true" in capsys.readouterr().out
    assert main(["image", "build", "web"]) == 2  # no recipe: only tiny and debian
