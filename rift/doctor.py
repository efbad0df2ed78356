"""`rift doctor`: what works here, and what to do about what does not."""

from __future__ import annotations

from collections.abc import Callable

from rift.config import Settings
from rift.services.lifecycle.guest_kinds import GuestKind, guest_kind, usable

Check = tuple[str, bool, str]


def _database(settings: Settings) -> Check:
    from rift.store.migrate import current_revision, head_revision

    url = settings.resolved_database_url()
    try:
        current = current_revision(url)
    except Exception as exc:
        return ("database", False, f"{url.split('@')[-1]}: {exc}; check RIFT_DATABASE_URL")
    head = head_revision()
    if current != head:
        return ("database", False, f"schema at {current}, code wants {head}; "
                "`rift serve` migrates at start")
    return ("database", True, f"schema at {current}")


def _libvirt(settings: Settings) -> Check:
    from hypervisor import HypervisorError, open_hypervisor

    try:
        hv = open_hypervisor(settings.hypervisor_uri)
        info = hv.info()
        hv.close()
    except HypervisorError as exc:
        return ("libvirt", False, f"{settings.hypervisor_uri}: {exc}; `make run` installs and "
                "starts libvirtd, or set RIFT_HYPERVISOR_URI=test:///default")
    return ("libvirt", True, f"{settings.hypervisor_uri}: {info.driver} driver, "
            f"{info.vcpus} vCPUs, {info.memory_mib} MiB")


def _kind(settings: Settings, image: str) -> GuestKind:
    """The kind of VMs of `image` on the `local` host, as `rift serve` would pick it."""
    from rift.bootstrap import guest_runtime
    from rift.services.absent import no_guests

    return guest_kind(settings.hypervisor_uri, image, guest_runtime(settings, make_dirs=False),
                      no_guests())


def _kvm(settings: Settings) -> Check:
    from rift.bootstrap import Accelerators

    verdict = Accelerators(settings.data_dir / "images").verdict
    return ("kvm", True, _kind(settings, "tiny").accelerator(verdict))


def _images(settings: Settings) -> Check:
    from rift.catalog import DirectoryImages

    kinds = {n: _kind(settings, n) for n in DirectoryImages(settings.data_dir / "images").names()}
    ready = [n for n, kind in kinds.items() if usable(kind)]
    if not ready:
        return ("images", False, "no image is built; rift image build tiny (and debian)")
    lacking: dict[str, list[str]] = {}
    for name in ready:
        missing = kinds[name].missing_tools()
        if missing is not None:
            lacking.setdefault(missing, []).append(name)
    if lacking:
        return ("images", False, "; ".join(f"VMs of {', '.join(names)} cannot start: {why}"
                                           for why, names in lacking.items()))
    return ("images", True, "usable here: " + ", ".join(f"{n} ({kinds[n].label})"
                                                         for n in ready))


def _isolation(settings: Settings) -> Check:
    """Whether this host's firewall keeps guests from its own services (SPEC §13)."""
    import subprocess

    uri = settings.hypervisor_uri
    if _kind(settings, "tiny").ssh_port(lambda: 0) is None:  # no guest behind its domains
        return ("isolation", True, f"{uri} runs no guests")
    if not uri.startswith("qemu:///"):
        return ("isolation", True, f"{uri} is another machine: its hypervisor role loads it")
    try:
        listed = subprocess.run(["nft", "list", "table", "inet", "rift_guests"],  # noqa: S607
                                capture_output=True, text=True, timeout=10, check=False)
        why = ((listed.stderr.strip() or f"nft exit {listed.returncode}")
               if listed.returncode != 0 else "")
    except (OSError, subprocess.TimeoutExpired) as exc:
        why = str(exc)
    if why:
        return ("isolation", False, f"guests would reach this host's own services ({why}); "
                "scripts/libvirt.sh loads hypervisor/guest_isolation.nft")
    proxy_rule = f"tcp dport {settings.egress_proxy_port} accept"
    if settings.egress_proxy_port and proxy_rule not in listed.stdout:
        return ("isolation", False, "guests with an egress allowlist cannot reach the egress "
                f"proxy: the firewall has no `{proxy_rule}` (set RIFT_EGRESS_PROXY_PORT to "
                "hypervisor/guest_isolation.nft's egress_proxy_port, or edit that)")
    return ("isolation", True, "no guest reaches this host's services (nft inet rift_guests); "
            f"allowlisted guests reach only the egress proxy on port "
            f"{settings.egress_proxy_port}")


CHECKS: tuple[Callable[[Settings], Check], ...] = (_database, _libvirt, _kvm, _images,
                                                   _isolation)


def run_doctor(settings: Settings) -> int:
    failed = 0
    for check in CHECKS:
        name, ok, text = check(settings)
        failed += not ok
        print(f"{'ok ' if ok else 'NO '} {name:<9} {text}")
    return 1 if failed else 0
