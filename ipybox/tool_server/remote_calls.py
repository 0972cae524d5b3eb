"""`RemoteCalls`: the call channel's TCP listener with TLS, for kernels that reach the host over a network.

A remote kernel (a gateway's, on another machine or in a cluster) shares no file with the host: it
dials `tls://HOST:PORT` and pins the listener's certificate. Two addresses, because inside a cluster
they differ: `bind`, where the listener listens on this machine, and `advertise`, what kernels dial (a
Service name, a node's address, a forwarded port).

Nothing listens beyond loopback unless a `RemoteCalls` says so, and a `RemoteCalls` always has a
certificate: the call channel has no plain-TCP listener beyond loopback, so none can be configured.
"""

from __future__ import annotations

from dataclasses import dataclass

from ipybox.config.addresses import format_address, is_loopback, is_wildcard, split_host_port
from ipybox.tool_server.tls import ChannelCertificate

__all__ = ["RemoteCalls", "format_address", "is_loopback", "split_host_port"]


@dataclass(frozen=True, kw_only=True)
class RemoteCalls:
    """Where, and with which certificate, the call channel listens for remote kernels.

    Attributes:
        certificate: What the TLS listener presents and kernels pin (`workspace_certificate` or
            `load_certificate` of `ipybox.tool_server.tls`). Required: there is no plain-TCP mode.
        bind: `HOST:PORT` to listen on (port 0: a free one); default `127.0.0.1:0`, loopback only.
        advertise: `HOST` or `HOST:PORT` kernels dial; default the bind host and the bound port.
            Required when `bind` is a wildcard (`0.0.0.0`, `::`), which is no address to dial.

    Raises:
        ValueError: No certificate, an address that is not `HOST:PORT`, or a wildcard bind with nothing
            to advertise.
    """

    certificate: ChannelCertificate
    bind: str = "127.0.0.1:0"
    advertise: str | None = None

    def __post_init__(self) -> None:
        host, port = split_host_port(self.bind, "RemoteCalls.bind")
        if port is None:
            raise ValueError(
                f"RemoteCalls.bind must name a port (HOST:PORT, 0 for a free one), not {self.bind!r}"
            )
        if not isinstance(self.certificate, ChannelCertificate):
            where = "on loopback" if is_loopback(host) else f"on {host}, beyond loopback,"
            raise ValueError(
                f"RemoteCalls(bind={self.bind!r}) needs a certificate: the call channel listens {where} only "
                "with TLS, it has no plain-TCP mode; pass certificate=workspace_certificate(<state dir>/tls, "
                "<advertised host>) or load_certificate(<cert file>, <key file>) (ipybox.tool_server.tls)"
            )
        if self.advertise is not None:
            split_host_port(self.advertise, "RemoteCalls.advertise")
        elif is_wildcard(host):
            raise ValueError(
                f"RemoteCalls(bind={self.bind!r}) listens on every interface: say which address kernels "
                "dial with advertise='HOST[:PORT]'"
            )

    @property
    def bind_host(self) -> str:
        return split_host_port(self.bind, "bind")[0]

    @property
    def bind_port(self) -> int:
        return split_host_port(self.bind, "bind")[1] or 0

    @property
    def advertise_host(self) -> str:
        """The host kernels dial: `advertise`'s, else the bind host."""
        return split_host_port(self.advertise, "advertise")[0] if self.advertise else self.bind_host

    @property
    def advertise_port(self) -> int | None:
        """The port kernels dial, when `advertise` names one (else: the bound port)."""
        return split_host_port(self.advertise, "advertise")[1] if self.advertise else None
