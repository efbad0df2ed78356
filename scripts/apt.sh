# Sourced by the setup scripts: `ensure_packages WHO PKG...` installs, with
# apt-get, the Debian packages among PKG that are not installed yet (running
# `apt-get update` first, once, only when something is missing). WHO prefixes
# the one line it prints.
ensure_packages() {
  local who=$1 pkg
  shift
  local missing=()
  for pkg in "$@"; do
    [ -n "$pkg" ] || continue
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" \
      || missing+=("$pkg")
  done
  [ ${#missing[@]} -gt 0 ] || return 0
  echo "$who: installing ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
}
