#!/usr/bin/env bash
# Makes libvirt with QEMU answer on qemu:///system on a Debian 12 machine
# without systemd: installs what is missing, prepares the daemon the way a
# container needs it (see DESIGN.md, "Facts seen on this kind of machine"),
# starts virtlogd and then libvirtd under tini (so destroyed QEMU processes are
# reaped at once) when they are not running, waits until libvirtd answers, and
# gives the guests' cgroup (and virtlogd, which writes their consoles) a low CPU
# weight, so `rift serve` wins the CPU against guests (hypervisor/guests_cpu.sh).
# Safe to run again: it skips what is already there. Runs as root (re-executes
# itself through sudo otherwise).
set -euo pipefail
# shellcheck source=scripts/apt.sh
. "$(dirname "$0")/apt.sh"

if [ "$(id -u)" -ne 0 ]; then
  exec sudo -E "$0" "$@"
fi

URI=qemu:///system
WAIT_S=${RIFT_LIBVIRT_WAIT_S:-30}
QEMU_CONF=/etc/libvirt/qemu.conf
LOG_DIR=/var/log/libvirt
# libvirt-daemon-system is skipped on purpose: it pulls in systemd.
# genisoimage writes the cloud-init seed of VMs of qcow2 images (`rift image add`).
APT_PACKAGES=(libvirt-daemon libvirt-daemon-driver-qemu qemu-system-x86 qemu-utils
              libvirt-clients busybox-static dropbear-bin cpio lz4 tini genisoimage nftables)
ISOLATION=$(cd "$(dirname "$0")/.." && pwd)/hypervisor/guest_isolation.nft
GUESTS_CPU=$(cd "$(dirname "$0")/.." && pwd)/hypervisor/guests_cpu.sh

say() { echo "libvirt: $*"; }

# Whether a live (not zombie) process of this exact name runs.
running() {
  local pid state
  for pid in $(pgrep -x "$1"); do
    state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) || continue
    [ "$state" != Z ] && return 0
  done
  return 1
}

# 1. packages
ensure_packages libvirt "${APT_PACKAGES[@]}"

# 2. what libvirtd needs when started by hand
mkdir -p "$LOG_DIR" /var/lib/libvirt/qemu /var/cache/libvirt/qemu /run/libvirt
if ! getent passwd libvirt-qemu >/dev/null; then
  say "adding the libvirt-qemu user"
  useradd -r -U -M -d /var/lib/libvirt -s /usr/sbin/nologin libvirt-qemu
fi

# QEMU's own user (SPEC §15: never root, never the user holding libvirt or SSH
# rights): no login, no home, its own group rift-qemu (a member of it too, so
# every QEMU process has it, allowlisted ones included), and kvm's when there is one.
if ! getent group rift-qemu >/dev/null; then
  say "adding the rift-qemu group (of the folders QEMU passes through)"
  groupadd -r rift-qemu
fi
if ! getent passwd rift-qemu >/dev/null; then
  say "adding the rift-qemu user (QEMU's own)"
  useradd -r -g rift-qemu -M -d /nonexistent -s /usr/sbin/nologin rift-qemu
fi
id -nG rift-qemu | grep -qw rift-qemu || usermod -a -G rift-qemu rift-qemu
# /dev/kvm as udev makes it on Debian (root:kvm 0660) and QEMU's user in kvm: where
# QEMU's user cannot open it, libvirt probes QEMU's capabilities again at every
# start (some 7 s each under TCG: seen on this kind of machine).
if [ -e /dev/kvm ]; then
  getent group kvm >/dev/null || groupadd -r kvm
  if [ "$(stat -c %G /dev/kvm)" = root ] && [ "$(stat -c %a /dev/kvm)" = 600 ]; then
    chgrp kvm /dev/kvm && chmod 660 /dev/kvm
  fi
fi
if getent group kvm >/dev/null && ! id -nG rift-qemu | grep -qw kvm; then
  usermod -a -G kvm rift-qemu
fi

if ! getent group rift-guests >/dev/null; then
  say "adding the rift-guests group (QEMU's, for the guests' isolation)"
  groupadd -r rift-guests
