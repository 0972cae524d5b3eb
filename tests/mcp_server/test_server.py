"""`create_server`: mcp's per-message tracing spans are paid for only when someone records them."""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp.server._otel import OpenTelemetryMiddleware
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
