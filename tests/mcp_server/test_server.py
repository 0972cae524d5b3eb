"""`create_server`: mcp's per-message tracing spans are paid for only when someone records them; a start that
fails before a call (`before_call`) is that call's error."""

from __future__ import annotations

from pathlib import Path

import mcp
import pytest
from mcp.server._otel import OpenTelemetryMiddleware
from mcp.server.mcpserver.exceptions import ToolError
from opentelemetry import trace

from ipybox.mcp_server import workspace_mcp as server_module


def test_no_tracing_middleware_without_a_tracer_provider(tmp_path: Path) -> None:
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)  # nothing installed one
    middleware = server_module.create_server(tmp_path).server.middleware
    assert middleware and not any(isinstance(m, OpenTelemetryMiddleware) for m in middleware)


def test_tracing_middleware_kept_when_a_tracer_provider_is_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: trace.NoOpTracerProvider())
    middleware = server_module.create_server(tmp_path).server.middleware
    assert any(isinstance(m, OpenTelemetryMiddleware) for m in middleware)


async def test_a_failing_start_before_a_call_is_that_calls_error_and_listing_needs_no_start(
    tmp_path: Path,
) -> None:
    # `ipybox mcp` starts its workspace in `before_call`: what fails there is the call's error, and
    # listing the tools (a health check) calls nothing.
    calls: list[str] = []

    async def start() -> None:
        calls.append("start")
        raise ToolError("the workspace could not start: no sandbox here")

    served = server_module.create_server(tmp_path, before_call=start)
    async with served, mcp.Client(served.server) as client:
        assert "execute_ipython_cell" in [tool.name for tool in (await client.list_tools()).tools]
        assert calls == []
        result = await client.call_tool("execute_ipython_cell", {"code": "1"})
    assert result.is_error and calls == ["start"]
    assert "no sandbox here" in result.content[0].text  # type: ignore[union-attr]
    assert list(tmp_path.iterdir()) == []
