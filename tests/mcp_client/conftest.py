"""Connections to our edge server over stdio, streamable HTTP and SSE, shared per module."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from ipybox.mcp_client import MCPConnection
from tests.servers import params


@pytest.fixture(scope="session")
def edge_http_url() -> Iterator[str]:
    with params.edge_http_server("streamable-http") as url:
        yield url


@pytest.fixture(scope="session")
def edge_sse_url() -> Iterator[str]:
    with params.edge_http_server("sse") as url:
        yield url


@pytest.fixture(scope="module", params=["stdio", "streamable_http", "sse"])
async def edge(request: pytest.FixtureRequest) -> AsyncIterator[MCPConnection]:
    """A started connection to the edge server, once per transport."""
    if request.param == "stdio":
        server_params = params.edge()
    elif request.param == "streamable_http":
        server_params = {"url": request.getfixturevalue("edge_http_url")}
    else:
        server_params = {"url": request.getfixturevalue("edge_sse_url")}
    async with MCPConnection(f"edge-{request.param}", server_params, connect_timeout=20) as connection:
        yield connection
