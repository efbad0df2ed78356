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
# chroots in network namespaces of its own) and the unit tests that start no process or thread
# run beside the first part of the rest, the tests that time nothing: the browser's
# and the doors' on the test driver. The tests that time an answer, the unit tests
# that wait on real processes (a terminal's hang-up, an exec helper's timeout: in
# that crowd they failed a fresh-clone run) and the real guests come after.
first=(tests/browser tests/e2e/test_e2b_*.py tests/e2e/test_mcp_*.py tests/e2e/test_rest.py
       tests/e2e/test_operator_token.py)
# the unit modules that start no process or thread (grep -L: no line matches)
mapfile -t quiet_units < <(grep -LE 'subprocess|Popen|os\.fork|pty\b|multiprocessing|exec_helper|rift_exec|ipykernel|qemu|threading|code_guest' tests/unit/test_*.py)
beside_log=$(mktemp /tmp/rift-beside-tests.XXXXXX)
unit_log=$(mktemp /tmp/rift-unit-tests.XXXXXX)
.venv/bin/python -m pytest -p no:cacheprovider --durations=5 tests/ansible \
  >"$beside_log" 2>&1 &
ansible=$!
.venv/bin/python -m pytest -p no:cacheprovider --durations=5 "${quiet_units[@]}" \
  >"$unit_log" 2>&1 &
unit=$!
status=0
.venv/bin/python -m pytest --durations=20 "${first[@]}" || status=$?
wait "$ansible" || status=$((status ? status : $?))
echo "---- tests/ansible, run beside the tests above ----"
cat "$beside_log"
wait "$unit" || status=$((status ? status : $?))
echo "---- the ${#quiet_units[@]} unit modules that start no process or thread, run beside them too ----"
cat "$unit_log"
rm -f "$beside_log" "$unit_log"
.venv/bin/python -m pytest --durations=40 --ignore=tests/ansible \
  "${first[@]/#/--ignore=}" "${quiet_units[@]/#/--ignore=}" tests || status=$((status ? status : $?))
exit "$status"
