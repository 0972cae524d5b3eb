from __future__ import annotations

from pathlib import Path

import pytest

from ipybox.mcp_client import (
    HttpServerParams,
    ServerParamsError,
    StdioServerParams,
    dump_server_params,
    parse_server_params,
)


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


@pytest.mark.parametrize("server", [{"command": "x"}, {"url": "https://example.com/mcp"}])
def test_call_limits_are_keys_of_both_kinds_of_server(server: dict[str, object]) -> None:
    params = parse_server_params("srv", {**server, "call_timeout": 90, "max_result_size": "2MiB"}, environ={})
    assert (params.call_timeout, params.max_result_size) == (90, 2 * 1024 * 1024)
    assert dump_server_params(params) == {**server, "call_timeout": 90.0, "max_result_size": 2 * 1024 * 1024}
    unset = parse_server_params("srv", server, environ={})
    assert (unset.call_timeout, unset.max_result_size) == (None, None)  # the tool server's defaults apply
    assert dump_server_params(unset) == server


@pytest.mark.parametrize(
    ("limits", "fragment"),
    [
        ({"call_timeout": 0}, "call_timeout: Input should be greater than 0"),
        ({"call_timeout": "soon"}, "call_timeout: Input should be a valid number"),
        (
            {"max_result_size": "lots"},
            'max_result_size: expected a size: bytes (an integer), or a number with a unit such as "64MiB"',
        ),
        ({"max_result_size": 1000}, "max_result_size: Input should be greater than or equal to 65536"),
    ],
)
def test_bad_call_limits_give_one_clear_error(limits: dict[str, object], fragment: str) -> None:
    with pytest.raises(ServerParamsError) as info:
        parse_server_params("srv", {"command": "x", **limits}, environ={})
    assert fragment in str(info.value)


def test_resource_limits_of_a_stdio_server_are_none_unless_given_and_dump_as_given() -> None:
    unlimited = parse_server_params("srv", {"command": "x"}, environ={})
    assert isinstance(unlimited, StdioServerParams) and unlimited.limits is None  # no defaults for servers
    raw = {"command": "x", "limits": {"memory": "64MiB", "processes": 32, "open_files": "unlimited"}}
    params = parse_server_params("srv", raw, environ={})
    assert isinstance(params, StdioServerParams) and params.limits is not None
    assert (params.limits.memory, params.limits.processes, params.limits.open_files) == (
        64 * 1024**2,
        32,
        None,
    )
    dumped = dump_server_params(params)
    assert dumped == {"command": "x", "limits": {"memory": 64 * 1024**2, "processes": 32}}
    assert parse_server_params("srv", dumped, environ={}) == params


def test_a_tmp_limit_needs_a_sandboxed_server() -> None:
    sandboxed = parse_server_params(
        "srv", {"command": "x", "sandbox": True, "limits": {"tmp": "8MiB"}}, environ={}
    )
    assert isinstance(sandboxed, StdioServerParams) and sandboxed.limits is not None
    assert sandboxed.limits.tmp == 8 * 1024**2
    for sandbox in ({}, {"sandbox": False}, {"sandbox": {"enabled": False}}):
        with pytest.raises(ServerParamsError) as info:
            parse_server_params("srv", {"command": "x", **sandbox, "limits": {"tmp": "8MiB"}}, environ={})
        assert "limits.tmp: tmp sizes the private /tmp of a sandboxed server" in str(info.value)
        assert "set sandbox = true, or remove tmp" in str(info.value)


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ({"url": "https://example.com/mcp", "limits": {"memory": "1GiB"}}, "'limits' is for stdio servers"),
        ({"command": "x", "limits": {"memory": "lots"}}, "limits.memory"),
        ({"command": "x", "limits": {"memroy": "1GiB"}}, "limits.memroy: Extra inputs are not permitted"),
        ({"command": "x", "limits": {"processes": 0}}, "limits.processes"),
    ],
)
def test_bad_resource_limits_give_one_clear_error(raw: dict[str, object], fragment: str) -> None:
    with pytest.raises(ServerParamsError) as info:
        parse_server_params("srv", raw, environ={})
    assert fragment in str(info.value) and "\n" not in str(info.value)
