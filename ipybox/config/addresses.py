"""Network addresses as `ipybox.toml` and the call channel spell them: `HOST:PORT`, `[IPv6]:PORT`, `HOST`."""

from __future__ import annotations

import ipaddress

__all__ = ["format_address", "is_loopback", "is_wildcard", "split_host_port"]


def split_host_port(text: str, what: str) -> tuple[str, int | None]:
    """`HOST:PORT`, `[IPv6]:PORT`, `HOST` or a bare IPv6 address as (host, port or `None`).

    Raises:
        ValueError: Naming `what` and the form expected.
    """
    expected = (
        f"{what} must be HOST:PORT or HOST (e.g. 10.0.0.5:8765, [::1]:8765, tools.example), not {text!r}"
    )
    text = text.strip()
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ValueError(expected)
        port_text: str | None = rest[1:] if rest else None
    elif text.count(":") > 1:  # a bare IPv6 address
        host, port_text = text, None
    else:
        host, colon, port_text = text.partition(":")
        port_text = port_text if colon else None
    if not host or any(c.isspace() or c in "/@?#" for c in host):
        raise ValueError(expected)
    if port_text is None:
        return host, None
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(expected)
    return host, int(port_text)


def is_loopback(host: str) -> bool:
    """`localhost` or a loopback address (`127.0.0.0/8`, `::1`)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_wildcard(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


def format_address(scheme: str, host: str, port: int) -> str:
    """`scheme://host:port`, an IPv6 host in brackets."""
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"
