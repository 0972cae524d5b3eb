"""Which addresses the domain proxy treats as internal: IANA's special-purpose ranges, first and last address
of each, and IPv6 forms judged by the IPv4 address they carry."""

from __future__ import annotations

import ipaddress

import pytest

from ipybox.sandbox.addresses import SPECIAL_RANGES, carried_ipv4, internal_reason, is_internal

# (range, whether its first and last addresses are internal): IANA's IPv4 and IPv6 special-purpose
# registries ("Globally Reachable" False -> internal, True -> external), and the ranges they leave out.
# Ranges that carry an IPv4 address start at one carrying 0.0.0.0 and end at one carrying
# 255.255.255.255, both internal.
RANGES = [
    ("0.0.0.0/8", True),
    ("0.0.0.0/32", True),
    ("10.0.0.0/8", True),
    ("100.64.0.0/10", True),
    ("127.0.0.0/8", True),
    ("169.254.0.0/16", True),
    ("172.16.0.0/12", True),
    ("192.0.0.0/24", True),
    ("192.0.0.0/29", True),
    ("192.0.0.8/32", True),
    ("192.0.0.9/32", False),
    ("192.0.0.10/32", False),
    ("192.0.0.170/32", True),
    ("192.0.0.171/32", True),
    ("192.0.2.0/24", True),
    ("192.31.196.0/24", False),
    ("192.52.193.0/24", False),
    ("192.88.99.0/24", True),
    ("192.168.0.0/16", True),
    ("192.175.48.0/24", False),
    ("198.18.0.0/15", True),
    ("198.51.100.0/24", True),
    ("203.0.113.0/24", True),
    ("240.0.0.0/4", True),
    ("255.255.255.255/32", True),
    ("224.0.0.0/4", True),
    ("::1/128", True),
    ("::/128", True),
    ("::ffff:0:0/96", True),
    ("64:ff9b::/96", True),
    ("64:ff9b:1::/48", True),
    ("100::/64", True),
    ("100:0:0:1::/64", True),
    ("2001::/23", True),
    ("2001::/32", True),
    ("2001:1::1/128", False),
    ("2001:1::2/128", False),
    ("2001:1::3/128", False),
    ("2001:2::/48", True),
    ("2001:3::/32", False),
    ("2001:4:112::/48", False),
    ("2001:10::/28", True),
    ("2001:20::/28", False),
    ("2001:30::/28", False),
    ("2001:db8::/32", True),
    ("2002::/16", True),
    ("2620:4f:8000::/48", False),
    ("3fff::/20", True),
    ("5f00::/16", True),
    ("fc00::/7", True),
    ("fe80::/10", True),
    ("::/96", True),
    ("::ffff:0:0:0/96", True),
    ("fec0::/10", True),
    ("ff00::/8", True),
]


def test_the_table_is_the_registries() -> None:
    assert sorted(str(entry.network) for entry in SPECIAL_RANGES) == sorted(
        str(ipaddress.ip_network(cidr)) for cidr, _ in RANGES
    )
    assert all(entry.name for entry in SPECIAL_RANGES)


@pytest.mark.parametrize(("cidr", "internal"), RANGES)
def test_first_and_last_address_of_each_range(cidr: str, internal: bool) -> None:
    network = ipaddress.ip_network(cidr)
    for address in (network[0], network[-1]):
        assert is_internal(address) is internal, address
        assert is_internal(str(address)) is internal, address


@pytest.mark.parametrize(
    ("address", "internal"),
    [
        # the cases
        ("100.100.100.200", True),  # cloud metadata in shared address space
        ("100.63.255.255", False),
        ("100.128.0.0", False),
        ("64:ff9b::100.100.100.200", True),  # NAT64 of it
        ("64:ff9b::7f00:1", True),  # NAT64 of 127.0.0.1
        ("64:ff9b::1.1.1.1", False),  # NAT64 of a public address: where NAT64 is the way out
        ("64:ff9b:1::1.1.1.1", True),  # the local-use NAT64 prefix, whatever it carries
        ("2002:7f00:1::", True),  # 6to4 of 127.0.0.1
        ("2002:6464:64c8::1", True),  # 6to4 of 100.100.100.200
        ("2002:101:101::1", False),  # 6to4 of 1.1.1.1
        ("::ffff:127.0.0.1", True),  # IPv4-mapped
        ("::ffff:100.100.100.200", True),
        ("::ffff:1.1.1.1", False),
        ("::127.0.0.1", True),  # IPv4-compatible
        ("::1.1.1.1", False),
        ("::ffff:0:7f00:1", True),  # IPv4-translated
        ("::ffff:0:101:101", False),
        # Teredo: server 65.54.227.120, client 8.8.8.8 (obfuscated f7f7:f7f7), then client 10.0.0.1
        ("2001:0:4136:e378:8000:63bf:f7f7:f7f7", False),
        ("2001:0:4136:e378:8000:63bf:f5ff:fffe", True),
        ("2001:0:a00:1:8000:63bf:f7f7:f7f7", True),  # server 10.0.0.1
        # ordinary and unallocated addresses
        ("1.1.1.1", False),
        ("8.8.8.8", False),
        ("2606:4700:4700::1111", False),
        ("4000::1", True),  # outside 2000::/3
        ("fe80::1%eth0", True),  # a scoped link-local address, as getaddrinfo may give it
    ],
)
def test_each_address_is_judged_by_where_it_leads(address: str, internal: bool) -> None:
    assert is_internal(address) is internal


def test_the_reason_names_the_range_and_what_an_address_carries() -> None:
    assert internal_reason("100.100.100.200") == "100.64.0.0/10 (Shared Address Space)"
    assert internal_reason("64:ff9b::a9fe:a9fe") == (
        "64:ff9b::/96 (IPv4-IPv6 Translat.) carrying 169.254.169.254: 169.254.0.0/16 (Link Local)"
    )
    assert internal_reason("1.1.1.1") is None


def test_teredo_and_6to4_carry_the_ipv4_addresses_they_embed() -> None:
    teredo = ipaddress.IPv6Address("2001:0:4136:e378:8000:63bf:f7f7:f7f7")
    assert carried_ipv4(teredo) == [ipaddress.IPv4Address("65.54.227.120"), ipaddress.IPv4Address("8.8.8.8")]
    assert carried_ipv4(ipaddress.IPv6Address("2002:101:101::")) == [ipaddress.IPv4Address("1.1.1.1")]
    assert carried_ipv4(ipaddress.IPv6Address("2606:4700:4700::1111")) == []


def test_a_name_is_not_an_address() -> None:
    with pytest.raises(ValueError):
        is_internal("example.com")
