"""`DomainProxy.update`: a new network policy for new connections, open ones keep theirs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ipybox.sandbox.interception import InterceptionCA
from ipybox.sandbox.policy import DomainRule
from ipybox.sandbox.proxy import DomainProxy


@pytest.fixture
async def proxy(tmp_path: Path) -> AsyncIterator[DomainProxy]:
    async with DomainProxy(["localhost"]) as proxy:
        await proxy.start(tmp_path / "proxy.sock")
        yield proxy


async def get(proxy: DomainProxy, port: int, path: str = "/") -> bytes:
    assert proxy.unix_socket is not None
    reader, writer = await asyncio.open_unix_connection(proxy.unix_socket)
    writer.write(f"GET http://localhost:{port}{path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return answer


async def test_new_connections_get_the_new_policy(proxy: DomainProxy, host_http_server: int) -> None:
    assert (await get(proxy, host_http_server)).startswith(b"HTTP/1.0 200")
    proxy.update(["example.invalid"])
    refused = await get(proxy, host_http_server)
    assert refused.startswith(b"HTTP/1.1 403") and b"localhost is not in network.allowedDomains" in refused
    proxy.update(["localhost"], ["blocked.localhost"])
    assert (await get(proxy, host_http_server)).startswith(b"HTTP/1.0 200")
    with pytest.raises(ValueError, match="no interception CA"):
        proxy.update(["localhost"], read_only=True)  # its HTTPS could no longer be read
    proxy.update([])  # no domain: everything refused
    assert (await get(proxy, host_http_server)).startswith(b"HTTP/1.1 403")


async def test_open_connections_keep_the_policy_they_were_accepted_under(
    proxy: DomainProxy, host_http_server: int
) -> None:
    assert proxy.unix_socket is not None
    # A tunnel opened before the update.
    tunnel_reader, tunnel_writer = await asyncio.open_unix_connection(proxy.unix_socket)
    tunnel_writer.write(f"CONNECT localhost:{host_http_server} HTTP/1.1\r\n\r\n".encode())
    assert (await asyncio.wait_for(tunnel_reader.readuntil(b"\r\n\r\n"), 10)).startswith(b"HTTP/1.1 200")
    # A connection accepted before the update, whose request comes after it.
    early_reader, early_writer = await asyncio.open_unix_connection(proxy.unix_socket)
    await asyncio.sleep(0.1)  # accepted

    proxy.update(["example.invalid"])

    tunnel_writer.write(b"GET /after HTTP/1.0\r\n\r\n")
    tunnelled = await asyncio.wait_for(tunnel_reader.read(), 10)
    assert tunnelled.startswith(b"HTTP/1.0 200") and b"GET /after" in tunnelled
    early_writer.write(f"GET http://localhost:{host_http_server}/early HTTP/1.1\r\n\r\n".encode())
    early = await asyncio.wait_for(early_reader.read(), 10)
    assert early.startswith(b"HTTP/1.0 200") and b"GET /early" in early
    tunnel_writer.close()
    early_writer.close()
    assert (await get(proxy, host_http_server)).startswith(b"HTTP/1.1 403")  # a new one: the new policy


async def test_a_restricted_entry_without_a_ca_is_refused_and_the_proxy_unchanged(
    proxy: DomainProxy, host_http_server: int
) -> None:
    before = proxy.hosts
    with pytest.raises(ValueError, match="can't change under running clients"):
        proxy.update([DomainRule(host="example.com", methods=["GET"]), "localhost"])
    assert proxy.hosts is before
    with pytest.raises(ValueError):
        # Invalid (a host listed twice with different rules): refused before anything changes.
        proxy.update(["localhost", DomainRule(host="localhost", methods=["GET"])])
    assert proxy.hosts is before
    assert (await get(proxy, host_http_server)).startswith(b"HTTP/1.0 200")


async def test_a_restricted_entry_the_ca_was_not_made_for_is_refused(tmp_path: Path) -> None:
    ca = InterceptionCA.load_or_create(tmp_path / "ca", ["api.example.com"])
    rule = DomainRule(host="api.example.com", methods=["GET"])
    async with DomainProxy([rule, "other.example.com"], ca=ca) as proxy:
        before = proxy.hosts
        with pytest.raises(ValueError, match="interception CA was not made for them"):
            proxy.update([rule, DomainRule(host="other.example.com", methods=["GET"])])
        assert proxy.hosts is before
        proxy.update(["api.example.com"], read_only=True)  # covered by the CA: applied
        assert proxy.hosts is not before and proxy.hosts.restricted_entries == ("api.example.com",)
