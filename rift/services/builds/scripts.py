"""The shell scripts a build runs in its guest: a RUN under the settings before it
(ENV and ARG exported, in WORKDIR, as USER), the unpacking of a COPY's tar, and
the start of a CMD in a session of its own (so it outlives the exec that starts
it, and is saved running with the VM)."""

from __future__ import annotations

from shlex import quote

from rift.domain.recipes import Copy, Planned, Settings, shell_line

CMD_LOG = "/var/log/rift-cmd.log"


def _exports(s: Settings) -> str:
    values = {**dict(s.args), **dict(s.env)}
    return "".join(f"export {name}={quote(value)}\n" for name, value in values.items())


def _as_user(user: str, body: str) -> str:
    name = user.split(":", 1)[0]
    if name in ("root", "0"):
        return body
    return f"exec su -s /bin/sh {quote(name)} -c {quote(body)}\n"


def _in_workdir(s: Settings) -> str:
    return f"mkdir -p {quote(s.workdir)} && cd {quote(s.workdir)} || exit 1\n"


def run_script(p: Planned) -> str:
    """A RUN as Docker runs it: `/bin/sh -c` its command, under the settings before it."""
    s = p.before
    command = shell_line(p.step.words) if p.step.words else p.step.args
    body = _exports(s) + _in_workdir(s) + f"exec /bin/sh -c {quote(command)}\n"
    return _as_user(s.user, body)


def copy_script(copy: Copy, tar_path: str, targets: list[str]) -> str:
    """Unpack a COPY's tar at `/` (its members are the guest's paths), own it."""
    script = f"tar -xf {quote(tar_path)} -C / && rm -f {quote(tar_path)} || exit 1\n"
    if copy.chown and targets:
        script += f"chown -R {quote(copy.chown)} {' '.join(quote(t) for t in targets)}\n"
    return script


def start_script(s: Settings) -> str:
    """The CMD started in a session of its own, its output in CMD_LOG."""
    assert s.cmd is not None
    service = (f"setsid /bin/sh -c {quote(s.cmd)} </dev/null >>{CMD_LOG} 2>&1 &\n")
    body = _exports(s) + _in_workdir(s) + service
    return f"mkdir -p /var/log && touch {CMD_LOG} && chmod 666 {CMD_LOG}\n" + \
        _as_user(s.user, body)


def ready_script(s: Settings, command: str) -> str:
    """A CMD's ready check (E2B's readyCmd): `/bin/sh -c` it under the CMD's settings."""
    body = _exports(s) + _in_workdir(s) + f"exec /bin/sh -c {quote(command)}\n"
    return _as_user(s.user, body)


def tail_script(limit: int = 2000) -> str:
    return f"tail -c {limit} {CMD_LOG} 2>/dev/null || true\n"
