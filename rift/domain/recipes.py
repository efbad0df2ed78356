"""Recipes (SPEC §19): the Dockerfile subset an image is built from, read into
steps, and each step's layer key.

The subset: `FROM` (a Rift image), `RUN`, `COPY`, `ENV`, `WORKDIR`, `USER`, `ARG`,
`EXPOSE` and `CMD`; `RUN` and `CMD` in the shell form or the JSON (exec) form;
`\\` at a line's end continues it on the next; `#` at a line's start is a comment
(also inside a continued instruction, as Docker reads it). Anything else is
refused with `RecipeError`, naming its line, before any VM starts.

A layer's key is the digest of its parent's key, the step's text, the `ARG`s in
effect and the content of what a `COPY` copies (its sources' digest, given by
the caller, who reads the context): two recipes share their layers up to the
first step that differs in any of these. Stdlib only; reading the context and
running steps are the engine's (rift.services.builds).
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

INSTRUCTIONS = ("FROM", "RUN", "COPY", "ENV", "WORKDIR", "USER", "ARG", "EXPOSE", "CMD")
GUEST_CHANGING = ("RUN", "COPY")  # the steps that change the guest; the rest are settings
KEY_VERSION = "rift-recipe-1"
MAX_RECIPE_BYTES = 256 * 1024
_WORD = re.compile(r"^([A-Za-z]+)(?:\s+|$)")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")
_IMAGE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
_GLOB = frozenset("*?[")
_USER = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,31})?$")


class RecipeError(ValueError):
    """A line the builder does not understand (or cannot take): its number and why."""

    def __init__(self, line: int, why: str) -> None:
        super().__init__(f"line {line}: {why}")
        self.line = line
        self.why = why


@dataclass(frozen=True)
class Step:
    """One instruction as written: its first line's number, its word (upper case),
    its arguments (continuations joined) and, for RUN, CMD and COPY, the JSON form's
    words when that form was used."""

    line: int
    instruction: str
    args: str
    words: tuple[str, ...] | None = None

    @property
    def text(self) -> str:
        """The step as its key reads it: `WORD args`, whitespace as written."""
        return f"{self.instruction} {self.args}".rstrip()


@dataclass(frozen=True)
class Settings:
    """What the steps so far set: the environment, `ARG`s, working folder, user,
    ports and start command that the next step runs under."""

    env: tuple[tuple[str, str], ...] = ()
    args: tuple[tuple[str, str], ...] = ()
    workdir: str = "/"
    user: str = "root"
    ports: tuple[int, ...] = ()
    cmd: str | None = None  # a shell command line

    def values(self) -> dict[str, str]:
        """What `$NAME` means in a step: its ARGs, then its ENV over them."""
        return {**dict(self.args), **dict(self.env)}


@dataclass(frozen=True)
class Copy:
    """A COPY: sources relative to the context, where they go in the guest."""

    sources: tuple[str, ...]
    dest: str
    chown: str | None = None


@dataclass(frozen=True)
class Planned:
    """A step with what it runs under (`before`), what it leaves (`after`), its
    layer key and, for a COPY, what it copies."""

    step: Step
    key: str
    before: Settings
    after: Settings
    copy: Copy | None = None

    @property
    def changes_guest(self) -> bool:
        return self.step.instruction in GUEST_CHANGING


@dataclass(frozen=True)
class Recipe:
    base: str  # the FROM image
    base_line: int
    steps: tuple[Step, ...]  # after FROM
    settings: Settings = field(default_factory=Settings)  # after every step


def parse(text: str) -> Recipe:
    """The recipe's steps; RecipeError naming the first line it cannot take."""
    if len(text.encode()) > MAX_RECIPE_BYTES:
        raise RecipeError(1, f"a recipe is at most {MAX_RECIPE_BYTES // 1024} KiB")
    steps = list(_instructions(text))
    if not steps:
        raise RecipeError(1, "the recipe is empty; it begins with FROM <image>")
    first, rest = steps[0], steps[1:]
    if first.instruction != "FROM":
        raise RecipeError(first.line, f"{first.instruction} before FROM; a recipe begins "
                          "with FROM <image>")
    base = _from(first)
    settings = Settings()
    for step in rest:
        if step.instruction == "FROM":
            raise RecipeError(step.line, "a second FROM; a recipe builds one image from one "
                              "FROM (no stages)")
        settings, _ = _apply(step, settings)
    return Recipe(base=base, base_line=first.line, steps=tuple(rest), settings=settings)


