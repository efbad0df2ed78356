#!/usr/bin/env bash
# Installs what Rift needs on a Debian 12 machine and is missing: system
# packages (apt, as root), a virtualenv in .venv, and the project with its
# dev dependencies. Safe to run again: it skips what is already there.
set -euo pipefail
# shellcheck source=scripts/apt.sh
. "$(dirname "$0")/apt.sh"
cd "$(dirname "$0")/.."

APT_PACKAGES=(pkg-config libvirt-dev gcc libc6-dev python3-dev python3-venv tini postgresql chromium openssh-server debootstrap
  python3-ipykernel)  # python3-ipykernel: tests/unit/test_code_server.py runs the guest's kernel server
[ "${RIFT_SETUP_NO_POSTGRES:-}" = 1 ] && APT_PACKAGES=("${APT_PACKAGES[@]/postgresql}")

ensure_packages setup "${APT_PACKAGES[@]}"

PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.rift-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setup: installing Rift and its dependencies into .venv"
  .venv/bin/pip install -q --upgrade pip >/dev/null
  # --no-compile: byte-compiling every installed module (ansible's thousands among
  # them) took about half of a fresh clone's install here; Python compiles what
  # is imported, once, when it is first imported (the Makefile unexports
  # PYTHONDONTWRITEBYTECODE, which would make every process compile it again).
  .venv/bin/pip install -q --no-compile -e '.[dev]'
  echo "$want" > "$stamp"
fi
