"""`EmbeddedServer`: a port it cannot have is one error naming the endpoint, the address and the reason,
never uvicorn's `sys.exit`."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ipybox.asgi_server import EmbeddedServer, ListenError
from ipybox.errors import IpyboxError


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


async def test_a_port_in_use_is_one_error_naming_the_endpoint_address_and_what_to_do(taken_port: int) -> None:
    server = EmbeddedServer(Starlette(), "ipybox-console")
    with pytest.raises(ListenError) as raised:
        await server.start(host="127.0.0.1", port=taken_port)
    message = str(raised.value)
    assert f"ipybox-console cannot listen on 127.0.0.1:{taken_port}" in message
    assert "Address already in use" in message and "0 for a free one" in message
    assert isinstance(raised.value, IpyboxError) and isinstance(raised.value, OSError)
    assert not server.running


async def test_an_address_that_is_not_this_machines_is_refused_with_the_systems_reason() -> None:
    with pytest.raises(ListenError, match=r"cannot listen on 192\.0\.2\.1:0: .*assign"):
        await EmbeddedServer(Starlette(), "x").start(host="192.0.2.1", port=0)


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
async def test_port_zero_listens_on_a_free_port_that_accepts_connections(host: str) -> None:
    server = EmbeddedServer(Starlette(), "x")
    await server.start(host=host, port=0)
    try:
        assert server.port
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family) as client:
            client.connect((host, server.port))
    finally:
        await server.stop()


async def test_connections_are_served_without_nagles_delay() -> None:
    # asyncio turns Nagle's algorithm off only on connections of a socket whose protocol says TCP; with it
    # on, each response waited for the client's delayed ACK (about 40 ms).
    server = EmbeddedServer(Starlette(), "x")
    await server.start(host="127.0.0.1", port=0)
    try:
        assert server._server is not None
        listening = [sock for s in server._server.servers for sock in s.sockets]
        assert listening and all(sock.proto == socket.IPPROTO_TCP for sock in listening)
    finally:
        await server.stop()


async def test_a_caller_cancelled_while_the_server_stops_sees_it_and_the_server_stops_anyway() -> None:
    started, release = asyncio.Event(), asyncio.Event()

    async def hang(request: Request) -> Response:
        started.set()
        await release.wait()
        return Response("late")

    server = EmbeddedServer(Starlette(routes=[Route("/hang", hang)]), "x")
    await server.start(host="127.0.0.1", port=0)
    _, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(b"GET /hang HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.wait_for(started.wait(), 10)
        stopping = asyncio.create_task(server.stop())
        await asyncio.sleep(0.2)
        assert not stopping.done()  # uvicorn waits for the open request
        stopping.cancel()
        await asyncio.wait({stopping})
        assert stopping.cancelled()
        assert not server.running
    finally:
        release.set()
        writer.close()