def plan(recipe: Recipe, root_key: str,
         copy_digests: Mapping[int, str] | None = None) -> list[Planned]:
    """Each step with its key, chained from `root_key` (the FROM image's identity,
    made by the engine); `copy_digests` gives each COPY's content digest by line."""
    digests = copy_digests or {}
    planned: list[Planned] = []
    parent, settings = root_key, Settings()
    for step in recipe.steps:
        after, copy = _apply(step, settings)
        key = layer_key(parent, step.text, dict(settings.args), digests.get(step.line, ""))
        planned.append(Planned(step, key, settings, after, copy))
        parent, settings = key, after
    return planned


def layer_key(parent: str, text: str, args: Mapping[str, str], content: str = "") -> str:
    """The digest of a parent key, a step's text, the ARGs in effect and what it copies."""
    body = json.dumps([KEY_VERSION, parent, text, sorted(args.items()), content])
    return hashlib.sha256(body.encode()).hexdigest()


def root_key(image: str, identity: str, owner: str) -> str:
    """The key a recipe's first step has as its parent: the FROM image as it is now
    (`identity`, e.g. its manifest's digest) and whose layers these are."""
    return hashlib.sha256(json.dumps([KEY_VERSION, "FROM", image, identity,
                                      owner]).encode()).hexdigest()


def shell_line(words: tuple[str, ...]) -> str:
    """A JSON-form command as one shell line (the guest runs every step in a shell)."""
    return shlex.join(words)


# -- reading ---------------------------------------------------------------------------------

def _instructions(text: str) -> list[Step]:
    steps: list[Step] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue  # a comment (also inside a continuation), or a blank line
        if not pending:
            start = number
        continued = stripped.endswith("\\")
        pending.append(stripped[:-1].rstrip() if continued else stripped)
        if not continued:
            steps.append(_step(start, " ".join(p for p in pending if p)))
            pending = []
    if pending:
        steps.append(_step(start, " ".join(p for p in pending if p)))
    return steps


def _step(line: int, joined: str) -> Step:
    match = _WORD.match(joined)
    if match is None:
        raise RecipeError(line, f"{joined[:40]!r} is no instruction")
    word = match.group(1).upper()
    args = joined[match.end():].strip()
    if word not in INSTRUCTIONS:
        raise RecipeError(line, f"{word} is not supported; a recipe takes "
                          f"{', '.join(INSTRUCTIONS)}")
    if not args:
        raise RecipeError(line, f"{word} needs arguments")
    words = _json_words(line, word, args) if word in ("RUN", "CMD", "COPY") else None
    return Step(line, word, args, words)


def _json_words(line: int, word: str, args: str) -> tuple[str, ...] | None:
    if not args.startswith("["):
        return None
    try:
        value = json.loads(args)
    except ValueError:
        return None  # Docker runs a malformed JSON form as a shell command line; so do we
    if (not isinstance(value, list) or not value
            or not all(isinstance(w, str) for w in value)):
        raise RecipeError(line, f"{word}'s JSON form is a non-empty list of strings")
    return tuple(value)


def _from(step: Step) -> str:
    parts = step.args.split()
    if len(parts) != 1 or parts[0].startswith("-"):
        raise RecipeError(step.line, "FROM takes one image name (no flags, no stage name)")
    image = parts[0]
    if not _IMAGE.match(image):
        raise RecipeError(step.line, f"FROM {image!r}: an image name is lower case letters, "
                          "digits, '.', '_' and '-'")
    return image


def _apply(step: Step, s: Settings) -> tuple[Settings, Copy | None]:
    """The settings after `step`, and the COPY it is (if it is one)."""
    if step.instruction == "COPY":
        return s, _copy(step, s)
    return _SETTERS.get(step.instruction, _unchanged)(step, s), None


def _unchanged(step: Step, s: Settings) -> Settings:  # RUN
    return s


def _cmd(step: Step, s: Settings) -> Settings:
    return replace(s, cmd=shell_line(step.words) if step.words else step.args)


