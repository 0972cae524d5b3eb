"""Which IP addresses the domain proxy treats as internal: every one that is not globally reachable.

The table below is IANA's IPv4 and IPv6 Special-Purpose Address Registries (RFC 6890 and its updates,
as of 2025), each range with its registry name, plus the ranges those registries leave to others that a
proxy must not connect to either (multicast, deprecated site-local IPv6, the IPv4-compatible and
IPv4-translated forms). Ranges marked globally reachable there (anycast services such as AS112 or AMT)
stay external. The most specific range that holds an address decides (`192.0.0.9/32` is reachable inside
the internal `192.0.0.0/24`).

Why not `ipaddress`'s `is_private`/`is_global`: on Python 3.11 (measured, 3.11.7) they call
`100.64.0.0/10` (shared address space, where cloud providers put metadata services such as
`100.100.100.200`) neither private nor global, so a check built from `is_private`, `is_loopback` and
`is_link_local` let it through; they call `64:ff9b::7f00:1` (NAT64 of 127.0.0.1), `2002:7f00:1::` (6to4 of
it), `::127.0.0.1` and `::ffff:0:7f00:1` not private, though the connection ends at the IPv4 address they
carry; and `64:ff9b:1::/48` and `fec0::/10` not private either.

Addresses that carry an IPv4 address are judged by it: IPv4-mapped `::ffff:a.b.c.d`, IPv4-compatible
`::a.b.c.d`, IPv4-translated `::ffff:0:a.b.c.d`, NAT64 `64:ff9b::a.b.c.d`, 6to4 `2002:AABB:CCDD::/48` and
Teredo `2001:0:SSSS:SSSS::` (server and client address: internal if either is). IPv6 outside the global
unicast space `2000::/3` that the table does not name is unallocated, hence internal.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Literal

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

Reach = Literal["internal", "global", "carries-ipv4"]
"""`internal`: not globally reachable. `global`: reachable (an exception inside an internal range).
`carries-ipv4`: judged by the IPv4 address it embeds."""


@dataclass(frozen=True, slots=True)
class SpecialRange:
    """One range of the table.

    Attributes:
        network: The range.
        name: Its name in the IANA registry (or the RFC that defines it).
        reach: How an address in it is judged (see `Reach`).
    """

    network: IPNetwork
    name: str
    reach: Reach


def _ranges(rows: list[tuple[str, str, Reach]]) -> tuple[SpecialRange, ...]:
    return tuple(SpecialRange(ipaddress.ip_network(cidr), name, reach) for cidr, name, reach in rows)


SPECIAL_RANGES: tuple[SpecialRange, ...] = _ranges(
    [
        # IPv4 Special-Purpose Address Registry
        ("0.0.0.0/8", '"This network"', "internal"),
        ("0.0.0.0/32", '"This host on this network"', "internal"),
        ("10.0.0.0/8", "Private-Use", "internal"),
        ("100.64.0.0/10", "Shared Address Space", "internal"),
        ("127.0.0.0/8", "Loopback", "internal"),
        ("169.254.0.0/16", "Link Local", "internal"),
        ("172.16.0.0/12", "Private-Use", "internal"),
        ("192.0.0.0/24", "IETF Protocol Assignments", "internal"),
        ("192.0.0.0/29", "IPv4 Service Continuity Prefix", "internal"),
        ("192.0.0.8/32", "IPv4 dummy address", "internal"),
        ("192.0.0.9/32", "Port Control Protocol Anycast", "global"),
        ("192.0.0.10/32", "Traversal Using Relays around NAT Anycast", "global"),
        ("192.0.0.170/32", "NAT64/DNS64 Discovery", "internal"),
        ("192.0.0.171/32", "NAT64/DNS64 Discovery", "internal"),
        ("192.0.2.0/24", "Documentation (TEST-NET-1)", "internal"),
        ("192.31.196.0/24", "AS112-v4", "global"),
        ("192.52.193.0/24", "AMT", "global"),
        ("192.88.99.0/24", "Deprecated (6to4 Relay Anycast)", "internal"),
        ("192.168.0.0/16", "Private-Use", "internal"),
        ("192.175.48.0/24", "Direct Delegation AS112 Service", "global"),
        ("198.18.0.0/15", "Benchmarking", "internal"),
        ("198.51.100.0/24", "Documentation (TEST-NET-2)", "internal"),
        ("203.0.113.0/24", "Documentation (TEST-NET-3)", "internal"),
        ("240.0.0.0/4", "Reserved", "internal"),
        ("255.255.255.255/32", "Limited Broadcast", "internal"),
        # Not in that registry: multicast has a registry of its own, and is no place to connect to.
        ("224.0.0.0/4", "Multicast (RFC 5771)", "internal"),
        # IPv6 Special-Purpose Address Registry
        ("::1/128", "Loopback Address", "internal"),
        ("::/128", "Unspecified Address", "internal"),
        ("::ffff:0:0/96", "IPv4-mapped Address", "carries-ipv4"),
        ("64:ff9b::/96", "IPv4-IPv6 Translat.", "carries-ipv4"),
        ("64:ff9b:1::/48", "IPv4-IPv6 Translat. (local use)", "internal"),
        ("100::/64", "Discard-Only Address Block", "internal"),
        ("100:0:0:1::/64", "Dummy IPv6 Prefix", "internal"),
        ("2001::/23", "IETF Protocol Assignments", "internal"),
        ("2001::/32", "TEREDO", "carries-ipv4"),
        ("2001:1::1/128", "Port Control Protocol Anycast", "global"),
        ("2001:1::2/128", "Traversal Using Relays around NAT Anycast", "global"),
        ("2001:1::3/128", "DNS-SD Service Registration Protocol Anycast", "global"),
        ("2001:2::/48", "Benchmarking", "internal"),
        ("2001:3::/32", "AMT", "global"),
        ("2001:4:112::/48", "AS112-v6", "global"),
        ("2001:10::/28", "Deprecated (previously ORCHID)", "internal"),
        ("2001:20::/28", "ORCHIDv2", "global"),
        ("2001:30::/28", "Drone Remote ID Protocol Entity Tags (DETs) Prefix", "global"),
        ("2001:db8::/32", "Documentation", "internal"),
        ("2002::/16", "6to4", "carries-ipv4"),
        ("2620:4f:8000::/48", "Direct Delegation AS112 Service", "global"),
        ("3fff::/20", "Documentation", "internal"),
        ("5f00::/16", "Segment Routing (SRv6) SIDs", "internal"),
        ("fc00::/7", "Unique-Local", "internal"),
        ("fe80::/10", "Link-Local Unicast", "internal"),
        # Not in that registry: deprecated forms that still reach an IPv4 host or a local network.
        ("::/96", "IPv4-compatible Address (deprecated, RFC 4291)", "carries-ipv4"),
        ("::ffff:0:0:0/96", "IPv4-translated Address (RFC 2765)", "carries-ipv4"),
        ("fec0::/10", "Site-Local (deprecated, RFC 3879)", "internal"),
        ("ff00::/8", "Multicast (RFC 4291)", "internal"),
    ]
)

# The IPv6 space IANA allocates global unicast from; the rest is reserved by the IETF.
_GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")
# Most specific first: the first range that holds an address decides.
_BY_SPECIFICITY = sorted(SPECIAL_RANGES, key=lambda entry: entry.network.prefixlen, reverse=True)


def special_range(address: IPAddress) -> SpecialRange | None:
    """The most specific range of `SPECIAL_RANGES` holding `address` (`None`: an ordinary address)."""
    for entry in _BY_SPECIFICITY:
        if entry.network.version == address.version and address in entry.network:
            return entry
    return None


def carried_ipv4(address: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address of a `carries-ipv4` range stands for (none for other ones)."""
    entry = special_range(address)
    if entry is None or entry.reach != "carries-ipv4":
        return []
    if entry.network == ipaddress.IPv6Network("2001::/32"):
        teredo = address.teredo
        assert teredo is not None
        return list(teredo)  # (server, client), the client's address un-obfuscated
    if entry.network == ipaddress.IPv6Network("2002::/16"):
        sixtofour = address.sixtofour
        assert sixtofour is not None
        return [sixtofour]
    # The mapped, compatible, translated and NAT64 forms all keep the IPv4 address in the last 32 bits.
    return [ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)]


def internal_reason(address: str | IPAddress) -> str | None:
    """Why the proxy must not connect to `address` (an address, an IPv6 one possibly with `%scope`), as
    `"<range> (<name>)"`; `None` when it is globally reachable.

    Raises:
        ValueError: `address` is not an IP address.
    """
    ip = ipaddress.ip_address(address.split("%")[0]) if isinstance(address, str) else address
    entry = special_range(ip)
    if entry is None:
        if isinstance(ip, ipaddress.IPv6Address) and ip not in _GLOBAL_UNICAST:
            return "outside 2000::/3 (not allocated for global unicast)"
        return None
    if entry.reach == "global":
        return None
    where = f"{entry.network} ({entry.name})"
    if entry.reach == "internal":
        return where
    assert isinstance(ip, ipaddress.IPv6Address)
    for carried in carried_ipv4(ip):
        reason = internal_reason(carried)
        if reason is not None:
            return f"{where} carrying {carried}: {reason}"
    return None


def is_internal(address: str | IPAddress) -> bool:
    """Whether `address` is not globally reachable (see the module docstring)."""
    return internal_reason(address) is not None
