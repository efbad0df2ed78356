#!/usr/bin/env bash
# Hypervisor hosts that are really elsewhere, on this one machine (issue #16):
#
#   scripts/netns-hosts.sh up N     # host hvN: 10.214.N.2, reached from here at 10.214.N.1
#   scripts/netns-hosts.sh down N
#   scripts/netns-hosts.sh stop N   # kill all of it (a host that lost power), keep its state
#   scripts/netns-hosts.sh start N  # and bring it back
#   scripts/netns-hosts.sh uri N    # the qemu+ssh:// URI the control plane adds it by
#   scripts/netns-hosts.sh net N    # only the network namespace and its veth pair, for a
#                                   # machine of its own to run in (the Ansible test's
#                                   # chroots: tests/ansible); `down N` removes it
#
# Host N is a network namespace (rift-hvN) joined to this machine by a veth pair
# (this end 10.214.N.1/30, the host's 10.214.N.2/30) and, inside it, a mount
# namespace of its own: its own /run (so its own libvirt sockets and pid files),
# /tmp, /var/lib/libvirt, /var/log/libvirt, /var/cache/libvirt and /etc/libvirt
# (a copy of this machine's, but with QEMU as the unprivileged user rift-qemu),
# and /etc/pki/qemu (its own certificates for libvirt's migration TLS: a server
# and a client certificate for 10.214.N.2, signed by a CA all these hosts share,
# made once in $RIFT_HOSTS_CA_DIR, default /var/lib/rift-hosts/ca; this
# machine's /etc/pki/qemu stays an empty folder to mount them on), and so its own
# libvirtd, virtlogd and sshd, and its own firewall table
# (hypervisor/guest_isolation.nft, per network namespace).
# Hosts reach one another (10.214.0.0/16, forwarded by this machine on their
# veth ends only), as live migration needs.
# Its sshd listens on 10.214.N.2:22 only and lets in root with the control
# plane's key ($RIFT_HOSTS_DIR/client_key), so libvirt's qemu+ssh:// and SSH are
# the only ways in: there is no shared loopback and no shared /run/libvirt.
# Programs and images are read from this machine's file system (the host has
# its own copies of what Rift copies there: its /tmp is its own).
#
# Needs root and what scripts/libvirt.sh installs (libvirt, QEMU, nftables,
# tini) and openssh-server. State lives in $RIFT_HOSTS_DIR (default
# /var/lib/rift-hosts); `down` stops every process of the host and removes it.
set -euo pipefail

if [ "$(id -u)" -ne 0 ]; then
  exec sudo -E "$0" "$@"
fi

ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=${RIFT_HOSTS_DIR:-/var/lib/rift-hosts}
CA_DIR=${RIFT_HOSTS_CA_DIR:-/var/lib/rift-hosts/ca}
WAIT_S=${RIFT_HOSTS_WAIT_S:-30}

