#!/bin/sh
# /init of Rift's `tiny` guest (busybox sh, PID 1). Built into the initramfs by
# hypervisor/images.py. It mounts the kernel file systems, loads the virtio
# modules in the order /etc/rift/modules lists them, configures eth0 for QEMU
# user networking, installs the public key passed as rift.key=<base64 of an
# OpenSSH public key line> on the kernel command line, starts dropbear (keys
# only, no passwords), prints RIFT-HOSTKEY and RIFT-READY on the console, and
# hands PID 1 to busybox init, which reaps orphans.
# Markers on the console: RIFT-INIT (userspace reached), RIFT-HOSTKEY <key line>,
# RIFT-READY (dropbear listens on :22), RIFT-FAILED <why> (it never will).
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root
umask 022

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mkdir -p /dev/pts /dev/shm /run /tmp /var/log /var/run
mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts /dev/pts
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /dev/shm
chmod 1777 /tmp
exec </dev/console >/dev/console 2>&1
echo "RIFT-INIT"

fail() {
    echo "RIFT-FAILED $*"
    exec /sbin/init
}

hostname rift
for module in $(cat /etc/rift/modules); do
    insmod "/lib/modules/$module.ko" || echo "rift-init: insmod $module failed"
done

ip link set lo up
# QEMU user networking: the guest is 10.0.2.15, the gateway 10.0.2.2, DNS 10.0.2.3.
tries=0
while [ ! -e /sys/class/net/eth0 ] && [ "$tries" -lt 50 ]; do
    usleep 20000
    tries=$((tries + 1))
done
[ -e /sys/class/net/eth0 ] || fail "no eth0"
ip addr add 10.0.2.15/24 dev eth0
ip link set eth0 up
ip route add default via 10.0.2.2
echo "nameserver 10.0.2.3" > /etc/resolv.conf

key=""
for word in $(cat /proc/cmdline); do
    case "$word" in
        rift.key=*) key="${word#rift.key=}" ;;
    esac
done
[ -n "$key" ] || fail "no rift.key= on the kernel command line"
mkdir -p /root/.ssh
chmod 700 /root /root/.ssh
echo "$key" | base64 -d > /root/.ssh/authorized_keys || fail "rift.key is not base64"
chmod 600 /root/.ssh/authorized_keys

# Host keys are made at boot, so no two guests share one.
mkdir -p /etc/dropbear
hostkey=/etc/dropbear/dropbear_ed25519_host_key
dropbearkey -t ed25519 -f "$hostkey" >/dev/null 2>&1 || fail "dropbearkey failed"
# -s: no password logins; -k: no remote port forwarding (local forwarding carries
# exposures: SSH direct-tcpip channels to guest ports); -W: a 1 MiB receive window
# (the default 24 KiB makes uploads slow).
dropbear -s -k -p 22 -r "$hostkey" -W 1048576 -P /run/dropbear.pid \
    || fail "dropbear did not start"

# Wait until :22 (0016) listens (state 0A) before saying so.
tries=0
until grep -q ":0016 00000000:0000 0A" /proc/net/tcp /proc/net/tcp6 2>/dev/null; do
    tries=$((tries + 1))
    [ "$tries" -lt 500 ] || fail "dropbear does not listen on :22"
    usleep 10000
done
echo "RIFT-HOSTKEY $(dropbearkey -y -f "$hostkey" | grep '^ssh-')"
echo "RIFT-READY"
exec /sbin/init
