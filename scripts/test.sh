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
if [ $# -gt 0 ] || [ "${RIFT_TEST_SERIAL:-}" = 1 ]; then
  exec .venv/bin/python -m pytest --durations=40 "$@"
fi
# The whole suite: the Ansible roles' test (two minutes of apt, pip and a fleet of
# chroots in network namespaces of its own) and the unit tests (a minute and a
# half of the engine on fakes) run beside the first part of the rest, the tests
# that time nothing: the browser's and the doors' on the test driver. The three
# leave each other the CPU they wait for (measured: all three within 181 s, the
# first part alone 185-189 s). The tests that time an answer, and the real
# guests, come after they have ended.
first=(tests/browser tests/e2e/test_e2b_*.py tests/e2e/test_mcp_*.py tests/e2e/test_rest.py
       tests/e2e/test_operator_token.py)
beside=(tests/ansible tests/unit)
declare -A logs pids
for part in "${beside[@]}"; do
  logs[$part]=$(mktemp "/tmp/rift-${part//\//-}.XXXXXX")
  .venv/bin/python -m pytest -p no:cacheprovider --durations=5 "$part" >"${logs[$part]}" 2>&1 &
  pids[$part]=$!
done
status=0
.venv/bin/python -m pytest --durations=20 "${first[@]}" || status=$?
for part in "${beside[@]}"; do
  wait "${pids[$part]}" || status=$((status ? status : $?))
  echo "---- $part, run beside the tests above ----"
  cat "${logs[$part]}"
  rm -f "${logs[$part]}"
done
.venv/bin/python -m pytest --durations=40 "${beside[@]/#/--ignore=}" \
  "${first[@]/#/--ignore=}" tests || status=$((status ? status : $?))
exit "$status"