usage() { echo "usage: $0 up|down|stop|start|uri|net N (N: 1-200)" >&2; exit 2; }
[ $# -eq 2 ] || usage
action=$1 n=$2
[[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 200 ] || usage

ns=rift-hv$n
state=$DIR/hv$n
here=10.214.$n.1
there=10.214.$n.2
outer=rhv${n}o inner=rhv${n}i

say() { echo "netns-hosts: hv$n: $*" >&2; }

uri() {
  echo "qemu+ssh://root@$there/system?keyfile=$DIR/client_key&no_verify=1&no_tty=1"
}

# Every process of the host (libvirtd, virtlogd, sshd, QEMU, tini) killed, as a
# host that loses power; its namespaces and state (its domain definitions) stay.
stop() {
  if ip netns list | grep -qw "$ns"; then
    for pid in $(ip netns pids "$ns"); do kill -9 "$pid" 2>/dev/null || true; done
    for _ in $(seq 50); do [ -z "$(ip netns pids "$ns")" ] && break; sleep 0.1; done
  fi
}

down() {
  stop
  if ip netns list | grep -qw "$ns"; then
    ip netns del "$ns"
  fi
  ip link del "$outer" 2>/dev/null || true
  rm -rf "$state"
}

# The network namespace, joined to this machine by a veth pair; hosts reach one
# another through this machine.
net() {
  ip link del "$outer" 2>/dev/null || true
  if ip netns list | grep -qw "$ns"; then ip netns del "$ns"; fi
  ip netns add "$ns"
  ip link add "$outer" type veth peer name "$inner"
  ip link set "$inner" netns "$ns"
  ip addr add "$here/30" dev "$outer"
  ip link set "$outer" up
  ip -n "$ns" addr add "$there/30" dev "$inner"
  ip -n "$ns" link set "$inner" up
  ip -n "$ns" link set lo up
  # Hosts reach one another through this machine (live migration's streams):
  # forwarding on these veth ends only, not on this machine's other interfaces.
  ip -n "$ns" route add 10.214.0.0/16 via "$here"
  sysctl -qw "net.ipv4.conf.$outer.forwarding=1"
}

# The hosts' CA for migration TLS, made once (kept between runs; under a lock, as
# hosts come up side by side).
ca() {
  mkdir -p "$CA_DIR" && chmod 700 "$CA_DIR"
  (
    flock 9
    if [ ! -f "$CA_DIR/ca-cert.pem" ]; then
      openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=Rift hosts CA" \
        -keyout "$CA_DIR/ca-key.pem" -out "$CA_DIR/ca-cert.pem.new" \
        -addext "basicConstraints=critical,CA:TRUE" \
        -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
      mv "$CA_DIR/ca-cert.pem.new" "$CA_DIR/ca-cert.pem"
    fi
  ) 9>"$CA_DIR/lock"
}

# Host N's certificates for migration TLS, where libvirt looks for them
# (default_tls_x509_cert_dir): `server` for the QEMU that takes a migration,
# `client` for the one that sends it, both for its address, signed by the CA.
# QEMU (rift-qemu) reads the keys: root:rift-qemu 0640.
certs() {
  local pki=$1 role usage
  ca
  rm -rf "$pki" && mkdir -p "$pki"
  cp "$CA_DIR/ca-cert.pem" "$pki/ca-cert.pem"
  for role in server client; do
    usage=$([ "$role" = server ] && echo serverAuth || echo clientAuth)
    openssl req -new -newkey rsa:2048 -nodes -subj "/CN=hv$n" -keyout "$pki/$role-key.pem" \
      -out "$pki/$role.csr" 2>/dev/null
    openssl x509 -req -in "$pki/$role.csr" -CA "$CA_DIR/ca-cert.pem" \
      -CAkey "$CA_DIR/ca-key.pem" -set_serial "0x$(openssl rand -hex 8)" -days 825 \
      -out "$pki/$role-cert.pem" -extfile <(printf '%s\n' \
        "basicConstraints=critical,CA:FALSE" \
        "keyUsage=critical,digitalSignature,keyEncipherment" \
        "extendedKeyUsage=$usage" "subjectAltName=IP:$there,DNS:hv$n") 2>/dev/null
    rm "$pki/$role.csr"
  done
  chown -R root:rift-qemu "$pki"
  chmod 0750 "$pki" && chmod 0644 "$pki"/*-cert.pem && chmod 0640 "$pki"/*-key.pem
}

up() {
  for tool in libvirtd virtlogd /usr/sbin/sshd tini unshare nft ssh-keygen openssl; do
    command -v "$tool" >/dev/null || { say "needs $tool (scripts/libvirt.sh, openssh-server)"; exit 1; }
  done
  down
  mkdir -p "$state" && chmod 700 "$DIR" "$state"
  if [ ! -f "$DIR/client_key" ]; then
    ssh-keygen -q -t ed25519 -N "" -C rift-control-plane -f "$DIR/client_key"
  fi
  ssh-keygen -q -t ed25519 -N "" -f "$state/host_key"
  cp "$DIR/client_key.pub" "$state/authorized_keys"
  cp -a /etc/libvirt "$state/etc-libvirt"
  # QEMU runs as an unprivileged user of its own there (SPEC §15), whatever this
  # machine's qemu.conf says: rift-qemu (no login, no home, no libvirt or SSH
  # rights), in the group rift-guests the firewall knows its sockets by.
  if ! getent group rift-qemu >/dev/null; then groupadd -r rift-qemu; fi
  if ! getent passwd rift-qemu >/dev/null; then
    useradd -r -g rift-qemu -M -d /nonexistent -s /usr/sbin/nologin rift-qemu
  fi
  # in kvm (scripts/libvirt.sh makes /dev/kvm root:kvm 0660): else libvirt probes
  # QEMU's capabilities again at every start, some 7 s each
  if getent group kvm >/dev/null && ! id -nG rift-qemu | grep -qw kvm; then
    usermod -a -G kvm rift-qemu
  fi
  sed -i -e 's/^user = .*/user = "rift-qemu"/' -e 's/^group = .*/group = "rift-guests"/' \
    -e '/^remember_owner = /d' "$state/etc-libvirt/qemu.conf"
  echo "remember_owner = 0" >> "$state/etc-libvirt/qemu.conf"
  # migration TLS with its own certificates, the peer's checked both ways
  sed -i -e '/^\(default\|migrate\)_tls_x509_\(verify\|cert_dir\) = /d' \
    "$state/etc-libvirt/qemu.conf"
  printf '%s\n' 'default_tls_x509_cert_dir = "/etc/pki/qemu"' 'default_tls_x509_verify = 1' \
    'migrate_tls_x509_verify = 1' >> "$state/etc-libvirt/qemu.conf"
  certs "$state/pki-qemu"
  mkdir -p /etc/pki/qemu  # the mount point: empty on this machine
  grep -q '^user = "rift-qemu"$' "$state/etc-libvirt/qemu.conf" \
    || { say "its qemu.conf names no QEMU user (run scripts/libvirt.sh first)"; exit 1; }
  # its own copy: a checkout under /tmp is hidden inside the host (its /tmp is its own)
  cp "$ROOT/hypervisor/guest_isolation.nft" "$state/guest_isolation.nft"
  rm -rf "$state/etc-libvirt/qemu/"*.xml "$state/etc-libvirt/qemu/autostart"
  cat > "$state/sshd_config" <<EOF
ListenAddress $there
Port 22
HostKey $state/host_key
AuthorizedKeysFile $state/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
StrictModes no
UsePAM no
PidFile /run/sshd.pid
AllowTcpForwarding yes
Subsystem sftp internal-sftp
EOF

  net

  # Inside: a mount namespace of its own, then the daemons under tini (a subreaper,
  # so QEMU processes are reaped), sshd in the foreground.
  cat > "$state/start" <<EOF
set -e
mount -t tmpfs -o mode=755 tmpfs /run
mount -t tmpfs -o mode=1777 tmpfs /tmp
for d in /var/lib/libvirt /var/log/libvirt /var/cache/libvirt; do
  mount -t tmpfs -o mode=755 tmpfs "\$d"
done
mount --bind "$state/etc-libvirt" /etc/libvirt
mount --bind "$state/pki-qemu" /etc/pki/qemu
mkdir -p /run/libvirt /run/sshd /var/lib/libvirt/qemu /var/cache/libvirt/qemu
nft -f "$state/guest_isolation.nft"
virtlogd -d
libvirtd -d
exec /usr/sbin/sshd -D -f "$state/sshd_config" -E "$state/sshd.log"
EOF
  start
}

# Its daemons, in a mount namespace of their own (made anew at each start).
start() {
  [ -f "$state/start" ] || { say "not made: $0 up $n"; exit 1; }
  setsid ip netns exec "$ns" unshare --mount --propagation private --fork -- \
    tini -s -- sh "$state/start" </dev/null >>"$state/host.log" 2>&1 &

  deadline=$((SECONDS + WAIT_S))
  until virsh -c "$(uri)" version >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      say "its libvirt did not answer at $(uri) within ${WAIT_S}s; see $state/host.log" >&2
      cat "$state/host.log" >&2 || true
      exit 1
    fi
    sleep 0.2
  done
  say "up at $there ($(virsh -c "$(uri)" version 2>/dev/null | sed -n 's/^Running hypervisor: //p'))"
}

case "$action" in
  up) up ;;
  down) down ;;
  stop) stop ;;
  start) start ;;
  uri) uri ;;
  net) net ;;
  *) usage ;;
esac
