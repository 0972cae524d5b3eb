from __future__ import annotations

from pathlib import Path

import pytest

from ipybox.mcp_client import HttpServerParams, ServerParamsError, StdioServerParams, parse_server_params


def test_stdio_params_with_placeholders_from_environ() -> None:
    params = parse_server_params(
        "brave",
        {"command": "npx", "args": ["-y", "${PKG}"], "env": {"API_KEY": "${KEY}", "PLAIN": "x"}},
        environ={"KEY": "secret", "PKG": "server"},
    )
    assert params == StdioServerParams(
        command="npx", args=["-y", "server"], env={"API_KEY": "secret", "PLAIN": "x"}
    )


def test_placeholders_fall_back_to_dotenv_file(tmp_path: Path) -> None:
    dotenv = tmp_path / ".env"
    dotenv.write_text("TOKEN=from-dotenv\nSHADOWED=from-dotenv\n")
    params = parse_server_params(
        "github",
        {
            "url": "https://example.com/mcp/",
            "headers": {"Authorization": "Bearer ${TOKEN}", "X": "${SHADOWED}"},
        },
        environ={"SHADOWED": "from-environ"},
        dotenv_path=dotenv,
    )
    assert isinstance(params, HttpServerParams)
    assert params.headers == {"Authorization": "Bearer from-dotenv", "X": "from-environ"}


def test_missing_variable_is_named(tmp_path: Path) -> None:
    with pytest.raises(ServerParamsError) as info:
        parse_server_params(
            "brave",
            {"command": "npx", "env": {"API_KEY": "${BRAVE_API_KEY}"}},
            environ={},
            dotenv_path=tmp_path / ".env",
        )
    message = str(info.value)
    assert "'brave'" in message and "BRAVE_API_KEY" in message and "env.API_KEY" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("url", "type_", "transport"),
    [
        ("https://api.example.com/mcp/", None, "streamable_http"),
        ("http://127.0.0.1:8000/sse", None, "sse"),
        ("http://127.0.0.1:8000/v1/sse/stream", None, "sse"),
        ("http://127.0.0.1:8000/other", None, "streamable_http"),
        ("http://127.0.0.1:8000/mcp", "sse", "sse"),
        ("http://127.0.0.1:8000/sse", "streamable_http", "streamable_http"),
        ("http://127.0.0.1:8000/x", "streamable-http", "streamable_http"),
    ],
)
def test_transport_detection(url: str, type_: str | None, transport: str) -> None:
    raw = {"url": url} if type_ is None else {"url": url, "type": type_}
    params = parse_server_params("s", raw, environ={})
    assert isinstance(params, HttpServerParams) and params.transport == transport


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ({"command": "x", "url": "http://a/mcp"}, "not both"),
        ({"args": ["x"]}, "needs 'command'"),
        ({"url": "ftp://example.com/mcp"}, "not an http"),
        ({"url": "http://a/mcp", "type": "websocket"}, "type: Input should be 'streamable_http' or 'sse'"),
        ({"command": "x", "args": "not-a-list"}, "args"),
        ({"command": "x", "extra": 1}, "extra"),
        ({"command": "${bad-name}"}, "invalid placeholder"),
    ],
)
def test_invalid_params_give_one_clear_error(raw: dict[str, object], fragment: str) -> None:
    with pytest.raises(ServerParamsError) as info:
        parse_server_params("srv", raw, environ={})
    assert "'srv'" in str(info.value) and fragment in str(info.value)
    assert "\n" not in str(info.value)
