"""The shell scripts a guest is given: the pooled guest's standby shell and its
hand-over, a fork's new identity, the clock's setting, and what a failed
command's stderr says.
Everything a guest prints back is read without patterns (SPEC §15)."""

from __future__ import annotations

import shlex
import time

import paramiko

from hypervisor.exec_helper import GUEST_PATH
from rift.guest.keys import new_host_key
from rift.guest.run import send_within

SETTLE_S = 2.5  # how long a fork's SSH server waits before it starts anew (identity)
RESTART_S = SETTLE_S + 5.0  # how long it may take to listen again, from then
_REASON_MAX = 500  # characters of a guest's stderr kept as a failed file operation's reason


def clock_prefix() -> str:
    """What sets the guest's clock to this host's before a command, in any shell."""
    return f'date -s "@{round(time.time())}" >/dev/null 2>&1; '


# The standby shell: bash where there is one (its builtins read the clock), else sh.
STANDBY_SHELL = "command -v bash >/dev/null && exec bash -s; exec sh -s"
_HANDED = b"rift-handed-"


def _handed(seen: bytes) -> int | None:
    """The status in the first whole `rift-handed-N` line of `seen` (no pattern)."""
    at = seen.find(_HANDED)
    while at >= 0:
        end = seen.find(b"\n", at)
        if end < 0:
            return None
        digits = seen[at + len(_HANDED):end]
        if digits.isdigit() and len(digits) <= 3:
            return int(digits)
        at = seen.find(_HANDED, at + 1)
    return None


# The hand-over as a shell function, for busybox sh and bash alike, in builtins:
# every process a guest starts under TCG costs tens of milliseconds. The key file
# exists (the init made it, mode 0600) and is rewritten in place. bash reads the
# guest's clock itself (`printf %()T`) and runs `date -s` only when it is more than
# a second off; sh always sets it. The standby shell is given it ahead of time, so
# the hand-over sends one short line (bash reads a pipe a byte at a time).
HAND_OVER_FUNCTION = (
    "rift_hand_over() { printf '%s\\n' \"$1\" > /root/.ssh/authorized_keys "
    "&& printf '%s' \"$2\" > /dev/urandom "
    "&& { if [ -n \"$BASH_VERSION\" ]; then printf -v g '%(%s)T' -1; "
    "[ $((g - $3)) -ge -1 ] && [ $((g - $3)) -le 1 ]; else false; fi "
    "|| date -s \"@$3\" >/dev/null; }; }"
)


# A fork's new identity (refresh_identity), for busybox sh and bash alike: the new
# host key's line printed first, then `rift-exec identity` (one static process: a
# program started under TCG costs about a hundred milliseconds) writes the key, the
# MAC (on Rift's own images: a cloud image's network configuration matches its
# MAC), the entropy and the clock, and starts the SSH server anew with the key in
# the background, RIFT_SETTLE_MS later: the agent's first calls run on the
# connection open now and have the guest's one vCPU to themselves (a login
# meanwhile is retried, see `_connect`). dropbear (`tiny`) makes its key itself,
# in its own format; sshd gets the one made on the control plane.
_IDENTITY = r"""
set -e
mac=-
if [ -x /usr/lib/rift/busybox ] || [ -f /run/dropbear.pid ]; then mac=$RIFT_MAC; fi
if [ -f /run/dropbear.pid ]; then
  k=/etc/dropbear/dropbear_ed25519_host_key
  rm -f "$k.new"
  set -- $(dropbearkey -t ed25519 -f "$k.new" 2>/dev/null | grep '^ssh-')
  mv -f "$k.new" "$k"
  echo "$1 $2"
  exec "$RIFT_EXEC" identity / "$mac" "$RIFT_NOW_CS" "$RIFT_SETTLE_MS" "$k" /run/dropbear.pid \
    -- dropbear -s -k -p 22 -r "$k" -W 1048576 -P /run/dropbear.pid <<RIFT_END
$RIFT_ENTROPY


RIFT_END
fi
echo "$RIFT_HOST_PUB"
pidfile=/run/sshd.pid; set --
[ -f "$pidfile" ] || { pidfile=-; set -- -- systemctl reload ssh.service; }
exec "$RIFT_EXEC" identity / "$mac" "$RIFT_NOW_CS" "$RIFT_SETTLE_MS" \
  /etc/ssh/ssh_host_ed25519_key "$pidfile" "$@" <<RIFT_END
$RIFT_ENTROPY
$RIFT_HOST_PUB
$RIFT_HOST_KEY
RIFT_END
"""
OLD_HELPER = (2, 127)  # `identity` refused as usage (an older rift-exec), or none there


