"""Recipes (SPEC §19): the Dockerfile subset read into steps, refusals naming the
line, and layer keys that change from the first changed step on."""

from __future__ import annotations

import pytest

from rift.domain.recipes import RecipeError, layer_key, parse, plan, root_key

NODE = """\
# a small web server
FROM debian
ARG VERSION=1.2
ENV APP=/srv/app \\
    MODE="production mode"
WORKDIR /srv
RUN apt-get install -y \\
    # the runtime
    nodejs npm
COPY --chown=app:app server.js app/
USER app
EXPOSE 8080 9090/tcp
CMD ["node", "app/server.js", "--port", "8080"]
"""


def _error(text: str) -> RecipeError:
    with pytest.raises(RecipeError) as caught:
        parse(text)
    return caught.value


def test_a_recipe_reads_into_its_steps_with_continuations_and_comments_dropped() -> None:
    recipe = parse(NODE)
    assert recipe.base == "debian"
    assert recipe.base_line == 2
    assert [(s.line, s.instruction) for s in recipe.steps] == [
        (3, "ARG"), (4, "ENV"), (6, "WORKDIR"), (7, "RUN"), (10, "COPY"), (11, "USER"),
        (12, "EXPOSE"), (13, "CMD")]
    assert recipe.steps[3].args == "apt-get install -y nodejs npm"


def test_settings_follow_env_arg_workdir_user_expose_and_cmd() -> None:
    settings = parse(NODE).settings
    assert dict(settings.env) == {"APP": "/srv/app", "MODE": "production mode"}
    assert dict(settings.args) == {"VERSION": "1.2"}
    assert settings.workdir == "/srv"
    assert settings.user == "app"
    assert settings.ports == (8080, 9090)
    assert settings.cmd == "node app/server.js --port 8080"


def test_a_copy_goes_under_the_working_folder_and_keeps_its_owner() -> None:
    copy = plan(parse(NODE), "root")[4].copy
    assert copy is not None
    assert (copy.sources, copy.dest, copy.chown) == (("server.js",), "/srv/app/", "app:app")


def test_the_shell_form_and_json_form_of_run_are_both_taken() -> None:
    recipe = parse('FROM tiny\nRUN echo "a b" > /x\nRUN ["/bin/sh", "-c", "echo hi"]\n')
    assert recipe.steps[0].words is None
    assert recipe.steps[1].words == ("/bin/sh", "-c", "echo hi")


def test_variables_expand_in_settings_and_an_unset_one_names_its_line() -> None:
    recipe = parse("FROM tiny\nARG D=/opt\nENV HOME=$D/home\nWORKDIR ${HOME}/work\n")
    assert recipe.settings.workdir == "/opt/home/work"
    assert _error("FROM tiny\nWORKDIR $NOWHERE\n").line == 2


def test_an_unknown_instruction_is_refused_naming_its_line() -> None:
    error = _error("FROM tiny\nRUN true\n\nHEALTHCHECK CMD true\n")
    assert error.line == 4
    assert "HEALTHCHECK is not supported" in str(error)
    assert _error("FROM tiny\nADD x /x\n").line == 2
    assert _error("FROM tiny\n  not-a-word here\n").line == 2


def test_the_recipe_begins_with_one_from_of_an_image_name() -> None:
    assert _error("RUN true\nFROM tiny\n").line == 1
    assert _error("FROM tiny\nRUN true\nFROM debian\n").line == 3
    assert _error("FROM tiny AS build\n").line == 1
    assert _error("FROM Docker.io/Library/Node\n").line == 1
    assert _error("").line == 1
    assert _error("# only a comment\n").line == 1


def test_a_copy_from_outside_the_context_or_by_wildcard_is_refused() -> None:
    assert "outside the build context" in str(_error("FROM tiny\nCOPY ../secret /x\n"))
    assert _error("FROM tiny\nCOPY /etc/passwd /x\n").line == 2
    assert _error("FROM tiny\nCOPY a/../../b /x\n").line == 2
    assert _error("FROM tiny\nCOPY *.js /srv/\n").line == 2
    assert _error("FROM tiny\nCOPY a b /srv\n").line == 2  # several sources: a folder
    assert _error("FROM tiny\nCOPY --from=build a /a\n").line == 2


def test_bad_arguments_are_refused_naming_their_line() -> None:
    assert _error("FROM tiny\nEXPOSE 53/udp\n").line == 2
    assert _error("FROM tiny\nEXPOSE 70000\n").line == 2
    assert _error("FROM tiny\nENV\n").line == 2
    assert _error("FROM tiny\nENV 1BAD=x\n").line == 2
    assert _error("FROM tiny\nUSER a b\n").line == 2
    assert _error('FROM tiny\nCMD [1, 2]\n').line == 2


def test_a_malformed_json_form_runs_as_a_shell_line() -> None:
    assert parse("FROM tiny\nRUN [ -d /tmp ]\n").steps[0].words is None


def test_keys_chain_and_change_from_the_first_changed_step_on() -> None:
    a = plan(parse("FROM tiny\nRUN one\nRUN two\nRUN three\n"), "root")
    b = plan(parse("FROM tiny\nRUN one\nRUN TWO\nRUN three\n"), "root")
    assert a[0].key == b[0].key
    assert a[1].key != b[1].key and a[2].key != b[2].key
    assert len({p.key for p in a}) == 3
    assert plan(parse("FROM tiny\nRUN one\n"), "other")[0].key != a[0].key


def test_keys_read_the_args_in_effect_and_what_a_copy_copies() -> None:
    one = plan(parse("FROM tiny\nARG V=1\nRUN make\n"), "root")
    two = plan(parse("FROM tiny\nARG V=2\nRUN make\n"), "root")
    assert one[1].key != two[1].key
    recipe = parse("FROM tiny\nCOPY a /a\n")
    assert plan(recipe, "root", {2: "x"})[0].key != plan(recipe, "root", {2: "y"})[0].key
    assert layer_key("p", "RUN a", {"B": "1"}) != layer_key("p", "RUN a", {"B": "2"})


def test_the_root_key_names_the_image_its_identity_and_owner() -> None:
    keys = {root_key("tiny", "v1", "alice"), root_key("tiny", "v2", "alice"),
            root_key("tiny", "v1", "bob"), root_key("debian", "v1", "alice")}
    assert len(keys) == 4


def test_a_copy_destination_is_read_against_the_working_folder() -> None:
    planned = plan(parse("FROM tiny\nWORKDIR /srv/app\nCOPY a b ./\nCOPY c .\nCOPY d x\n"),
                   "root")
    assert [p.copy.dest for p in planned if p.copy] == ["/srv/app/", "/srv/app/", "/srv/app/x"]
