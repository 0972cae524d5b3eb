"""DomainProxy on the host, driven over its Unix socket the way the in-sandbox bridge drives it."""

from __future__ import annotations

import asyncio
import http.client
import socket
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ipybox.sandbox.addresses import is_internal
from ipybox.sandbox.proxy import DomainProxy


@pytest.fixture
async def proxy(tmp_path: Path) -> AsyncIterator[DomainProxy]:
    async with DomainProxy(["localhost", "*.invalid"], denied=["blocked.localhost"]) as proxy:
        await proxy.start(tmp_path / "proxy.sock")
        yield proxy


async def exchange(proxy: DomainProxy, request: bytes, then: bytes = b"") -> bytes:
    assert proxy.unix_socket is not None
    reader, writer = await asyncio.open_unix_connection(proxy.unix_socket)
    writer.write(request)
    if then:
        assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)).startswith(b"HTTP/1.1 200")
        writer.write(then)
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return answer


async def test_socket_is_private(proxy: DomainProxy) -> None:
    assert proxy.unix_socket is not None
    assert stat.S_IMODE(proxy.unix_socket.stat().st_mode) == 0o600


async def test_connect_to_an_allowed_host_tunnels(proxy: DomainProxy, host_http_server: int) -> None:
    tunnel = f"CONNECT localhost:{host_http_server} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode()
    answer = await exchange(proxy, tunnel, then=b"GET /tunnelled HTTP/1.0\r\n\r\n")
    assert b"200" in answer.splitlines()[0] and b"GET /tunnelled" in answer


async def test_plain_http_is_forwarded_one_request_per_connection(
    proxy: DomainProxy, host_http_server: int
) -> None:
    request = (
        f"GET http://localhost:{host_http_server}/page?q=1 HTTP/1.1\r\nHost: localhost\r\n"
        "Proxy-Authorization: Basic c2VjcmV0\r\nProxy-Connection: keep-alive\r\nX-Kept: yes\r\n\r\n"
    ).encode()
    answer = (await exchange(proxy, request)).decode()
    assert answer.startswith("HTTP/1.0 200")
    assert "GET /page?q=1" in answer and "X-Kept: yes" in answer and "Connection: close" in answer
    assert "Proxy-" not in answer  # the proxy's own headers never reach the server


@pytest.mark.parametrize(
    ("request_line", "status", "reason"),
    [
        ("CONNECT example.com:443", b"403", b"example.com is not in network.allowedDomains"),
        ("CONNECT 127.0.0.1:{port}", b"403", b"127.0.0.1 is not in network.allowedDomains"),
        ("CONNECT blocked.localhost:{port}", b"403", b"blocked.localhost is not in network.allowedDomains"),
        ("GET http://example.com/", b"403", b"example.com is not in network.allowedDomains"),
        ("CONNECT nowhere.invalid:443", b"502", b"cannot resolve nowhere.invalid"),
        ("GET https://localhost:{port}/", b"400", b"use CONNECT"),
        ("CONNECT localhost", b"400", b"not an HTTP proxy request"),
    ],
)
async def test_refusals_are_answered_with_the_reason(
    proxy: DomainProxy, host_http_server: int, request_line: str, status: bytes, reason: bytes
) -> None:
    request = f"{request_line.format(port=host_http_server)} HTTP/1.1\r\n\r\n".encode()
    answer = await exchange(proxy, request)
    assert answer.split(b" ")[1] == status and reason in answer


class _UnixProxyConnection(http.client.HTTPSConnection):
    """`http.client` through a proxy on a Unix socket, as the sandbox's bridge hands it connections."""

    def __init__(self, proxy_socket: Path) -> None:
        super().__init__("proxy")
        self.proxy_socket = proxy_socket

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX)
        sock.settimeout(10)
        sock.connect(str(self.proxy_socket))
        self.sock = sock
        self._tunnel()  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("host", "says"),
    [
        ("example.com", "a person allows it by adding it there ([sandbox.network] in ipybox.toml"),
        (
            "blocked.localhost",
            "it is in network.deniedDomains, which wins; a person allows it by removing it",
        ),
    ],
)
async def test_a_python_client_refused_a_tunnel_shows_the_host_and_how_to_allow_it(
    proxy: DomainProxy, host: str, says: str
) -> None:
    # http.client (and so requests, urllib3, pip) reports a refused CONNECT by its status line alone: the
    # reason is all the model gets to read, so it carries the message.
    assert proxy.unix_socket is not None
    connection = _UnixProxyConnection(proxy.unix_socket)
    connection.set_tunnel(host, 443)
    with pytest.raises(OSError) as refused:
        await asyncio.to_thread(connection.connect)
    message = str(refused.value)
    assert message.startswith(f"Tunnel connection failed: 403 Forbidden (ipybox sandbox: {host} is not in")
    assert says in message


def test_internal_addresses() -> None:
    assert all(
        is_internal(a) for a in ("127.0.0.1", "10.1.2.3", "192.168.0.1", "169.254.169.254", "::1", "0.0.0.0")
    )
    assert not any(is_internal(a) for a in ("1.1.1.1", "2606:4700:4700::1111"))


@pytest.mark.parametrize(
    ("answer", "named"),
    [
        ("100.100.100.200", b"100.64.0.0/10 (Shared Address Space)"),
        ("64:ff9b::7f00:1", b"carrying 127.0.0.1"),
        ("2002:a9fe:a9fe::1", b"carrying 169.254.169.254"),
        ("::ffff:10.0.0.1", b"carrying 10.0.0.1"),
    ],
)
async def test_a_wildcard_name_that_resolves_inside_is_refused_with_the_range(
    proxy: DomainProxy, monkeypatch: pytest.MonkeyPatch, answer: str, named: bytes
) -> None:
    # What a name server someone else controls may answer for a name under an allowed wildcard.
    loop = asyncio.get_running_loop()
    real = loop.getaddrinfo

    async def getaddrinfo(host: str, port: int, **kwargs: object) -> object:
        if host == "metadata.invalid":
            family = socket.AF_INET6 if ":" in answer else socket.AF_INET
            return [(family, socket.SOCK_STREAM, 6, "", (answer, port))]
        return await real(host, port, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(loop, "getaddrinfo", getaddrinfo)
    answer_text = await exchange(proxy, b"CONNECT metadata.invalid:80 HTTP/1.1\r\n\r\n")
    assert answer_text.split(b" ")[1] == b"403"
    assert b"resolves to an internal address" in answer_text and named in answer_text


async def test_stop_cuts_open_tunnels(tmp_path: Path, host_http_server: int) -> None:
    proxy = DomainProxy(["localhost"])
    await proxy.start(tmp_path / "proxy.sock")
    reader, writer = await asyncio.open_unix_connection(tmp_path / "proxy.sock")
    writer.write(f"CONNECT localhost:{host_http_server} HTTP/1.1\r\n\r\n".encode())
    assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)).startswith(b"HTTP/1.1 200")
    await proxy.stop()
    assert await asyncio.wait_for(reader.read(), 10) == b""
    assert not (tmp_path / "proxy.sock").exists()
    writer.close()