fi
if ! getent group rift-proxied >/dev/null; then
  say "adding the rift-proxied group (QEMU's of guests with an egress allowlist)"
  groupadd -r rift-proxied
fi

# qemu.conf: QEMU runs as rift-qemu in the group rift-guests (the firewall below
# knows its sockets by it; libvirt's DAC driver gives each VM's disks, kernel and
# seed to that user while it runs, without remembering owners in xattrs: an
# allowlisted guest's QEMU, group rift-proxied, shares images' kernels with the
# others, which that bookkeeping refuses), with no MAC security driver, and of the
# cgroup controllers only cpu and cpuacct: each guest's QEMU gets a cpu cgroup of
# its own under /machine, where the domain's <cputune> (RIFT_VM_CPU_WEIGHT,
# RIFT_VM_CPU_QUOTA) applies, and libvirt reads its CPU time there; the others
# (memory above all) would take QEMU out of the container's own cgroups. Our block
# sits at the end of the file; any other uncommented setting of the same keys is
# commented out first.
conf_changed=0
want_block=$'# rift: begin\nuser = "rift-qemu"\ngroup = "rift-guests"\nremember_owner = 0\nsecurity_driver = "none"\ncgroup_controllers = [ \"cpu\", \"cpuacct\" ]\n# rift: end'
mkdir -p "$(dirname "$QEMU_CONF")"
touch "$QEMU_CONF"
current_block=$(sed -n '/^# rift: begin$/,/^# rift: end$/p' "$QEMU_CONF")
if [ "$current_block" != "$want_block" ] \
   || grep -Eq '^(user|group|remember_owner|security_driver|cgroup_controllers)[[:space:]]*=' \
        <(sed '/^# rift: begin$/,/^# rift: end$/d' "$QEMU_CONF"); then
  say "configuring $QEMU_CONF"
  tmp=$(mktemp)
  sed -e '/^# rift: begin$/,/^# rift: end$/d' \
      -e 's/^\(\(user\|group\|remember_owner\|security_driver\|cgroup_controllers\)[[:space:]]*=\)/#\1/' \
      "$QEMU_CONF" > "$tmp"
  printf '%s\n' "$want_block" >> "$tmp"
  cat "$tmp" > "$QEMU_CONF"
  rm -f "$tmp"
  conf_changed=1
fi

# 3. the guests' isolation: no connection of QEMU's to this host's own addresses
if ! nft -f "$ISOLATION"; then
  say "could not load $ISOLATION: guests would reach this host's services" >&2
  exit 1
fi

# 4. daemons
if ! running virtlogd; then
  say "starting virtlogd"
  virtlogd -d
fi

if running libvirtd && [ "$conf_changed" = 1 ]; then
  if [ "${RIFT_LIBVIRT_RESTART:-0}" = 1 ]; then
    say "restarting libvirtd: $QEMU_CONF changed"
    pkill -x libvirtd || true
    while running libvirtd; do sleep 0.1; done
  else
    say "warning: $QEMU_CONF changed while libvirtd runs; RIFT_LIBVIRT_RESTART=1 $0" \
        "restarts it to apply that" >&2
  fi
fi
if ! running libvirtd; then
  say "starting libvirtd under tini"
  # setsid: its own session, so it outlives this script and its caller's job;
  # tini -s: a subreaper that reaps QEMU at once when a domain is destroyed.
  setsid tini -s -- libvirtd </dev/null >>"$LOG_DIR/libvirtd.out" 2>&1 &
fi

# 5. wait until it answers
deadline=$((SECONDS + WAIT_S))
until virsh -c "$URI" version >/dev/null 2>&1; do
  if [ "$SECONDS" -ge "$deadline" ]; then
    say "libvirtd did not answer on $URI within ${WAIT_S}s; see $LOG_DIR/libvirtd.out" >&2
    exit 1
  fi
  sleep 0.2
done
say "$URI answers ($(virsh -c "$URI" version 2>/dev/null | sed -n 's/^Running hypervisor: //p'))"

# 6. all guests together weigh little against the control plane (SPEC §15): a
# low cpu weight on libvirt's group `machine`, virtlogd in it too
sh "$GUESTS_CPU" | sed 's/^guests_cpu: /libvirt: /'
