#!/bin/sh
# /usr/lib/rift/init in the `debian` image's root: the second half of Rift's
# init (PID 1 after the initramfs's /init, debian_init.sh, switch_roots here).
# It mounts what Debian expects, grows the root file system to the overlay's
# size, makes this VM's own SSH host key, starts sshd (keys only, no passwords),
# prints RIFT-HOSTKEY and RIFT-READY on the console and hands PID 1 to a static
# busybox init, which reaps orphans. No systemd, no cloud-init.
# Markers: RIFT-HOSTKEY <key line>, RIFT-READY (sshd listens on :22),
# RIFT-FAILED <why> (it never will).
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root
umask 022
exec </dev/console >/dev/console 2>&1

fail() {
    echo "RIFT-FAILED $*"
    exec /usr/lib/rift/busybox init
}

mkdir -p /dev/pts /dev/shm /run /tmp
mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts /dev/pts
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /dev/shm
mount -t tmpfs -o mode=755,nosuid,nodev tmpfs /run
mkdir -p /run/lock /run/sshd
# root's authorized key lives on tmpfs, linked from ~/.ssh: a pooled VM's hand-over
# rewrites it without waiting on the disk (an in-place rewrite on ext4 can).
mkdir -m 700 /run/rift
mv /root/.ssh/authorized_keys /run/rift/authorized_keys || fail "no authorized key"
ln -s /run/rift/authorized_keys /root/.ssh/authorized_keys
chmod 1777 /tmp
ln -sf /proc/self/fd /dev/fd
ln -sf /proc/self/fd/0 /dev/stdin
ln -sf /proc/self/fd/1 /dev/stdout
ln -sf /proc/self/fd/2 /dev/stderr
# The base disk's file system is small; the overlay is as large as the VM's disk.
resize2fs /dev/vda >/dev/null 2>&1 || echo "rift-init: resize2fs /dev/vda failed"

hostkey=/etc/ssh/ssh_host_ed25519_key
rm -f "$hostkey" "$hostkey.pub"
ssh-keygen -q -t ed25519 -N '' -C root@rift -f "$hostkey" || fail "ssh-keygen failed"
# -r: sshd does not execute itself anew for each connection: that run of the
# dynamic linker costs hundreds of milliseconds under TCG, on every login, and on
# the first after a restore most (only Rift reaches :22, through QEMU).
/usr/sbin/sshd -r || fail "sshd did not start"

# Wait until :22 (0016) listens (state 0A) before saying so.
tries=0
until grep -q ":0016 00000000:0000 0A" /proc/net/tcp /proc/net/tcp6 2>/dev/null; do
    tries=$((tries + 1))
    [ "$tries" -lt 500 ] || fail "sshd does not listen on :22"
    sleep 0.01
done
echo "RIFT-HOSTKEY $(cut -d' ' -f1,2 "$hostkey.pub")"
echo "RIFT-READY"
exec /usr/lib/rift/busybox init
