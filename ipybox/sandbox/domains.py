"""`DomainFilter`: which hosts a sandbox may reach, from `network.allowedDomains`/`deniedDomains`.

Entries are host names (`pypi.org`), wildcards for subdomains (`*.pythonhosted.org`, which does not
match `pythonhosted.org` itself), or IP addresses. Denied entries win over allowed ones.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable

_LABEL = re.compile(r"^[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?$")


def normalize_host(host: str) -> str:
    """Lower case, no trailing dot, no IPv6 brackets."""
    return host.strip().lower().rstrip(".").removeprefix("[").removesuffix("]")


def domain_entry_error(entry: str) -> str | None:
    """Why `entry` is not a valid allowed/denied domain entry (None when it is)."""
    host = normalize_host(entry.removeprefix("*."))
    try:
        ipaddress.ip_address(host)
        return None if not entry.startswith("*.") else f"{entry!r}: a wildcard needs a domain, not an address"
    except ValueError:
        pass
    if "/" in entry or ":" in entry:
        return f"{entry!r} must be a host name like 'pypi.org' or '*.pypi.org', without scheme, port or path"
    labels = host.split(".")
    if not host or not all(_LABEL.match(label) for label in labels):
        return f"{entry!r} is not a valid host name (e.g. 'pypi.org' or '*.pypi.org')"
    return None


class DomainFilter:
    """Decides whether a host may be reached.

    Args:
        allowed: Allowed entries (nothing is reachable when empty).
        denied: Denied entries, checked first.

    Example:
        ```python
        hosts = DomainFilter(["pypi.org", "*.pythonhosted.org"])
        assert hosts.allows("files.pythonhosted.org") and not hosts.allows("example.com")
        ```
    """

    def __init__(self, allowed: Iterable[str], denied: Iterable[str] = ()) -> None:
        self._allowed = [normalize_host(entry) for entry in allowed]
        self._denied = [normalize_host(entry) for entry in denied]

    def allows(self, host: str) -> bool:
        """Whether `host` matches an allowed entry and no denied one."""
        host = normalize_host(host)
        return _matches(host, self._allowed) and not _matches(host, self._denied)

    def names_exactly(self, host: str) -> bool:
        """Whether an allowed entry is `host` itself, not a wildcard that happens to cover it.

        Only such hosts may resolve to loopback or private addresses: a wildcard must not let a name
        someone else controls point the sandbox at services on the host or the local network.
        """
        return normalize_host(host) in self._allowed


def covers(outer: str, inner: str) -> bool:
    """Whether every host the entry `inner` matches is one the entry `outer` matches: the same entry, or
    a wildcard `*.x` over a host or a wildcard below `x` (`*.x` does not match `x` itself).

    Example:
        ```python
        assert covers("*.github.com", "api.github.com") and covers("*.github.com", "*.api.github.com")
        assert not covers("*.github.com", "github.com") and not covers("api.github.com", "*.github.com")
        ```
    """
    outer, inner = normalize_host(outer), normalize_host(inner)
    return outer == inner or (outer.startswith("*.") and inner.endswith(outer[1:]))


def _matches(host: str, entries: list[str]) -> bool:
    for entry in entries:
        if entry.startswith("*."):
            if host.endswith(entry[1:]):
                return True
        elif host == entry:
            return True
    return False