def _env(step: Step, s: Settings) -> Settings:
    env = dict(s.env)
    env.update(_pairs(step.line, _expand(step.line, step.args, s), legacy=True))
    return replace(s, env=tuple(env.items()))


def _arg(step: Step, s: Settings) -> Settings:
    args = dict(s.args)
    args.update(_pairs(step.line, step.args, legacy=False))
    return replace(s, args=tuple(args.items()))


def _workdir(step: Step, s: Settings) -> Settings:
    path = _expand(step.line, step.args, s)
    return replace(s, workdir=posixpath.normpath(posixpath.join(s.workdir, path)))


def _user(step: Step, s: Settings) -> Settings:
    user = _expand(step.line, step.args, s)
    if not _USER.match(user):
        raise RecipeError(step.line, f"USER {user!r}: a user name or id (and :group)")
    return replace(s, user=user)


def _expose(step: Step, s: Settings) -> Settings:
    return replace(s, ports=tuple(dict.fromkeys(s.ports + _ports(step, s))))


_SETTERS = {"CMD": _cmd, "ENV": _env, "ARG": _arg, "WORKDIR": _workdir, "USER": _user,
            "EXPOSE": _expose}


def _expand(line: int, text: str, s: Settings) -> str:
    values = s.values()

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in values:
            raise RecipeError(line, f"${name} is not set (no ARG or ENV before this line)")
        return values[name]

    return _VAR.sub(value, text)


def _pairs(line: int, text: str, *, legacy: bool) -> dict[str, str]:
    """`NAME=value ...` (values as a shell would quote them); `ENV NAME value` too."""
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise RecipeError(line, f"cannot read {text[:40]!r}: {exc}") from None
    if legacy and words and "=" not in words[0]:
        name, value = words[0], text.split(None, 1)[1].strip() if len(words) > 1 else ""
        if len(words) < 2:
            raise RecipeError(line, "ENV NAME value, or ENV NAME=value ...")
        pairs = {name: value}
    else:
        pairs = {}
        for word in words:
            name, eq, value = word.partition("=")
            if not eq and legacy:
                raise RecipeError(line, f"{word!r}: ENV takes NAME=value pairs")
            pairs[name] = value
    for name in pairs:
        if not _NAME.match(name):
            raise RecipeError(line, f"{name!r} is no variable name")
    return pairs


def _copy(step: Step, s: Settings) -> Copy:
    line = step.line
    chown = None
    if step.words is not None:
        words = list(step.words)
    else:
        try:
            words = shlex.split(step.args)
        except ValueError as exc:
            raise RecipeError(line, f"cannot read COPY's arguments: {exc}") from None
        while words and words[0].startswith("--"):
            flag, _, value = words.pop(0).partition("=")
            if flag != "--chown" or not value:
                raise RecipeError(line, f"COPY {flag}: only --chown=USER[:GROUP] is supported")
            chown = value
    words = [_expand(line, w, s) for w in words]
    if len(words) < 2:
        raise RecipeError(line, "COPY <source>... <destination>")
    *sources, dest = words
    for source in sources:
        if _GLOB & set(source):
            raise RecipeError(line, f"COPY {source!r}: wildcards are not supported; name "
                              "each file or folder")
        normal = posixpath.normpath(source)
        if source.startswith("/") or normal == ".." or normal.startswith("../"):
            raise RecipeError(line, f"COPY {source!r} is outside the build context")
    if len(sources) > 1 and not dest.endswith("/"):
        raise RecipeError(line, "COPY of several sources goes to a folder ending in /")
    return Copy(tuple(posixpath.normpath(src) for src in sources),
                posixpath.join(s.workdir, dest) if not dest.startswith("/") else dest, chown)


def _ports(step: Step, s: Settings) -> tuple[int, ...]:
    ports: list[int] = []
    for word in _expand(step.line, step.args, s).split():
        number, _, proto = word.partition("/")
        if proto not in ("", "tcp"):
            raise RecipeError(step.line, f"EXPOSE {word}: only TCP ports are waited for")
        if not number.isdigit() or not 1 <= int(number) <= 65535:
            raise RecipeError(step.line, f"EXPOSE {word}: a port is 1-65535")
        ports.append(int(number))
    return tuple(ports)
