"""The MCP App view's HTML (`ipybox.mcp_server.app_view`), without processes: self-contained, its one
script allowed by hash, a fresh key for each read, and a key that only its own session may use."""

from __future__ import annotations

import base64
import hashlib
import re
from types import SimpleNamespace
from typing import Any, cast

import pytest

from ipybox.mcp_server.app_view import AppViews


def context(session: str | None) -> Any:
    """A request context as `caller_of`/`session_key` read it: over HTTP with a bearer token, in `session`."""
    headers = {"authorization": "Bearer t"} | ({"mcp-session-id": session} if session else {})
    return cast(
        Any, SimpleNamespace(request_context=SimpleNamespace(request=SimpleNamespace(headers=headers)))
    )


def key_of(html: str) -> str:
    match = re.search(r'<meta name="ipybox-view-key" content="([^"]+)">', html)
    assert match
    return match.group(1)


def test_the_view_is_self_contained_and_allows_only_its_own_script_by_hash() -> None:
    html = AppViews(None).html(context("a"))
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", html)  # nothing loaded from anywhere
    assert "@import" not in html and "url(" not in html
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', html)
    assert csp is not None
    policy = csp.group(1)
    assert "default-src 'none'" in policy and "connect-src 'none'" in policy
    script_src = next(part for part in policy.split(";") if part.strip().startswith("script-src"))
    assert "unsafe-inline" not in script_src and "unsafe-eval" not in script_src
    scripts = re.findall(r"<script>(.*?)</script>", html, re.S)
    assert len(scripts) == 1
    digest = base64.b64encode(hashlib.sha256(scripts[0].encode()).digest()).decode()
    assert f"script-src 'sha256-{digest}'" in policy
    assert len(html.encode()) < 12_000


async def test_each_read_gets_its_own_key_and_a_key_serves_only_the_session_that_read_it() -> None:
    views = AppViews(None)
    first, second = key_of(views.html(context("a"))), key_of(views.html(context("a")))
    assert first != second
    assert (await views.state(context("a"), first, None)) == {"run": None}
    for ctx, key in [
        (context("b"), first),
        (context(None), first),
        (context("a"), first + "x"),
        (context("a"), ""),
    ]:
        with pytest.raises(PermissionError, match="not for the model"):
            await views.state(ctx, key, None)
