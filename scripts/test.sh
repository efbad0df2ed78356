#!/usr/bin/env bash
# The whole suite. Starts a throwaway PostgreSQL on a loopback port for the
# PostgreSQL leg (when the server binaries are installed) and stops it after.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${RIFT_TEST_POSTGRES_URL:-}" ] && [ "${RIFT_TEST_NO_POSTGRES:-}" != 1 ]; then
  if url=$(scripts/pg.sh start); then
    export RIFT_TEST_POSTGRES_URL="$url"
    trap 'scripts/pg.sh stop' EXIT
  else
    echo "test: PostgreSQL could not start; its leg is skipped" >&2
  fi
fi
# Slow test inputs (guest images, debootstrap targets) are cached machine-wide, so
# a fresh clone on a machine that ran the suite before starts warm.
if [ -z "${RIFT_TEST_CACHE:-}" ] && mkdir -p /var/cache/rift-tests 2>/dev/null; then
  export RIFT_TEST_CACHE=/var/cache/rift-tests
fi
# Every run ends with its slowest tests (where make test's time goes; a later
# --durations on the command line wins).
.venv/bin/python -m pytest --durations=40 "$@"
