"""What E2B's SDK sends and expects, as plain values: sandbox ids, pids, the
answers' JSON shapes, error bodies and the command line a process start becomes.
Pure: no I/O, no engine calls.

- **A sandbox id is its VM's id without `vm_`** (`vm_abcd2345` is sandbox
  `abcd2345`): a DNS label, so `<port>-<sandbox id>.<domain>` host names work, and
  any VM of the caller's can be named as a sandbox.
- **A pid is the top 32 bits of its exec id's 40** (`exec_<8 base32>`): envd's pids
  are `uint32`; the door finds the exec again among the VM's execs.
"""

from __future__ import annotations

import base64
import re
import shlex
from datetime import datetime
from typing import Any

from rift.domain.errors import (
    HandleInvalid,
    HandleRequired,
    InvalidArgument,
    LeaseStale,
    RiftError,
    TaskClosed,
    TaskReleased,
)

ENVD_VERSION = "0.6.4"  # octet-stream and gzip uploads, file metadata, watch entries
CLIENT_ID = "rift"
VM_PREFIX = "vm_"
_SANDBOX_ID = re.compile(r"[a-z2-7]{8}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
LEASE_ERRORS = (LeaseStale, TaskReleased, TaskClosed, HandleInvalid, HandleRequired)


def sandbox_id(vm_id: str) -> str:
    return vm_id.removeprefix(VM_PREFIX)


def vm_id(sandbox: str) -> str | None:
    """The VM a sandbox id names, or None when it names none (answered as unknown)."""
    return VM_PREFIX + sandbox if _SANDBOX_ID.fullmatch(sandbox) else None


def pid(exec_id: str) -> int:
    suffix = exec_id.rpartition("_")[2].upper()
    return int.from_bytes(base64.b32decode(suffix), "big") >> 8


def iso(moment: datetime | str | None) -> str | None:
    if moment is None or isinstance(moment, str):
        return moment
    return moment.isoformat().replace("+00:00", "Z")


# -- errors ------------------------------------------------------------------------------

def status_of(err: RiftError) -> int:
    """E2B's status for a Rift refusal: 400 for bad input (E2B's), 401/403 for a
    handle that no longer holds the sandbox (the lease moved on), else Rift's own."""
    if isinstance(err, InvalidArgument):
        return 400
    if isinstance(err, HandleInvalid | HandleRequired):
        return 401
    if isinstance(err, LeaseStale | TaskReleased):
        return 403
    return err.status


def message_of(err: RiftError) -> str:
    """Rift's message with its hint (what mends it), in one line."""
    return f"{err.message} ({err.code}: {err.hint})"


def error_body(status: int, message: str) -> dict[str, Any]:
    return {"code": status, "message": message}


# -- processes ---------------------------------------------------------------------------

_SHELLS = {"/bin/bash", "bash", "/bin/sh", "sh", "/usr/bin/bash"}


def command_line(cmd: str, args: list[str], envs: dict[str, str], cwd: str | None) -> str:
    """The shell command a process start runs as a Rift exec. The SDK's
    `commands.run(x)` starts `/bin/bash -l -c x`: bash where the image has it, else
    the exec's own `sh` runs it (`eval`: no second shell started; `tiny` has busybox
    only). Environment names are checked."""
    if not cmd:
        raise InvalidArgument("process.cmd", "must name a program")
    for name in envs:
        if not _ENV_NAME.fullmatch(name):
            raise InvalidArgument("process.envs", f"{name[:40]!r} is not an environment name")
    prefix = "".join(f"export {name}={shlex.quote(value)}; " for name, value in envs.items())
    if cwd:
        prefix += f"cd {shlex.quote(cwd)} || exit 1; "
    if cmd in _SHELLS and len(args) >= 2 and args[-2] == "-c" and \
            all(a in ("-l", "--login") for a in args[:-2]):
        script = shlex.quote(args[-1])
        login = " -l" if args[:-2] else ""
        return (prefix + f"if [ -x /bin/bash ]; then exec /bin/bash{login} -c {script}; "
                f"fi; eval {script}")
    if cmd in _SHELLS and args and all(a in ("-i", "-l", "--login") for a in args):
        flags = " ".join(args)  # an interactive shell: a PTY's
        return prefix + (f"if [ -x /bin/bash ]; then exec /bin/bash {flags}; "
                         f"else exec /bin/sh {flags}; fi")
    return prefix + "exec " + shlex.join([cmd, *args])


DEFAULT_USER = "user"  # envd's default: E2B's `base` runs commands as `user`
_USER_NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")


def as_user(line: str, user: str) -> str:
    """`line` run as the envd user a call names: `root` as it is (Rift's exec is
    root's); another user, when the guest has it, by `setpriv` with that user's
    groups, `HOME`, `USER` and `LOGNAME`, starting in its home (envd's way, so a
    relative `cwd` is under it), or by `su` where setpriv is busybox's (`tiny` with
    the `user` an E2B template build made). A guest without the default user
    (busybox `tiny`) runs it as root; a guest without another user named fails it."""
    if user == "root":
        return line
    if not _USER_NAME.fullmatch(user):
        raise InvalidArgument("user", f"{user[:40]!r} is not a user name")
    inner = shlex.quote('cd "$HOME" || exit 1; ' + line)
    # the user's home from /etc/passwd by the shell's builtins alone: no process
    # started in the guest before the command's own (each is milliseconds under TCG)
    # util-linux's setpriv (a file, not busybox's link, which has no --reuid), else su
    # (busybox's as root: `tiny` with a `user` an E2B template build made)
    switch = (f"h=; while IFS=: read -r n _ _ _ _ d _; do [ \"$n\" = {user} ] && h=$d && "
              f"break; done < /etc/passwd; if [ -n \"$h\" ]; then if [ -f /usr/bin/setpriv ] "
              f"&& [ ! -L /usr/bin/setpriv ]; then exec setpriv --reuid={user} "
              f"--regid={user} --init-groups env HOME=\"$h\" USER={user} LOGNAME={user} "
              f"/bin/sh -c {inner}; elif command -v su >/dev/null 2>&1; then "
              f"exec su -s /bin/sh {user} -c {inner}; fi; fi; unset h n d; ")
    if user == DEFAULT_USER:
        return switch + line
    return switch + f"echo 'user {user} not found in the sandbox' >&2; exit 1"


def end_status(status: str, exit_code: int | None, signal: str | None) -> dict[str, Any]:
    """envd's EndEvent for an exec's end."""
    if exit_code is not None:
        return {"exitCode": exit_code, "exited": True, "status": f"exit status {exit_code}"}
    if signal:
        return {"exitCode": -1, "exited": False, "status": f"signal: {signal.lower()}"}
    return {"exitCode": -1, "exited": False, "status": status,
            "error": f"the command ended {status}"}


def data_event(stream: str, text: str) -> dict[str, Any]:
    chunk = base64.b64encode(text.encode("utf-8")).decode("ascii")
    return {"event": {"data": {stream: chunk}}}
