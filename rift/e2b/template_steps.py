"""E2B's template steps as a Rift recipe (SPEC §16, §19): the one place the door
turns what the SDK's `Template.build` sends (`POST /v2/templates/{id}/builds/{id}`:
`fromTemplate` or `fromImage`, `steps` of `RUN`, `COPY`, `ENV`, `WORKDIR`, `USER`,
`startCmd`, `readyCmd`, `force`) into the builder's recipe text. Every rule of the
build (what a FROM may name, a COPY outside its context, wildcards, a failing step,
the cache) is the builder's (rift.services.builds); pure.

- `fromTemplate` and `fromImage` name a Rift image (`name` or `name:latest`);
  `base` and E2B's `e2bdev/base` are RIFT_DEFAULT_IMAGE. Anything else goes to the
  builder's FROM as it is, which refuses it naming the images there are.
- `RUN [cmd, user?]`: a RUN (its user, when given, only for that step);
  `COPY [src, dest, user, mode]`: a COPY (`--chown=user`), then a `chmod` as root
  when a mode is given; `ENV [k, v, ...]`, `WORKDIR`, `USER`: the same lines.
- `startCmd` is the recipe's CMD. Its `readyCmd`: `wait_for_port(p)`'s is `EXPOSE
  p` (the builder waits until the port answers, from the control plane: the
  guest needs no `ss`); any other (`wait_for_url`, `wait_for_file`,
  `wait_for_process`, `wait_for_timeout`, a command of one's own) is the build's
  ready command, run in the guest after the start until it exits 0 (the
  builder's rule, within RIFT_BUILD_READY_S), noted in the recipe as a comment.
- `force` on the template or any step: the build reuses no layer (`no_cache`).
- E2B's default user: steps run as `user` in its home `/home/user` (E2B's own
  default, not Docker's root in `/`) until a `USER` says otherwise; until a
  `WORKDIR` is given, a `USER` step's folder is that user's home (`/root`,
  `/home/NAME`), as on E2B. When a step, the start or its ready command runs as
  `user` (or a COPY gives it files), the base step makes the account first where
  the image lacks it (`useradd`, or lines in /etc/passwd and /etc/group on a
  busybox image) with a sudoers rule without a password where the image has
  sudo, as E2B's `base` has: one cached layer.

Each E2B step's lines follow a comment `# e2b step N` (N: the SDK's step number,
1 for the first step; `base` for the FROM, `finalize` for the start), so a
failure's recipe line names E2B's step (`step_of`) from the recipe the build kept.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from typing import Any

from rift.domain.errors import InvalidArgument

MAX_STEPS = 500
STEP_MARK = "# e2b step "
_PORT_READY = re.compile(r'\[ -n "\$\(ss -Htuln sport = :(\d{1,5})\)" \]')
_MODE = re.compile(r"^[0-7]{3,4}$")
_LINE = re.compile(r"^line (\d+): ")
E2B_BASE = ("base", "e2bdev/base", "e2bdev/base:latest")
E2B_USER, E2B_HOME = "user", "/home/user"  # whom E2B's template steps run as, and where
# E2B's `user` made where the image lacks it (as root, one line: the recipe's RUN).
MAKE_USER = (
    "RUN grep -q '^user:' /etc/passwd || { if command -v useradd >/dev/null; then "
    "useradd -m -s \"$(command -v bash || echo /bin/sh)\" user; else "
    "echo 'user:x:1000:1000::/home/user:/bin/sh' >> /etc/passwd && "
    "echo 'user:x:1000:' >> /etc/group && mkdir -p /home/user && "
    "chown 1000:1000 /home/user; fi; } && if [ -d /etc/sudoers.d ] && "
    "[ ! -e /etc/sudoers.d/user ]; then echo 'user ALL=(ALL:ALL) NOPASSWD: ALL' "
    "> /etc/sudoers.d/user && chmod 440 /etc/sudoers.d/user; fi")


@dataclass(frozen=True)
class Translated:
    recipe: str
    no_cache: bool
    hashes: tuple[str, ...]  # the COPY steps' uploads (filesHash), in order
    ready: str | None = None  # the start's ready command, unless it waits for a port


def _strings(value: object, where: str, least: int, most: int) -> list[str]:
    if not isinstance(value, list) or not least <= len(value) <= most or not all(
            isinstance(v, str) and len(v) <= 64 * 1024 for v in value):
        raise InvalidArgument(where, f"takes {least} to {most} strings")
    return list(value)


def _one_line(text: str) -> bool:
    return "\n" not in text and "\r" not in text and not text.rstrip().endswith("\\")


def _command(word: str, command: str) -> str:
    """A RUN or CMD line: the shell form when it reads as one, else the JSON form."""
    if _one_line(command) and not command.lstrip().startswith("["):
        return f"{word} {command}"
    return f"{word} " + json.dumps(["/bin/sh", "-c", command])


DEFAULT_TAGS = ("default", "latest")  # E2B's tag of a template's latest build


def untagged(value: str, field: str) -> str:
    """A template's reference without E2B's default tag (`name:default` and
    `name:latest` are `name`); another tag is refused (invalid_argument on `field`):
    Rift keeps one build per template, its latest."""
    name, colon, tag = value.rpartition(":")
    if not colon or tag in DEFAULT_TAGS:
        return name or value
    raise InvalidArgument(field, f"{value[:80]!r}: a Rift template is one image, its latest "
                          f"build, with no tag but 'default': build it under a name of its "
                          f"own (Template.build(template, '{name[:40]}-{tag[:20]}')) and "
                          f"start that name")


def base_of(body: dict[str, Any], default_image: str) -> str:
    """The image the template starts from (its FROM)."""
    if body.get("fromImageRegistry"):
        raise InvalidArgument("fromImageRegistry", "Rift builds from its own images, not "
                              "from a registry: from_template or from_image naming a Rift "
                              "image")
    base = body.get("fromTemplate") or body.get("fromImage") or "base"
    if not isinstance(base, str) or not 0 < len(base) <= 200 or not _one_line(base):
        raise InvalidArgument("fromTemplate", "names a Rift image")
    if base in E2B_BASE:
        return default_image
    if body.get("fromTemplate"):  # an E2B template's tag; an image's (fromImage) is Docker's
        return untagged(base, "fromTemplate")
    return base.removesuffix(":latest")


def _ready_port(ready: str) -> int | None:
    """The port `wait_for_port(p)`'s command waits for (`[ -n "$(ss -Htuln sport = :p)" ]`)."""
    found = _PORT_READY.fullmatch(ready.strip())
    return int(found.group(1)) if found else None


