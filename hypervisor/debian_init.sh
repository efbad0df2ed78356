#!/bin/sh
# /init of the `debian` image's initramfs (busybox sh, PID 1). Built by
# hypervisor/debian.py. Like `tiny`'s init it mounts the kernel file systems,
# loads the virtio modules in the order /etc/rift/modules lists them, configures
# eth0 for QEMU user networking and installs the key passed as
# rift.key=<base64 of an OpenSSH public key line>; then it mounts the VM's own
# copy-on-write overlay (/dev/vda, ext4) as the root, moves /dev, /proc and /sys
# into it and switch_roots to Debian's side of Rift's init,
# /usr/lib/rift/init (debian_root_init.sh), which starts sshd and prints the
# markers. No systemd, no cloud-init.
# Markers on the console: RIFT-INIT (userspace reached), RIFT-FAILED <why>.
export PATH=/sbin:/bin
umask 022

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
exec </dev/console >/dev/console 2>&1
echo "RIFT-INIT"

fail() {
    echo "RIFT-FAILED $*"
    exec /sbin/init
}

for module in $(cat /etc/rift/modules); do
    insmod "/lib/modules/$module.ko" || echo "rift-init: insmod $module failed"
done

key=""
for word in $(cat /proc/cmdline); do
    case "$word" in
        rift.key=*) key="${word#rift.key=}" ;;
    esac
done
[ -n "$key" ] || fail "no rift.key= on the kernel command line"

tries=0
while [ ! -b /dev/vda ] && [ "$tries" -lt 250 ]; do
    usleep 20000
    tries=$((tries + 1))
done
[ -b /dev/vda ] || fail "no /dev/vda (the VM's overlay disk)"
mkdir -p /newroot
# noinit_itable: the groups a resize adds are not zeroed in the background,
# which would write their inode tables into the overlay for nothing.
mount -t ext4 -o rw,noatime,noinit_itable /dev/vda /newroot || fail "cannot mount /dev/vda"
[ -x /newroot/usr/lib/rift/init ] || fail "/dev/vda holds no /usr/lib/rift/init"

hostname rift
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
rm -f /newroot/etc/resolv.conf
echo "nameserver 10.0.2.3" > /newroot/etc/resolv.conf

mkdir -p /newroot/root/.ssh
chmod 700 /newroot/root /newroot/root/.ssh
# (A link the root's init left at an earlier boot points into /run: replace it.)
rm -f /newroot/root/.ssh/authorized_keys
echo "$key" | base64 -d > /newroot/root/.ssh/authorized_keys || fail "rift.key is not base64"
chmod 600 /newroot/root/.ssh/authorized_keys

for fs in dev proc sys; do
    mount --move "/$fs" "/newroot/$fs" || fail "cannot move /$fs into the root"
done
exec switch_root /newroot /usr/lib/rift/init
fail "switch_root failed"
