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
# The whole suite in three runs at once, then the rest: the Ansible roles' test (two
# minutes of apt, pip and a fleet of chroots in network namespaces of its own); the
# unit tests (the engine on fakes) and the E2B door's tests on the test driver; and
# the browser's and the other doors' tests on the test driver. None of them times
# an answer, and they leave each other the CPU they wait for (measured with the
# machine otherwise quiet: 181 s for the three, each part 154-175 s). The tests
# that time an answer, and the real guests, come after they have ended.
first=(tests/browser tests/e2e/test_mcp_*.py tests/e2e/test_rest.py
       tests/e2e/test_operator_token.py)
second=(tests/unit tests/e2e/test_e2b_*.py)
beside() {  # LOG TESTS...: a pytest run in the background, its output kept for later
  local log=$1
  shift
  .venv/bin/python -m pytest -p no:cacheprovider --durations=5 "$@" >"$log" 2>&1 &
}
ansible_log=$(mktemp /tmp/rift-tests-ansible.XXXXXX)
second_log=$(mktemp /tmp/rift-tests-unit-e2b.XXXXXX)
beside "$ansible_log" tests/ansible
ansible=$!
beside "$second_log" "${second[@]}"
second_run=$!
status=0
.venv/bin/python -m pytest --durations=20 "${first[@]}" || status=$?
for run in "$ansible:tests/ansible:$ansible_log" "$second_run:${second[*]}:$second_log"; do
  IFS=: read -r pid what log <<<"$run"
  wait "$pid" || status=$((status ? status : $?))
  echo "---- $what, run beside the tests above ----"
  cat "$log"
  rm -f "$log"
done
done_parts=("${first[@]}" tests/ansible "${second[@]}")
.venv/bin/python -m pytest --durations=40 "${done_parts[@]/#/--ignore=}" tests \
  || status=$((status ? status : $?))
exit "$status"
