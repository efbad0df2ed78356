"""What egress `open` refuses besides the host (rift.guest.egress_deny): the
networks each host's firewall sets get, and the script that puts them there."""

from __future__ import annotations

import ipaddress
import shutil
import subprocess

import pytest

from rift.config import Settings
from rift.guest.egress_deny import (
    addresses_of,
    database_host,
    nft_script,
    parse_networks,
)


def test_the_operators_cidrs_are_parsed_and_a_bad_one_stops_the_settings() -> None:
    assert parse_networks(" 10.0.0.0/8, 192.0.2.7 ,,fd00::/8") == [
        ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("192.0.2.7/32"),
        ipaddress.ip_network("fd00::/8")]
    assert Settings(egress_deny="10.1.0.0/16").egress_deny == "10.1.0.0/16"
    with pytest.raises(ValueError, match="RIFT_EGRESS_DENY"):
        Settings(egress_deny="10.0.0.0/8,not-a-cidr")


def test_the_database_host_is_the_one_of_a_network_url_only() -> None:
    assert database_host("postgresql+psycopg://rift:pw@db.example:5432/rift") == "db.example"
    assert database_host("postgresql+psycopg://rift@/rift?host=10.0.0.5") == "10.0.0.5"
    assert database_host("postgresql+psycopg://rift@/rift?host=/run/postgresql") is None
    assert database_host("sqlite:////var/lib/rift/rift.db") is None
    assert database_host(None) is None
    assert addresses_of("10.9.8.7") == [ipaddress.ip_address("10.9.8.7")]
    assert addresses_of("/run/postgresql") == addresses_of(None) == []
    assert addresses_of("nowhere.invalid") == []


def test_the_script_flushes_and_fills_every_set_merged_with_the_fixed_entries() -> None:
    script = nft_script(parse_networks("10.0.0.0/8,10.1.2.3,169.254.77.0/24,2001:db8::/32"),
                        parse_networks("10.214.11.2,10.214.12.2"), parse_networks("10.214.12.2"))
    lines = script.splitlines()
    assert lines[:4] == [f"flush set inet rift_guests {name}"
                         for name in ("deny_v4", "deny_v6", "fleet_v4", "fleet_v6")]
    # 10.1.2.3 is in 10.0.0.0/8 and 169.254.77.0/24 in link-local: merged (no overlap)
    assert lines[4] == ("add element inet rift_guests deny_v4 { 10.0.0.0/8, 100.100.100.200/32, "
                        "169.254.0.0/16 }")
    assert lines[5] == ("add element inet rift_guests deny_v6 { 2001:db8::/32, "
                        "fd00:ec2::254/128, fe80::/10 }")
    assert lines[6] == "add element inet rift_guests fleet_v4 { 10.214.11.2/32, 10.214.12.2/32 }"
    # the peer sets (the other hypervisors' migration ports, which QEMU may reach),
    # made first where an older table has none
    assert lines[7:] == [
        "add set inet rift_guests peers_v4 { type ipv4_addr; flags interval; }",
        "flush set inet rift_guests peers_v4",
        "add element inet rift_guests peers_v4 { 10.214.12.2/32 }",
        "add set inet rift_guests peers_v6 { type ipv6_addr; flags interval; }",
        "flush set inet rift_guests peers_v6"]  # no fleet_v6, peers_v6 element: stays empty


@pytest.mark.skipif(shutil.which("nft") is None, reason="no nft here")
def test_the_script_is_what_nft_takes_for_the_table() -> None:
    """Checked by nft itself (-c: parsed and checked against the table, not applied)."""
    listed = subprocess.run(["nft", "list", "table", "inet", "rift_guests"],
                            capture_output=True, text=True, check=False)
    if listed.returncode != 0 or "fleet_v4" not in listed.stdout:
        pytest.skip("the guests' isolation with its deny sets is not loaded here "
                    "(scripts/libvirt.sh)")
    done = subprocess.run(["nft", "-c", "-f", "-"], input=nft_script(
        parse_networks("10.0.0.0/8,2001:db8::/32"), parse_networks("10.214.11.2")),
        capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
