"""The values a recipe is read into (rift.domain.recipes) and what each setting
step (ENV, ARG, WORKDIR, USER, EXPOSE, CMD) and COPY makes of its arguments."""

from __future__ import annotations

import json
import posixpath
import re
import shlex
from dataclasses import dataclass, replace

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")
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


def shell_line(words: tuple[str, ...]) -> str:
    """A JSON-form command as one shell line (the guest runs every step in a shell)."""
    return shlex.join(words)


def json_words(line: int, word: str, args: str) -> tuple[str, ...] | None:
    """The words of a JSON (exec) form, or None for the shell form."""
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


def apply(step: Step, s: Settings) -> tuple[Settings, Copy | None]:
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
    folder = dest.endswith("/") or dest in (".", "..") or dest.endswith(("/.", "/.."))
    where = posixpath.normpath(posixpath.join(s.workdir, dest))
    return Copy(tuple(posixpath.normpath(src) for src in sources),
                where.rstrip("/") + "/" if folder else where, chown)


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