def _home(user: str) -> str:
    name = user.split(":", 1)[0]
    return "/root" if name in ("root", "0") else f"/home/{name}"


class _Lines:
    """The recipe as it is written, with the user the steps run as so far, whether
    a WORKDIR was given, and whether E2B's `user` is needed."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.user = E2B_USER
        self.workdir_given = False
        self.needs_user = False

    def mark(self, step: str) -> None:
        self.lines.append(f"{STEP_MARK}{step}")

    def uses(self, user: str) -> None:
        if user.split(":", 1)[0] == E2B_USER:
            self.needs_user = True

    def as_user(self, user: str, line: str) -> None:
        self.uses(user or self.user)
        if user and user != self.user:
            self.lines += [f"USER {user}", line, f"USER {self.user}"]
        else:
            self.lines.append(line)


def _copy(out: _Lines, where: str, args: object, files_hash: object) -> str:
    """A COPY's lines (`--chown` its user; a mode a chmod as root after it); its hash."""
    src, dest, user, mode = [*_strings(args, where + ".args", 2, 4), "", ""][:4]
    if not isinstance(files_hash, str) or not re.fullmatch(r"[0-9a-f]{64}", files_hash):
        raise InvalidArgument(where + ".filesHash", "the SDK's sha256 of the files")
    chown = f"--chown={user} " if user else ""
    if user:
        out.uses(user)
    out.lines.append(f"COPY {chown}{shlex.quote(src)} {shlex.quote(dest)}")
    if mode:
        if not _MODE.match(mode):
            raise InvalidArgument(where + ".args", f"mode {mode[:8]!r} is not octal")
        target = dest.rstrip("/") + "/" + src.rstrip("/").rsplit("/", 1)[-1] \
            if dest.endswith("/") else dest
        out.as_user("root", f"RUN chmod {mode} {shlex.quote(target)}")
    return files_hash


