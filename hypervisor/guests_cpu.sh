#!/bin/sh
# Gives all guests together a low CPU weight against the rest of this host (SPEC
# §15: no guest slows anyone else), where no systemd runs: libvirt puts each
# guest's QEMU in a cgroup of its own under the group `machine`, beside libvirtd's
# own (its <cputune> weighs guests against each other, RIFT_VM_CPU_WEIGHT); this
# weighs that group, so all guests at once, against `rift serve`, PostgreSQL,
# sshd and libvirtd, which then win the CPU whenever they want it. A weight only
# counts when the CPU is short: a guest alone on a host keeps its whole speed.
# virtlogd, which writes the consoles of guests whose qemu.conf leaves
# stdio_handler at "logd" (a flooded console is its work), joins the guests'
# group, in a child of its own that weighs as one guest (LOGD_WEIGHT, the
# <cputune><shares> Rift gives each guest by default, RIFT_VM_CPU_WEIGHT): at
# cgroup v1's default (1024) it weighed as two guests, and a guest flooding its
# console slowed its neighbours through it (docs/benchmarks.md, issue #26).
# virtlogd also runs as SCHED_BATCH (chrt -b), where chrt is: it wakes for each
# byte a flooding guest writes, and a batch task's wakeup never preempts the
# thread running (another guest's vCPU); its writes wait for its turn instead.
# With systemd the hypervisor role gives machine.slice the same weight instead.
#
#   guests_cpu.sh [WEIGHT [LOGD_WEIGHT]]
#                             WEIGHT on cgroup v2's scale (1-10000, 100 = a
#                             process's own), default 10; cgroup v1's cpu.shares
#                             get WEIGHT * 1024 / 100, as systemd's CPUWeight does.
#                             LOGD_WEIGHT: virtlogd's group within the guests'
#                             (cpu.shares on v1, cpu.weight on v2, as libvirt
#                             writes a guest's <shares>), default 512
#
# GUESTS_CPU_ROOT (default /sys/fs/cgroup), GUESTS_CPU_LIBVIRTD_PID (default: the
# running libvirtd's), GUESTS_CPU_VIRTLOGD_PIDS (default: the running
# virtlogd's) and GUESTS_CPU_CHRT (default chrt) let the tests run it against
# folders and processes of their own. Prints where it set what; exits 0 with a
# note where there is no cpu controller.
set -eu

WEIGHT=${1:-10}
LOGD_WEIGHT=${2:-512}
ROOT=${GUESTS_CPU_ROOT:-/sys/fs/cgroup}
PID=${GUESTS_CPU_LIBVIRTD_PID-$(pgrep -o -x libvirtd || true)}
LOGDS=${GUESTS_CPU_VIRTLOGD_PIDS-$(pgrep -x virtlogd || true)}
CHRT=${GUESTS_CPU_CHRT:-chrt}

# placement PATTERN: libvirtd's own cgroup in the hierarchy whose /proc line
# matches PATTERN ("/" when libvirtd does not run: libvirt starts from its own).
placement() {
  where=/
  if [ -n "$PID" ] && [ -r "/proc/$PID/cgroup" ]; then
    where=$(sed -n "s#$1##p" "/proc/$PID/cgroup" | head -n 1)
  fi
  echo "${where:-/}" | sed 's#/*$##'
}

if [ -f "$ROOT/cpu/cpu.shares" ]; then  # cgroup v1 (cpu alone or cpu,cpuacct)
  base=$ROOT/cpu$(placement '^[0-9]*:\(cpuacct,\)\{0,1\}cpu\(,cpuacct\)\{0,1\}:')
  machine=$base/machine
  mkdir -p "$machine/rift-virtlogd"
  echo $((WEIGHT * 1024 / 100)) > "$machine/cpu.shares"
  echo "$LOGD_WEIGHT" > "$machine/rift-virtlogd/cpu.shares"
  echo "guests_cpu: $machine/cpu.shares = $(cat "$machine/cpu.shares")"
  echo "guests_cpu: $machine/rift-virtlogd/cpu.shares = $LOGD_WEIGHT"
elif grep -qw cpu "$ROOT/cgroup.controllers" 2>/dev/null; then  # cgroup v2
  base=$ROOT$(placement '^0::')
  machine=$base/machine
  grep -qw cpu "$base/cgroup.subtree_control" || echo +cpu > "$base/cgroup.subtree_control"
  mkdir -p "$machine/rift-virtlogd"
  grep -qw cpu "$machine/cgroup.subtree_control" || echo +cpu > "$machine/cgroup.subtree_control"
  echo "$WEIGHT" > "$machine/cpu.weight"
  echo "$LOGD_WEIGHT" > "$machine/rift-virtlogd/cpu.weight"
  echo "guests_cpu: $machine/cpu.weight = $(cat "$machine/cpu.weight")"
  echo "guests_cpu: $machine/rift-virtlogd/cpu.weight = $LOGD_WEIGHT"
else
  echo "guests_cpu: no cpu cgroup controller under $ROOT: guests weigh as any process"
  exit 0
fi

for pid in $LOGDS; do
  echo "$pid" > "$machine/rift-virtlogd/cgroup.procs"
  echo "guests_cpu: virtlogd ($pid) in $machine/rift-virtlogd"
  if command -v "$CHRT" >/dev/null 2>&1 && "$CHRT" -b -a -p 0 "$pid" >/dev/null; then
    echo "guests_cpu: virtlogd ($pid) runs as SCHED_BATCH"
  fi
done
