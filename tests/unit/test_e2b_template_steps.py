"""E2B's template steps as a Rift recipe (rift.e2b.template_steps): each step's
lines, read back by the builder's own parser; a step's own user only for it; a
mode as a chmod; a command of several lines in the JSON form; a ready command
that waits for a port as EXPOSE, any other the build's ready command; `force` as
no_cache; a recipe line named back as E2B's step; and the door's upload store
(a URL claimed once, held to the limit, an upload no build took pruned)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from e2b import wait_for_file, wait_for_port, wait_for_timeout, wait_for_url

from rift.domain.errors import InvalidArgument
from rift.domain.recipes import parse, plan
from rift.e2b.template_steps import MAKE_USER, step_of, translate, untagged
from rift.e2b.templates import Setup, Templates
from rift.services.context import Caller, Deps

H = "ab" * 32


def _copy(src: str, dest: str, user: str = "", mode: str = "") -> dict[str, object]:
    return {"type": "COPY", "args": [src, dest, user, mode], "force": False, "filesHash": H}


def test_each_step_becomes_its_recipe_lines_which_the_builder_reads() -> None:
    made = translate({"fromTemplate": "tiny", "force": False, "steps": [
        {"type": "ENV", "args": ["GREETING", "hello world", "N", "1"], "force": False},
        _copy("site", "/srv/www/", "user", "0755"),
        {"type": "RUN", "args": ["apt-get update && apt-get install -y vim", "root"]},
        {"type": "USER", "args": ["user"]},
        {"type": "WORKDIR", "args": ["/home/user"]},
        {"type": "RUN", "args": ["pip install --user numpy"]},
        {"type": "RUN", "args": ["echo one\necho two", "root"]},
    ], "startCmd": "python -m http.server 8000",
        "readyCmd": '[ -n "$(ss -Htuln sport = :8000)" ]'}, "debian")
    assert made.recipe.splitlines() == [
        "# e2b step base", "FROM tiny", MAKE_USER, "USER user", "WORKDIR /home/user",
        "# e2b step 1", "ENV GREETING='hello world' N=1",
        "# e2b step 2", "COPY --chown=user site /srv/www/", "USER root",
        "RUN chmod 0755 /srv/www/site", "USER user",
        "# e2b step 3", "USER root", "RUN apt-get update && apt-get install -y vim",
        "USER user",
        "# e2b step 4", "USER user", "WORKDIR /home/user",
        "# e2b step 5", "WORKDIR /home/user",
        "# e2b step 6", "RUN pip install --user numpy",
        "# e2b step 7", "USER root", 'RUN ["/bin/sh", "-c", "echo one\\necho two"]',
        "USER user",
        "# e2b step finalize", "EXPOSE 8000", "CMD python -m http.server 8000"]
    recipe = parse(made.recipe)
    assert (recipe.base, recipe.settings.cmd, recipe.settings.ports, recipe.settings.user) == (
        "tiny", "python -m http.server 8000", (8000,), "user")
    assert dict(recipe.settings.env) == {"GREETING": "hello world", "N": "1"}
    planned = plan(recipe, "root", {9: "digest"})
    assert [p.step.instruction for p in planned if p.changes_guest] == [
        "RUN", "COPY", "RUN", "RUN", "RUN", "RUN"]
    assert [(p.before.user, p.before.workdir) for p in planned if p.changes_guest] == [
        ("root", "/"), ("user", "/home/user"), ("root", "/home/user"),
        ("root", "/home/user"), ("user", "/home/user"), ("root", "/home/user")]
    assert (made.hashes, made.no_cache) == ((H,), False)


@pytest.mark.parametrize(("ready", "line", "runs"), [
    (wait_for_port(3000).get_cmd(), "EXPOSE 3000", None),  # the builder's own port wait
    (wait_for_url("http://localhost:3000/health").get_cmd(),
     "# readyCmd, run after the start until it exits 0: curl -s -o /dev/null", "curl"),
    (wait_for_timeout(20_000).get_cmd(), "# readyCmd, run after the start until it exits 0: "
     "sleep 20", "sleep 20"),
    (wait_for_file("/tmp/ready").get_cmd(), "# readyCmd, run after the start until it exits "
     "0: [ -f /tmp/ready ]", "[ -f /tmp/ready ]"),
])
def test_a_ready_command_is_a_port_wait_or_the_builds_ready_command(
        ready: str, line: str, runs: str | None) -> None:
    made = translate({"steps": [], "startCmd": "[ -x app ] && ./app", "readyCmd": ready},
                     "debian")
    lines = made.recipe.splitlines()
    assert lines[1] == "FROM debian"  # E2B's default base: RIFT_DEFAULT_IMAGE
    assert lines[-2].startswith(line), lines
    assert lines[-1] == 'CMD ["/bin/sh", "-c", "[ -x app ] && ./app"]'
    assert (made.ready == ready) if runs else made.ready is None
    assert runs is None or runs in (made.ready or "")
    parse(made.recipe)


def test_force_anywhere_means_no_cache_and_bad_steps_are_refused_naming_them() -> None:
    assert translate({"steps": [{"type": "RUN", "args": ["true"], "force": True}]},
                     "debian").no_cache
    assert translate({"force": True, "fromImage": "e2bdev/base:latest"}, "tiny").recipe \
        == "# e2b step base\nFROM tiny\nUSER user\nWORKDIR /home/user\n"
    cases: list[tuple[dict[str, Any], str]] = [
        ({"steps": [{"type": "ADD", "args": ["x"]}]}, "steps[0].type"),
        ({"steps": [{"type": "RUN", "args": []}]}, "steps[0].args"),
        ({"steps": [{"type": "ENV", "args": ["A"]}]}, "steps[0].args"),
        ({"steps": [{"type": "COPY", "args": ["a", "/b", "", ""]}]}, "steps[0].filesHash"),
        ({"steps": [_copy("a", "/b", "", "rwx")]}, "steps[0].args"),
        ({"fromImageRegistry": {"type": "registry"}}, "fromImageRegistry"),
        ({"startCmd": "  "}, "startCmd"),
    ]
    for body, field in cases:
        with pytest.raises(InvalidArgument) as caught:
            translate(body, "debian")
        assert caught.value.details["field"] == field, (body, caught.value)


def test_a_recipe_line_names_e2bs_step() -> None:
    recipe = translate({"steps": [{"type": "RUN", "args": ["true"]}, _copy("a", "/b")],
                        "startCmd": "./serve"}, "debian").recipe
    assert step_of(recipe, "line 2: FROM x names no image of yours") == "base"
    assert step_of(recipe, "line 3: RUN exited 1") == "base"  # making E2B's `user`
    assert step_of(recipe, "line 7: RUN exited 3") == "1"
    assert step_of(recipe, "line 9: COPY a is outside the build context") == "2"
    assert step_of(recipe, "CMD: port 80 did not answer") == "finalize"
    assert step_of(recipe, None) == "finalize"


def test_the_sdks_from_dockerfile_steps_read_as_the_same_recipe(tmp_path: Path) -> None:
    from e2b import Template

    dockerfile = ('FROM tiny\nARG NAME=web\nENV GREETING="hello $NAME"\nWORKDIR /srv\n'
                  'COPY index.html www/\nRUN echo "$GREETING" > www/greeting\nUSER root\n'
                  'EXPOSE 8080\nCMD ["httpd", "-f", "-p", "8080", "-h", "/srv/www"]\n')
    (tmp_path / "index.html").write_text("hi\n")
    sent = json.loads(Template.to_json(Template(file_context_path=str(tmp_path))
                                       .from_dockerfile(dockerfile)))
    made = translate(sent, "debian")
    recipe = parse(made.recipe)
    assert recipe.base == "tiny" and len(made.hashes) == 1
    assert dict(recipe.settings.env)["GREETING"] == "hello web"
    assert (recipe.settings.user, recipe.settings.workdir) == ("root", "/srv")
    assert MAKE_USER not in made.recipe  # nothing runs as E2B's `user`: no account made
    assert recipe.settings.cmd == "httpd -f -p 8080 -h /srv/www"
    assert made.ready == "sleep 20"  # the SDK's wait_for_timeout(20 s) for a CMD
    assert any(line.startswith("COPY index.html") for line in made.recipe.splitlines())


def test_an_upload_url_is_claimed_once_held_to_the_limit_and_an_untaken_upload_pruned(
        tmp_path: Path, deps: Deps) -> None:
    """The URL's token is signed with a key in the store: a restarted door (another
    Templates on the same store and folder) takes it, once; a forged or expired
    token is refused before any body byte."""
    setup = Setup(tmp_path, 1, 60.0, "https://rift.example")
    templates = Templates(setup, lambda: deps)
    caller = Caller("alice", "e2b:sdk")
    link = templates.upload_link(deps, None, caller, "site", H, "http://ignored")
    assert link["url"].startswith("https://rift.example/e2b/template-uploads/")
    token = link["url"].rsplit("/", 1)[1]
    restarted = Templates(setup, lambda: deps)
    user, files_hash = restarted.claim(token)
    assert (user, files_hash) == ("alice", H)
    for used in (templates, restarted):
        with pytest.raises(PermissionError):
            used.claim(token)  # once
    payload, _, signature = token.rpartition(".")
    user_hex, _, until, nonce = payload.split(".")
    for forged in (f"{b'bob'.hex()}.{H}.{until}.{nonce}.{signature}",
                   f"{payload}.{'0' * len(signature)}", "x", ""):
        with pytest.raises(PermissionError):
            templates.claim(forged)
    expired = f"{user_hex}.{H}.{int(time.time()) - 1}.{nonce}1"
    with pytest.raises(PermissionError):
        templates.claim(f"{expired}.{templates._signed(deps, expired)}")
    with pytest.raises(InvalidArgument):
        templates.upload(user, files_hash, b"x" * (1024 * 1024 + 1))
    templates.upload(user, files_hash, b"tar")
    assert templates.upload_link(deps, None, caller, "site", H, "") == {"present": True}
    kept = tmp_path / "e2b-uploads" / b"alice".hex() / H
    assert kept.read_bytes() == b"tar"
    assert templates.prune("alice", time.time() - 60) == []  # written just now: kept
    old = time.time() - 2 * 86400
    os.utime(kept, (old, old))
    assert templates.prune("alice", time.time() - 86400) == [H] and not kept.exists()


def test_steps_run_as_e2bs_user_in_its_home_made_where_the_image_lacks_it() -> None:
    """E2B's default: `user` in /home/user (made first, as root, when a step, the start
    or a COPY's owner needs it); a USER step's folder is its home until a WORKDIR;
    a template that runs nothing as `user` makes no account (no layer)."""
    made = translate({"fromTemplate": "tiny", "steps": [
        {"type": "RUN", "args": ["id -un > who && pwd >> who"]},
        {"type": "USER", "args": ["guest"]},
        {"type": "RUN", "args": ["pwd"]},
        {"type": "WORKDIR", "args": ["/srv"]},
        {"type": "USER", "args": ["root"]},
    ], "startCmd": "./serve"}, "debian")
    recipe = parse(made.recipe)
    runs = [p.before for p in plan(recipe, "root") if p.changes_guest]
    assert [(s.user, s.workdir) for s in runs] == [
        ("root", "/"), ("user", "/home/user"), ("guest", "/home/guest")]
    assert made.recipe.splitlines()[2] == MAKE_USER
    assert (recipe.settings.user, recipe.settings.workdir) == ("root", "/srv")
    as_root = translate({"steps": [{"type": "USER", "args": ["root"]},
                                   {"type": "RUN", "args": ["true"]}],
                         "startCmd": "./serve"}, "debian")
    assert MAKE_USER not in as_root.recipe
    assert [(p.before.user, p.before.workdir) for p in plan(parse(as_root.recipe), "root")
            if p.changes_guest] == [("root", "/root")]
    owned = translate({"steps": [{"type": "USER", "args": ["root"]},
                                 _copy("a", "/b", "user:user")]}, "debian")
    assert MAKE_USER in owned.recipe  # a COPY gives `user` its files


def test_e2bs_default_tag_is_the_template_and_another_tag_is_refused() -> None:
    assert [untagged(v, "templateID") for v in ("site", "site:default", "site:latest")] == [
        "site", "site", "site"]
    with pytest.raises(InvalidArgument) as caught:
        untagged("site:v2", "templateID")
    assert caught.value.details["field"] == "templateID"
    assert "Template.build(template, 'site-v2')" in caught.value.message
    assert translate({"fromTemplate": "web:default"}, "debian").recipe.splitlines()[1] \
        == "FROM web"
    assert translate({"fromImage": "ubuntu:24.04"}, "debian").recipe.splitlines()[1] \
        == "FROM ubuntu:24.04"  # a Docker tag: the builder's FROM refuses it, naming images