def _step(out: _Lines, number: int, step: object) -> str | None:
    """One step's lines; answers its upload's hash (a COPY's)."""
    where = f"steps[{number - 1}]"
    if not isinstance(step, dict):
        raise InvalidArgument(where, "is an object with type and args")
    kind, args = step.get("type"), step.get("args")
    out.mark(str(number))
    if kind == "RUN":
        command, *run_as = _strings(args, where + ".args", 1, 2)
        out.as_user(run_as[0] if run_as else "", _command("RUN", command))
        return None
    if kind == "COPY":
        return _copy(out, where, args, step.get("filesHash"))
    if kind == "ENV":
        pairs = _strings(args, where + ".args", 2, 512)
        if len(pairs) % 2:
            raise InvalidArgument(where + ".args", "are name, value pairs")
        out.lines.append("ENV " + " ".join(f"{k}={shlex.quote(v)}"
                                           for k, v in zip(pairs[::2], pairs[1::2], strict=True)))
        return None
    if kind in ("WORKDIR", "USER"):
        (value,) = _strings(args, where + ".args", 1, 1)
        if not _one_line(value):
            raise InvalidArgument(where + ".args", "is one line")
        out.lines.append(f"{kind} {value}")
        if kind == "WORKDIR":
            out.workdir_given = True
        else:
            out.user = value
            out.uses(value)
            if not out.workdir_given:  # E2B: a step runs in its user's home by default
                out.lines.append(f"WORKDIR {_home(value)}")
        return None
    raise InvalidArgument(where + ".type", f"{str(kind)[:20]!r}: RUN, COPY, ENV, WORKDIR "
                          "or USER")


def translate(body: dict[str, Any], default_image: str) -> Translated:
    """The recipe of a template build's start (TemplateBuildStartV2); invalid_argument
    for a body that is not one."""
    steps = body.get("steps") or []
    if not isinstance(steps, list) or len(steps) > MAX_STEPS:
        raise InvalidArgument("steps", f"a list of at most {MAX_STEPS} steps")
    out = _Lines()
    out.mark("base")
    out.lines += [f"FROM {base_of(body, default_image)}", f"USER {E2B_USER}",
                  f"WORKDIR {E2B_HOME}"]
    hashes = [h for number, step in enumerate(steps, start=1)
              if (h := _step(out, number, step)) is not None]
    start, ready = body.get("startCmd"), body.get("readyCmd") or None
    if ready is not None and (not isinstance(ready, str) or len(ready) > 64 * 1024):
        raise InvalidArgument("readyCmd", "a command")
    waits: str | None = None
    if start is not None:
        if not isinstance(start, str) or not start.strip():
            raise InvalidArgument("startCmd", "a command")
        out.mark("finalize")
        port = _ready_port(ready) if ready else None
        if port is not None:
            out.lines.append(f"EXPOSE {port}")
        elif ready and ready.strip():
            waits = ready
            out.lines.append("# readyCmd, run after the start until it exits 0: "
                             + " ".join(ready.split())[:200].rstrip("\\"))
        out.lines.append(_command("CMD", start))
        out.uses(out.user)  # the start and its ready command run as the last USER
    if out.needs_user:
        out.lines.insert(2, MAKE_USER)  # before the first USER: as root
    forced = bool(body.get("force")) or any(isinstance(s, dict) and s.get("force")
                                            for s in steps)
    return Translated("\n".join(out.lines) + "\n", forced, tuple(hashes), waits)


def step_of(recipe: str, error: str | None) -> str:
    """E2B's name of the step a build's error names (by its recipe line): the step
    number, `base`, or `finalize` (a failure of no line: the start, or the build's)."""
    found = _LINE.match(error or "")
    if found is None:
        return "finalize"
    step = "base"
    for line in recipe.splitlines()[:int(found.group(1))]:
        if line.startswith(STEP_MARK):
            step = line[len(STEP_MARK):]
    return step
