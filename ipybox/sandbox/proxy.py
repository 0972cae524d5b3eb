"""`DomainProxy`: the only way out of a sandbox's network namespace, for the domains the policy allows.

It runs on the host and listens on a Unix socket that is bind-mounted into the sandbox, where a bridge
(`ipybox.sandbox.netbridge`) exposes it as `http://127.0.0.1:PORT` in `HTTP(S)_PROXY`. It speaks the
two forms of HTTP proxying clients use: `CONNECT host:port` (HTTPS, and any TCP protocol a client
tunnels) and absolute-form plain HTTP requests (`GET http://host/path`), one request per connection.

The host name is checked before anything is resolved; the name is then resolved here and the proxy
connects to the address it checked (no second lookup a name server could answer differently). Addresses
that are not globally reachable ([addresses][ipybox.sandbox.addresses]: IANA's special-purpose ranges,
including shared address space and cloud metadata, and IPv6 forms judged by the IPv4 address they carry)
are refused unless the allowed entry names that host exactly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import socket
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Self

from ipybox.sandbox.addresses import internal_reason
from ipybox.sandbox.domains import DomainFilter, normalize_host
from ipybox.sandbox.netbridge import pipe

logger = logging.getLogger(__name__)

_HEAD_LIMIT = 64 * 1024
_CONNECT_TIMEOUT = 15.0
_HOP_BY_HOP = {b"proxy-connection", b"proxy-authorization", b"connection", b"keep-alive"}


class _Refused(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason = status, reason


class DomainProxy:
    """An HTTP proxy on a Unix socket that lets through only connections to allowed domains.

    Args:
        allowed: `network.allowedDomains` entries.
        denied: `network.deniedDomains` entries (they win over allowed ones).

    Example:
        ```python
        async with DomainProxy(["pypi.org", "*.pythonhosted.org"]) as proxy:
            socket_path = await proxy.start()
            ...  # sandboxes with the socket bind-mounted reach exactly those hosts
        ```
    """

    def __init__(self, allowed: list[str], denied: list[str] | None = None) -> None:
        self.hosts = DomainFilter(allowed, denied or [])
        self.unix_socket: Path | None = None
        self._private_dir: Path | None = None
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def start(self, unix_socket: Path | None = None) -> Path:
        """Listen on `unix_socket` (mode 0600; default: in a private directory, removed by `stop()`).

        Returns:
            The socket's path.
        """
        if unix_socket is None:
            self._private_dir = Path(tempfile.mkdtemp(prefix="ipybox-net-"))
            unix_socket = self._private_dir / "proxy.sock"
        self._server = await asyncio.start_unix_server(self._accept, str(unix_socket), limit=_HEAD_LIMIT)
        os.chmod(unix_socket, 0o600)
        self.unix_socket = unix_socket
        return unix_socket

    async def stop(self) -> None:
        """Stop listening and cut every open connection."""
        if self._server is not None:
            self._server.close()
            for task in list(self._connections):
                task.cancel()
            await asyncio.gather(*self._connections, return_exceptions=True)
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None
        if self.unix_socket is not None:
            self.unix_socket.unlink(missing_ok=True)
            self.unix_socket = None
        if self._private_dir is not None:
            shutil.rmtree(self._private_dir, ignore_errors=True)
            self._private_dir = None

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            await self._serve(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            self._connections.discard(task)
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        request_line, _, header_block = head.partition(b"\r\n")
        try:
            method, target, version = request_line.decode("latin-1").split(" ")
            if method == "CONNECT":
                host, port = _split_host_port(target, default_port=None)
            else:
                host, port, path = _parse_absolute_http(target)
            upstream_reader, upstream_writer = await self._open(host, port)
        except _Refused as refused:
            await _answer(writer, refused.status, refused.reason, str(refused))
            return
        except ValueError:
            await _answer(writer, 400, "Bad Request", "not an HTTP proxy request")
            return
        try:
            if method == "CONNECT":
                writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            else:
                upstream_writer.write(_origin_form(method, path, version, header_block))
            await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))
        finally:
            upstream_writer.close()

    async def _open(self, host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        name = normalize_host(host)
        if not self.hosts.allows(name):
            logger.info("sandbox network: refused %s:%d (not in allowedDomains)", name, port)
            raise _Refused(403, "Forbidden", f"ipybox sandbox: {name} is not in network.allowedDomains")
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(name, port, type=socket.SOCK_STREAM)
        except OSError as e:
            raise _Refused(502, "Bad Gateway", f"ipybox sandbox proxy: cannot resolve {name}: {e}") from None
        addresses = [(family, proto, str(info[0]), int(info[1])) for family, _, proto, _, info in infos]
        if not self.hosts.names_exactly(name):
            # One internal address is enough to refuse: a name server may hand out any of them next time.
            internal = next(
                (f"{ip}: {why}" for _, _, ip, _ in addresses if (why := internal_reason(ip)) is not None),
                None,
            )
            if internal is not None:
                logger.warning("sandbox network: refused %s, which resolves to %s", name, internal)
                raise _Refused(
                    403,
                    "Forbidden",
                    f"ipybox sandbox: {name} resolves to an internal address ({internal}); "
                    "list it exactly in allowedDomains",
                )
        errors = []
        for family, proto, ip, ip_port in addresses:
            try:
                return await asyncio.wait_for(
                    asyncio.open_connection(ip, ip_port, family=family, proto=proto), _CONNECT_TIMEOUT
                )
            except (OSError, TimeoutError) as e:
                errors.append(f"{ip}: {e or 'timed out'}")
        raise _Refused(
            502, "Bad Gateway", f"ipybox sandbox proxy: cannot connect to {name}: {'; '.join(errors)}"
        )


def _split_host_port(authority: str, default_port: int | None) -> tuple[str, int]:
    if authority.startswith("["):
        host, _, rest = authority[1:].partition("]")
        port_text = rest.removeprefix(":")
    else:
        host, _, port_text = authority.rpartition(":") if ":" in authority else (authority, "", "")
    if not port_text:
        if default_port is None:
            raise ValueError("CONNECT needs host:port")
        return host, default_port
    port = int(port_text)
    if not 0 < port < 65536:
        raise ValueError("bad port")
    return host, port


def _parse_absolute_http(target: str) -> tuple[str, int, str]:
    if not target.lower().startswith("http://"):
        raise _Refused(400, "Bad Request", "ipybox sandbox proxy: use CONNECT for anything but http:// URLs")
    authority, slash, path = target[len("http://") :].partition("/")
    host, port = _split_host_port(authority, default_port=80)
    return host, port, slash + path or "/"


def _origin_form(method: str, path: str, version: str, header_block: bytes) -> bytes:
    """The request as the origin server expects it, on a connection that closes after the answer (so a
    client cannot send a second request, for another host, down the same connection)."""
    lines = [f"{method} {path} {version}".encode("latin-1")]
    for line in header_block.split(b"\r\n"):
        name = line.partition(b":")[0].strip().lower()
        if line and name not in _HOP_BY_HOP:
            lines.append(line)
    lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n"


async def _answer(writer: asyncio.StreamWriter, status: int, reason: str, message: str) -> None:
    body = (message + "\n").encode()
    head = f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
    writer.write(head.encode() + b"Connection: close\r\n\r\n" + body)
    await writer.drain()
