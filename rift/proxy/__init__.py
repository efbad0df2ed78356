"""The egress proxy (SPEC §13): what a guest with an egress allowlist reaches the
networks through, over HTTP and HTTPS; a door of its own, asking the engine which
rules a connection is under (rift.services.read.egress), never the store.

Such a guest's QEMU runs in the group rift-proxied, and the host's firewall
(hypervisor/guest_isolation.nft) refuses every connection of that group's but
the one to this proxy on the host's loopback (which the guest names as
10.0.2.2:<port>, in its http_proxy and https_proxy). So the guest reaches no
address directly and no DNS server (raw connects and DNS are refused and
counted by the firewall); the proxy resolves the names it allows itself.

Its parts: `server` (the listener: per connection, refuse or forward), `guests`
(which VM a connection comes from, read off /proc), `tunnel` (what a CONNECT
tunnel must open with), `hello` (a TLS ClientHello and its server name),
`heads` (HTTP request heads), `upstream` (where an allowed host is, connecting,
copying), `refusals` (the reasons, counted) and `firewall` (the host firewall's
own counters).
"""
