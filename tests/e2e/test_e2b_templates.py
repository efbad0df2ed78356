"""The E2B door's template builds through Rift's builder (SPEC §16, §19), driven by
E2B's own SDK (`Template.build`) on a real `rift serve` over libvirt's test driver:
the build is requested, a copied file uploaded by its hash, the steps started as a
recipe and the build polled with its log; the test driver's VMs run no guest, so
the first step that needs one fails, and the SDK's BuildException carries Rift's
code and the recipe's line, its status E2B's step. A FROM that names no Rift
image, a name that is no image name and a registry are refused before any VM
starts, in the SDK's shapes. (A build on a real guest, and a sandbox of it:
tests/e2e/test_real_e2b.py.)"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2b import BuildException, Template, wait_for_port
from e2b.template.logger import LogEntry

from tests.support.e2b import Door
from tests.support.e2b import door as served


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Door]:
    with served(tmp_path_factory.mktemp("e2b-templates")) as made:
        yield made


def test_a_template_is_uploaded_started_as_a_recipe_and_polled_to_its_failed_step(
        door: Door, tmp_path: Path) -> None:
    (tmp_path / "index.html").write_text("<h1>from a template</h1>\n")
    template = (Template(file_context_path=tmp_path).from_template("tiny")
                .set_user("root")  # E2B's default is `user`: nothing here runs as it
                .set_envs({"GREETING": "hello world"})
                .copy("index.html", "/srv/www/")
                .run_cmd("echo $GREETING > /srv/www/greeting")
                .set_start_cmd("httpd -f -p 8080 -h /srv/www", wait_for_port(8080)))
    logs: list[str] = []

    def heard(entry: LogEntry) -> None:
        logs.append(entry.message)

    with pytest.raises(BuildException) as caught:
        Template.build(template, "site", on_build_logs=heard, **door.opts)
    message = str(caught.value)
    # the test driver's VM runs no guest: the COPY (E2B's step 3) cannot put its files
    assert message.startswith("line 11: COPY: ") and "(build_failed: " in message, message
    assert "Uploaded 'index.html'" in logs, logs
    assert "step 1/9: USER user" in logs, logs  # E2B's default user and home
    assert "step 3/9: USER root" in logs, logs
    assert "step 5/9: ENV GREETING='hello world'" in logs, logs
    assert "step 6/9: COPY index.html /srv/www/" in logs, logs
    assert not any(line.startswith("step 1/9: RUN") for line in logs)  # no account made
    build_id = next(m.group(1) for line in logs
                    if (m := re.search(r"Build ID: (build_\w+)", line)))
    status = httpx.get(f"{door.opts['api_url']}/templates/site/builds/{build_id}/status",
                       headers={"X-API-Key": door.opts["api_key"]}, timeout=30).json()
    assert (status["status"], status["reason"]["step"]) == ("error", "3"), status
    built = door.rest(f"builds/{build_id}")["build"]
    assert (built["image"], built["state"], built["steps"]) == ("site", "failed", 9), built


@pytest.mark.parametrize(("template", "name", "said"), [
    (lambda: Template().from_image("ubuntu:24.04").run_cmd("true"), "site",
     "step base: line 2: FROM 'ubuntu:24.04': an image name is"),
    (lambda: Template().from_template("nope").run_cmd("true"), "site",
     "step base: line 2: FROM nope names no image of yours"),
    (lambda: Template().from_template("tiny").run_cmd("true"), "Site", "no ':tag'"),
    (lambda: Template().from_template("tiny").run_cmd("true"), "site:v2",
     "name: 'site:v2': a Rift template is one image, its latest build, with no tag but "
     "'default': build it under a name of its own (Template.build(template, 'site-v2'))"),
    (lambda: Template().from_template("tiny:v1").run_cmd("true"), "site",
     "fromTemplate: 'tiny:v1': a Rift template is one image"),
    (lambda: Template().from_image("registry.example/x:1", username="u", password="p")
     .run_cmd("true"), "site", "not from a registry"),
])
def test_what_the_builder_cannot_take_is_refused_before_any_vm_in_the_sdks_shape(
        door: Door, template: object, name: str, said: str) -> None:
    with pytest.raises(BuildException) as caught:
        Template.build(template(), name, **door.opts)  # type: ignore[operator]
    assert said in str(caught.value), caught.value
    assert ("build_failed" if "step base" in said else "invalid_argument") in str(caught.value)


def test_a_template_name_is_known_when_it_names_an_image_the_caller_may_start(
        door: Door) -> None:
    assert Template.alias_exists("tiny", **door.opts)
    assert Template.alias_exists("tiny:default", **door.opts)  # E2B's default tag: the image
    assert not Template.alias_exists("nothing-here", **door.opts)


def test_tags_other_than_the_default_are_refused_naming_the_name_to_build_instead(
        door: Door) -> None:
    with pytest.raises(BuildException) as caught:
        Template.build(Template().from_template("tiny").run_cmd("true"), "site",
                       tags=["default", "v2"], **door.opts)
    assert "tags: 'site:v2': a Rift template is one image" in str(caught.value), caught.value
    assert "invalid_argument" in str(caught.value)
    refused = httpx.post(f"{door.opts['api_url']}/sandboxes", timeout=30,
                         headers={"X-API-Key": door.opts["api_key"]},
                         json={"templateID": "tiny:v2"})
    assert refused.status_code == 400, refused.text
    assert "templateID: 'tiny:v2'" in refused.json()["message"], refused.text
    tags = httpx.get(f"{door.opts['api_url']}/templates/tiny/tags", timeout=30,
                     headers={"X-API-Key": door.opts["api_key"]})
    assert tags.status_code == 501, tags.text  # the tag routes: not served


def test_the_template_routes_refuse_bad_input_in_e2bs_shape(door: Door) -> None:
    api, key = door.opts["api_url"], {"X-API-Key": door.opts["api_key"]}
    bad_hash = httpx.get(f"{api}/templates/site/files/not-a-hash", headers=key, timeout=30)
    assert bad_hash.status_code == 400 and bad_hash.json()["code"] == 400, bad_hash.text
    link = httpx.get(f"{api}/templates/site/files/{'0' * 64}", headers=key, timeout=30)
    assert link.status_code == 201 and link.json()["present"] is False, link.text
    url = link.json()["url"]
    assert url.startswith(f"{api}/template-uploads/")
    forged = httpx.put(url + "x", content=b"data", timeout=30)
    assert forged.status_code == 403 and "build the template again" in forged.json()["message"]
    big = httpx.put(url, content=b"x" * (10 * 1024 * 1024 + 1), timeout=60)
    assert big.status_code == 400 and "RIFT_BUILD_CONTEXT_MIB" in big.json()["message"]
    assert httpx.put(url, content=b"again", timeout=30).status_code == 403  # used once
    for path, status in [("/templates/site/builds/build_aaaaaaaa/status", 400),
                         ("/templates/site/builds/nope/status?logsOffset=x", 400),
                         ("/templates/aliases/nothing", 404)]:
        answer = httpx.get(api + path, headers=key, timeout=30)
        assert answer.status_code == status and answer.json()["code"] == status, answer.text
    assert httpx.get(f"{api}/templates/site/files/{'0' * 64}", timeout=30).status_code == 401
    unknown_hash = httpx.post(f"{api}/v2/templates/site/builds/build_aaaaaaaa", headers=key,
                              timeout=30, json={"fromTemplate": "tiny", "steps": [{
                                  "type": "COPY", "args": ["a", "/a", "", ""],
                                  "filesHash": "1" * 64}]})
    assert unknown_hash.status_code == 400 and "not uploaded" in unknown_hash.json()["message"]
