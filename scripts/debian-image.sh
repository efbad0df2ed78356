#!/usr/bin/env bash
# Builds a small Debian bookworm qcow2 from Debian packages only (debootstrap
# from the mirror apt already uses) that `rift image add` takes: a disk that
# boots on its own (an MBR partition table, extlinux), the cloud kernel
# (linux-image-cloud-amd64), openssh-server, and cloud-init reading a NoCloud
# seed (datasource_list: [NoCloud, None]) for root's key. The network comes
# from systemd-networkd (DHCP on the first en* NIC), so cloud-init's own
# network stage is off. SSH host keys are removed: cloud-init makes new ones
# on each VM's first boot. Console on ttyS0.
#
#   scripts/debian-image.sh OUT_DIR      # writes OUT_DIR/debian.qcow2 (+ build.json)
#
# Nothing is downloaded from anywhere but the Debian mirror. Needs root, loop
# devices and mount (the root filesystem is built on a loop device). The .debs
# are kept in OUT_DIR/debs, so a rebuild downloads nothing new. The tests call
# it once and keep the result in var/cache/test-images/debian/.
set -euo pipefail
# shellcheck source=scripts/apt.sh
. "$(dirname "$0")/apt.sh"

if [ "$(id -u)" -ne 0 ]; then
  exec sudo -E "$0" "$@"
fi

OUT=$(realpath -m "${1:?usage: scripts/debian-image.sh OUT_DIR}")
SUITE=${RIFT_DEBIAN_SUITE:-bookworm}
SIZE=${RIFT_DEBIAN_SIZE:-2G}
HOST_PACKAGES=(debootstrap qemu-utils extlinux syslinux-common fdisk e2fsprogs)
# python3-cffi-backend by name: debootstrap does not resolve the virtual packages
# python3-cryptography (a cloud-init dependency) needs.
GUEST_PACKAGES=systemd-sysv,udev,linux-image-cloud-amd64,initramfs-tools,e2fsprogs,openssh-server,cloud-init,python3-cffi-backend,iproute2,netbase

say() { echo "debian-image: $*"; }

# The mirror apt already uses (deb822 `URIs:` or a one-line `deb` entry), else deb.debian.org.
mirror() {
  local found
  found=$(grep -hs -E '^(URIs:|deb )' /etc/apt/sources.list /etc/apt/sources.list.d/*.sources \
            /etc/apt/sources.list.d/*.list \
          | grep -v -- '-security' | grep -Eo 'https?://[^ ]*/debian/?' | head -n 1 || true)
  echo "${found:-http://deb.debian.org/debian}"
}
MIRROR=${RIFT_DEBIAN_MIRROR:-$(mirror)}

ensure_packages debian-image "${HOST_PACKAGES[@]}"

started=$SECONDS
mkdir -p "$OUT/debs"
work=$(mktemp -d "$OUT/.build-XXXXXX")
root="$work/root"
loop=""
cleanup() {
  set +e
  for m in dev/pts dev proc sys; do
    mountpoint -q "$root/$m" && umount -l "$root/$m"
  done
  mountpoint -q "$root" && umount "$root"
  [ -n "$loop" ] && losetup -d "$loop"
  rm -rf "$work"
}
trap cleanup EXIT

# 1. a raw disk: one bootable partition from 1 MiB, ext4 on it (through a loop device)
disk="$work/disk.raw"
truncate -s "$SIZE" "$disk"
printf 'label: dos\nstart=2048, type=83, bootable\n' | sfdisk -q "$disk"
loop=$(losetup -f --show -o 1048576 "$disk")
uuid=$(cat /proc/sys/kernel/random/uuid)
# extlinux reads ext4 without the 64bit feature (not needed at this size anyway)
mkfs.ext4 -q -F -L root -U "$uuid" -O ^64bit "$loop"
mkdir -p "$root"
mount "$loop" "$root"

# 2. the system
say "debootstrap $SUITE from $MIRROR"
debootstrap --variant=minbase --include="$GUEST_PACKAGES" --cache-dir="$OUT/debs" \
  "$SUITE" "$root" "$MIRROR" >"$work/debootstrap.log" 2>&1 \
  || { tail -n 30 "$work/debootstrap.log" >&2
       grep -v '^[IW]: ' "$root/debootstrap/debootstrap.log" 2>/dev/null | tail -n 40 >&2
       exit 1; }

# 3. configuration
cat >"$root/etc/fstab" <<EOF
UUID=$uuid / ext4 errors=remount-ro 0 1
EOF
echo debian >"$root/etc/hostname"
printf '127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n' >"$root/etc/hosts"
cat >"$root/etc/systemd/network/80-rift-dhcp.network" <<'EOF'
[Match]
Name=en* eth*

[Network]
DHCP=ipv4
EOF
cat >"$root/etc/cloud/cloud.cfg.d/90-rift.cfg" <<'EOF'
# Written by Rift's scripts/debian-image.sh: only the NoCloud seed (no probing
# of other clouds), and the network is systemd-networkd's, not cloud-init's.
datasource_list: [NoCloud, None]
network: {config: disabled}
EOF
chroot "$root" systemctl enable systemd-networkd.service >/dev/null 2>&1
rm -f "$root"/etc/ssh/ssh_host_*
: >"$root/etc/machine-id"
rm -f "$root/var/lib/dbus/machine-id"
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* \
       "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/locale/*

# 4. the boot loader: extlinux in /boot/extlinux, syslinux's MBR in the first 440 bytes
kernel=$(cd "$root/boot" && ls vmlinuz-* | sort -V | tail -n 1)
initrd="initrd.img-${kernel#vmlinuz-}"
[ -f "$root/boot/$initrd" ] || { say "no /boot/$initrd in the image" >&2; exit 1; }
mkdir -p "$root/boot/extlinux"
cat >"$root/boot/extlinux/extlinux.conf" <<EOF
DEFAULT debian
PROMPT 0
TIMEOUT 0
LABEL debian
  LINUX /boot/$kernel
  INITRD /boot/$initrd
  APPEND root=UUID=$uuid ro console=ttyS0
EOF
extlinux --install "$root/boot/extlinux" >/dev/null 2>&1
# Give the blocks of deleted files (the .debs above all) back to the raw file as
# holes, so the qcow2 holds only what the image uses.
fstrim "$root" >/dev/null 2>&1 || true
umount "$root"
losetup -d "$loop"
loop=""
dd if=/usr/lib/syslinux/mbr/mbr.bin of="$disk" bs=440 count=1 conv=notrunc status=none

# 5. qcow2
qemu-img convert -O qcow2 "$disk" "$work/debian.qcow2"
mv "$work/debian.qcow2" "$OUT/debian.qcow2"
cat >"$OUT/build.json" <<EOF
{"suite": "$SUITE", "mirror": "$MIRROR", "kernel": "$kernel", "packages": "$GUEST_PACKAGES",
 "built_at": "$(date -u +%Y-%m-%dT%H:%M:%SZ)", "seconds": $((SECONDS - started))}
EOF
say "built $OUT/debian.qcow2 in $((SECONDS - started)) s ($(du -h "$OUT/debian.qcow2" | cut -f1))"
