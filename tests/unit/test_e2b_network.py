"""E2B's network rules as Rift's egress (rift.e2b.network): what each combination of
`allow_internet_access`, `allowOut` and `denyOut` becomes, and what is refused."""

from __future__ import annotations

from typing import Any

import pytest

from rift.domain.errors import InvalidArgument
from rift.e2b.network import NotServed, egress_of

ALL = "0.0.0.0/0"


@pytest.mark.parametrize(("body", "egress"), [
    ({}, None),
    ({"allow_internet_access": True}, None),
    ({"allow_internet_access": False}, "none"),
    ({"network": {"denyOut": [ALL]}}, "none"),
    ({"network": {"denyOut": ["::/0"]}}, "none"),
    ({"network": {"denyOut": [ALL], "allowOut": ["1.1.1.1", "pypi.org"]}},
     {"allow": ["1.1.1.1", "pypi.org"]}),
    ({"allow_internet_access": False, "network": {"allowOut": ["*.github.com"]}},
     {"allow": ["*.github.com"]}),
    ({"network": {"allowOut": ["1.1.1.1"]}}, None),  # nothing denied: all allowed
    ({"network": {"denyOut": ["10.1.2.3"], "allowOut": ["10.0.0.0/8"]}}, None),
    ({"network": {"dnsServers": ["8.8.8.8"], "allowPublicTraffic": False}}, None),
])
def test_rules_become_egress(body: dict[str, Any], egress: object) -> None:
    assert egress_of(body) == egress


@pytest.mark.parametrize(("body", "field"), [
    ({"network": {"denyOut": ["8.8.8.8"]}}, "network.denyOut"),
    ({"network": {"denyOut": ["8.8.8.8", "1.1.1.1"], "allowOut": ["1.1.1.1"]}},
     "network.denyOut"),
    ({"network": {"denyOut": ["example.com"]}}, "network.denyOut"),
    ({"network": {"allowOut": "1.1.1.1"}}, "network.allowOut"),
    ({"network": {"allowout": ["1.1.1.1"]}}, "network"),
    ({"network": ["1.1.1.1"]}, "network"),
    ({"allow_internet_access": "no"}, "allow_internet_access"),
])
def test_what_rift_cannot_keep_is_refused_naming_the_field(body: dict[str, Any],
                                                           field: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        egress_of(body)
    assert refused.value.details["field"] == field


@pytest.mark.parametrize("key", ["rules", "egressProxy"])
def test_transforms_and_socks_proxies_are_not_served(key: str) -> None:
    with pytest.raises(NotServed) as refused:
        egress_of({"network": {key: {"example.com": []}}})
    assert refused.value.status == 501 and key in refused.value.message
