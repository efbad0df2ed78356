"""One settings class: every `RIFT_*` variable, each with a description
(a test checks that the README documents each one)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RIFT_", extra="ignore")

    data_dir: Path = Field(default=Path("./var"),
        description="Where the database, images and keys live.")
    database_url: str | None = Field(
        default=None, description="SQLAlchemy URL; default SQLite `rift.db` in the data dir; "
        "`postgresql+psycopg://…` for several replicas.")
    hypervisor_uri: str = Field(
        default="qemu:///system", description="libvirt URI of the `local` host "
        "(`test:///default` runs with libvirt's test driver: no guests).")
    host_vcpus: int | None = Field(
        default=None, description="vCPUs the `local` host offers; default what libvirt reports.")
    host_memory_mib: int | None = Field(
        default=None, description="Memory (MiB) the `local` host offers; default from libvirt.")
    cpu_overcommit: float = Field(
        default=4.0, ge=1.0, le=64.0, description="vCPUs offered per host CPU when a host's "
        "size comes from libvirt (idle guests use about 0.2% of a core).")
    activity_step_s: int = Field(
        default=60, ge=1, description="Any call under a good handle is activity; the stored clock "
        "moves at most once per this many seconds.")
    lease_quiet_s: int = Field(
        default=1800, ge=1, description="A lease quiet this long is attached without `takeover`.")
    task_idle_s: int = Field(
        default=14400, ge=1, description="A task quiet this long closes itself (reason `idle`).")
    task_sleep_s: int = Field(
        default=900, ge=0, le=7 * 24 * 3600, description="A task quiet this long (no call "
        "under its handle) puts its running VMs to sleep: memory saved, domain stopped, "
        "only their disk counted against the host; the next call that needs one wakes it "
        "(`sleep_after_s` on rift_task_new overrides it per task). 0: never.")
    sweep_interval_s: int = Field(
        default=60, ge=1, description="How often the sweep closes idle tasks and reconciles hosts.")
    host_lost_s: int = Field(
        default=600, ge=1, description="How long a host may stay unreachable before its VMs "
        "are `failed` (host lost) and its capacity is no longer counted; if it comes back, "
        "reconciliation destroys their domains.")
    stats_interval_s: int = Field(
        default=10, ge=0, le=3600, description="How often what running VMs use (their "
        "`stats`: CPU, memory, disk; the guest's network counters at most once a sweep "
        "interval) is sampled. 0: never.")
    closed_retention_s: int = Field(
        default=30 * 24 * 3600, ge=0, description="How long a closed task stays readable.")
    max_open_tasks: int = Field(default=32, ge=1, description="Open tasks per user.")
    max_vms_per_task: int = Field(default=16, ge=1, description="Live VMs per task.")
    max_snapshots_per_task: int = Field(default=8, ge=0, le=1024,
        description="Snapshots per task (rift_vm_snapshot, and a fork of a running VM).")
    console_log_mib: int = Field(default=4, ge=1, le=1024, description=(
        "The most a guest's serial console log keeps, in MiB: past it the log loses "
        "its oldest bytes (checked each second here, every 10 s on hosts elsewhere)."))
    max_disk_gib_per_user: int = Field(default=200, ge=1, description=(
        "Disk per user in GiB: VM overlays as measured, paused VMs' memory, snapshots; "
        "at or past it a new VM, fork, snapshot or pause is refused (quota_exceeded)."))
    host_disk_reserve_gib: int = Field(default=4, ge=0, description=(
        "Disk in GiB each host keeps free: a host with less (as last sampled, every "
        "RIFT_STATS_INTERVAL_S) takes no new VM, snapshot or pause (quota_exceeded)."))
    vm_cpu_weight: int = Field(default=512, ge=0, le=262144, description=(
        "Each guest's share of the CPU against the other guests when they are busy "
        "(libvirt's `<cputune><shares>`, within the guests' group, which weighs little "
        "against the host's own processes); 0: libvirt's default."))
    vm_cpu_quota: float = Field(default=0, ge=0, le=1, description=(
        "The fraction of one core each vCPU of a guest may use (libvirt's `<cputune>` "
        "quota per 100 ms; under TCG the guest's code runs on its vCPU threads); QEMU's "
        "other threads may use one core in all. 0 (the default): no cap, the weight "
        "alone shares a busy host; a cap slows every guest even on an idle host (0.5 "
        "halves a boot's speed). Hosts whose libvirt has no cpu cgroup (qemu.conf's "
        "`cgroup_controllers`) start guests without limits."))
    rate_task_new_per_h: int = Field(default=120, ge=1,
        description="Task creations per user per hour.")
    rate_vm_new_per_h: int = Field(default=240, ge=1, description="VM creations per user per hour.")
    rate_exec_new_per_h: int = Field(
        default=3600, ge=1, description="Exec starts (`rift_vm_exec`) per user per hour; "
        "beyond it `rate_limited`.")
    rate_stale_per_h: int = Field(
        default=120, ge=1, description="Stale-handle refusals that leave a `stale_rejected` "
        "event, per task per hour; beyond it a stale handle is refused `rate_limited` and "
        "writes nothing.")
    max_waiting_per_user: int = Field(
        default=32, ge=1, le=4096, description="Calls of one user that may wait at once on a "
        "replica (exec waits, long polls, SSE streams, listens, MCP tasks working, live "
        "pages); beyond it `rate_limited`. They run on threads of their own, never the "
        "ones short calls use.")
    login_concurrency: int = Field(
        default=4, ge=1, le=256, description="Password (argon2) checks that run at once in "
        "the process; a login beyond them is answered 429 at once.")
    session_ttl_s: int = Field(
        default=43200, ge=60, description="How long a Boxes page login lasts (the session "
        "cookie's and the stored session's expiry); logging out ends it at once.")
    live_poll_s: float = Field(
        default=1.0, ge=0.1, le=60, description="How often each open Boxes page's live stream "
        "polls the store's change counter (one indexed query per tick).")
    vm_boot_timeout_s: int = Field(
        default=120, ge=5, le=3600, description="How long `rift_vm_new` waits for a real "
        "guest to answer SSH before the VM is `failed`.")
    vm_creating_grace_s: int = Field(
        default=600, ge=1, description="How old a VM row still `creating` must be before "
        "reconciliation takes it for a create its process never finished (a crash): the "
        "row turns `failed` and its domain is destroyed. Must exceed "
        "`RIFT_VM_BOOT_TIMEOUT_S`.")
    exec_wait_s: int = Field(
        default=45, ge=0, le=600, description="How long `rift_vm_exec` waits for a "
        "command's end before it answers with the exec still `running` (below the 60 s "
        "some clients allow a call).")
    helper_slack_s: float = Field(
        default=15.0, ge=1, le=600, description="How long past its own wait a call to a "
        "guest's exec helper (starting, reading, writing to or killing an exec) may take "
        "for its SSH channel and process before it fails `guest_unreachable`: what a guest "
        "that stalls its helper costs that call, and no other.")
    exec_output_mib: int = Field(
        default=16, ge=1, le=1024, description="How much of each stream of an exec the "
        "guest keeps (the newest bytes); a read from before starts at the oldest kept.")
    build_ready_s: int = Field(
        default=60, ge=1, le=3600, description="How long a recipe's CMD has, once started, "
        "for each EXPOSEd port to answer before the build fails (`build_failed`).")
    build_context_mib: int = Field(
        default=10, ge=1, le=10, description="The largest build context (a recipe's COPY "
        "sources) a build takes from any door (`rift image build --context DIR`, "
        "`POST /api/v1/images`' tar, the E2B door's uploads); larger is refused. "
        "At most 10: REST's tar travels base64 in a JSON body of at most 16 MiB.")
    default_image: str = Field(
        default="debian", min_length=1, max_length=200, description="The image of a "
        "`rift_vm_new` that names none; one not known or not built is refused like naming "
        "it (`image_not_found`).")
    default_pool: str = Field(
        default="", pattern=r"^$|^[a-z0-9][a-z0-9._-]{0,62}:[0-9]{1,3}:[0-9]{1,3}$",
        description="`IMAGE:RUNNING:SAVED`: a pool `rift serve` makes at start when that "
        "image has none, so a first `rift_vm_new` is a hand-out (`make run` sets "
        "`debian:1:2`); empty: none. A pool an operator set is left as it is.")
    default_egress: Literal["open", "none"] = Field(
        default="open", description="The `egress` of a `rift_vm_new` that names none: "
        "`open` (the networks beyond the host) or `none` (nothing off the VM).")
    egress_proxy_port: int = Field(
        default=3128, ge=0, le=65535, description="The port on this host's loopback where "
        "Rift's egress proxy serves guests with an egress allowlist (they name it as "
        "`10.0.2.2:<port>`); the host firewall (hypervisor/guest_isolation.nft) lets them "
        "reach this port and nothing else, so the two must agree. 0: no proxy (such guests "
        "reach nothing). Served only when the hypervisor is a real one (not `test:///`).")
    egress_deny: str = Field(
        default="", max_length=4000, description="Comma-separated CIDRs (or addresses) no "
        "guest reaches, besides what egress `open` always refuses (link-local, the cloud "
        "metadata addresses, Rift's own hosts and database): the host firewall refuses "
        "`open` guests' connections there and the egress proxy allowlisted ones'.")
    header_timeout_s: float = Field(
        default=10.0, gt=0, le=3600, description="How long a connection may take to send a "
        "request's line and headers (counted from its opening, or from its previous answer); "
        "then it is closed, with a 408 if part of a head came.")
    body_timeout_s: float = Field(
        default=60.0, gt=0, le=3600, description="How long a request's whole body may take to "
        "arrive once the server reads it; then the request is refused with 408.")
    public_url: str | None = Field(
        default=None, description="The URL people and agents reach Rift at (e.g. "
        "`https://rift.example.com`); its host is one Rift answers to (DNS rebinding "
        "protection), and an https one makes the session cookie `Secure`.")
    preview_domain: str | None = Field(
        default=None, pattern=r"^([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9]([a-z0-9-]{0,61}"
        r"[a-z0-9])?$", description="A domain whose subdomains reach exposures (SPEC §13): "
        "`rift_vm_expose` then answers `https://<secret>.<domain>/`, and a request whose "
        "`Host` is such a name goes to that exposure (a wildcard DNS record and certificate "
        "for `*.<domain>` point at Rift, or at a proxy in front of it). Unset: exposures are "
        "reached at `RIFT_PUBLIC_URL/x/<secret>/`.")
    e2b_public_ports: bool = Field(
        default=False, description="Whether an E2B sandbox made with "
        "`network.allowPublicTraffic` (E2B's default) has its ports reached at "
        "`<port>-<sandbox id>.<RIFT_PREVIEW_DOMAIN>` without its `trafficAccessToken` "
        "(header `e2b-traffic-access-token`); off: every such request needs the token.")
    tls_cert: Path | None = Field(
        default=None, description="A PEM certificate (with its chain) `rift serve` "
        "answers TLS with, on its one port (then https only); for E2B's `get_host` "
        "URLs it names `*.<RIFT_PREVIEW_DOMAIN>` too. Needs RIFT_TLS_KEY.")
    tls_key: Path | None = Field(
        default=None, description="The PEM private key of RIFT_TLS_CERT.")
    allowed_hosts: str | None = Field(
        default=None, description="Comma-separated `Host` values every door answers "
        "(`name`, `name:port`, `name:*` for any port; `*` turns the check off); default: the "
        "loopback names, the address `rift serve` listens on (on `0.0.0.0`, this machine's "
        "host names) and `RIFT_PUBLIC_URL`'s host. Others get 421 (an `Origin` of another "
        "site: 403).")
    guest_ca_file: Path | None = Field(
        default=None, description="A PEM file of certificate authorities (one or more, "
        "as a system bundle has them) every guest trusts besides its own: added to its "
        "system bundle and `/usr/local/share/ca-certificates/` once its first login "
        "succeeds (and a pooled VM's, a fork's at its start), for networks behind a "
        "TLS-inspecting proxy. `rift serve` refuses a missing file or one with no PEM "
        "certificate. Unset: guests keep their own.")
    log_level: str = Field(default="INFO", description="Log level of the JSON logs on stderr.")

    @model_validator(mode="after")
    def _grace_outlasts_boot(self) -> Settings:
        if self.vm_creating_grace_s <= self.vm_boot_timeout_s:
            raise ValueError(
                f"RIFT_VM_CREATING_GRACE_S ({self.vm_creating_grace_s}) must exceed "
                f"RIFT_VM_BOOT_TIMEOUT_S ({self.vm_boot_timeout_s}): else reconciliation "
                "fails VMs that are still booting")
        return self

    @model_validator(mode="after")
    def _egress_deny_is_cidrs(self) -> Settings:
        import ipaddress

        for entry in filter(None, (e.strip() for e in self.egress_deny.split(","))):
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise ValueError(f"RIFT_EGRESS_DENY: {entry!r} is not a CIDR (such as "
                                 "10.0.0.0/8) or an address") from None
        return self

    @model_validator(mode="after")
    def _tls_is_a_pair(self) -> Settings:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("RIFT_TLS_CERT and RIFT_TLS_KEY go together: set both or neither")
        return self

    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        self.data_dir.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{(self.data_dir / 'rift.db').resolve()}"