def identity_script(mac: str, entropy: bytes, now: float) -> str:
    """The whole of a fork's new identity, its values up front: an ed25519 host key
    made here for sshd (ssh-keygen in the guest costs a few hundred milliseconds
    under TCG; dropbear makes its own, in its own format, at once)."""
    private, public = new_host_key()
    return (f"RIFT_MAC={shlex.quote(mac)} RIFT_ENTROPY={entropy.hex()} "
            f"RIFT_NOW_CS={round(now * 100)} RIFT_EXEC={GUEST_PATH} "
            f"RIFT_SETTLE_MS={round(SETTLE_S * 1000)} "
            f"RIFT_HOST_KEY={shlex.quote(private)} RIFT_HOST_PUB={shlex.quote(public)}\n"
            f"{_IDENTITY}")


# A build's VM of a layer keeps its source's host key and SSH server (no restart to
# wait for before its state is saved; every VM of a built image gets its own
# identity at its start): `rift-exec identity` with empty key lines (the key stays
# as it is), no pid file and no restart, so only the MAC, entropy and clock change.
_SAME_HOST_KEY = r"""
set -e
mac=-
if [ -x /usr/lib/rift/busybox ] || [ -f /run/dropbear.pid ]; then mac=$RIFT_MAC; fi
exec "$RIFT_EXEC" identity / "$mac" "$RIFT_NOW_CS" 0 /run/rift-no-key - <<RIFT_END
$RIFT_ENTROPY


RIFT_END
"""


def same_host_key_script(mac: str, entropy: bytes, now: float) -> str:
    """A fork's MAC, entropy and clock set as `identity_script` sets them, its host
    key and SSH server left as they are."""
    return (f"RIFT_MAC={shlex.quote(mac)} RIFT_ENTROPY={entropy.hex()} "
            f"RIFT_NOW_CS={round(now * 100)} RIFT_EXEC={GUEST_PATH}\n{_SAME_HOST_KEY}")


def hand_over_call(public_key_line: str, now: float, entropy: bytes) -> str:
    """The line that runs the hand-over: the task's key, fresh bytes, the host's clock."""
    return f"rift_hand_over {shlex.quote(public_key_line)} {entropy.hex()} {round(now)}"


def hand_over_script(public_key_line: str, now: float, entropy: bytes) -> str:
    """The whole hand-over, for a shell that was not given the function."""
    return f"{HAND_OVER_FUNCTION}\n{hand_over_call(public_key_line, now, entropy)}"


def in_standby(chan: paramiko.Channel, script: str, deadline: float) -> int | None:
    """Run `script` in the standby shell; its exit status, None if the shell ended."""
    send_within(chan, f"{script}\necho rift-handed-$?\n".encode(), deadline)
    seen = b""
    while True:
        found = _handed(seen)
        if found is not None:
            return found
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the standby shell did not answer")
        chan.settimeout(remaining)
        data = chan.recv(4096)
        if not data:
            return None
        seen = (seen + data)[-4096:]


def shell_reason(stderr: bytes) -> str:
    """A failed command's stderr without the shell's `sh: ` and `eval: line N: `
    prefixes, at most _REASON_MAX characters (split, no pattern: it is the guest's)."""
    text = stderr[:4 * _REASON_MAX].decode("utf-8", "replace").strip()
    first, sep, rest = text.partition(": ")
    if sep and first.endswith("sh") and " " not in first:
        text = rest
    if text.startswith("eval: line "):
        number, sep, rest = text.removeprefix("eval: line ").partition(": ")
        if sep and number.isdigit():
            text = rest
    return text[:_REASON_MAX]


