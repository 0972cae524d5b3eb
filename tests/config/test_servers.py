"""`[servers.<name>]` in `ipybox.toml`: the call limits reach the server parameters the tool server starts
servers with, and a bad value is an error at its line."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from ipybox.config import ConfigError, load_config
from ipybox.mcp_client.params import StdioServerParams, parse_server_params

WriteConfig = Callable[[str], Path]


def test_call_limits_reach_the_server_params(write_config: WriteConfig, workspace: Path) -> None:
    config = load_config(
        write_config(
            '[servers.fs]\ncommand = "npx"\ncall_timeout = 600\nmax_result_size = "16MiB"\n\n'
            '[servers.gh]\nurl = "https://example.com/mcp"\ncall_timeout = 30\n\n'
            '[servers.plain]\ncommand = "npx"\n'
        )
    )
    fs = config.server_params("fs")
    assert (fs["call_timeout"], fs["max_result_size"]) == (600, 16 * 1024 * 1024)
    assert config.server_params("gh")["call_timeout"] == 30
    assert "call_timeout" not in config.server_params("plain")  # the tool server's default applies
    parsed = parse_server_params("fs", fs, environ={})
    assert (parsed.call_timeout, parsed.max_result_size) == (600, 16 * 1024 * 1024)


def test_a_bad_call_limit_is_an_error_at_its_line(write_config: WriteConfig) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write_config('[servers.fs]\ncommand = "npx"\nmax_result_size = "huge"\n'))
    assert info.value.line == 3 and "max_result_size" in str(info.value) and '"64MiB"' in str(info.value)


def test_resource_limits_reach_the_server_params(write_config: WriteConfig) -> None:
    config = load_config(
        write_config(
            '[servers.fs]\ncommand = "npx"\nlimits = { memory = "64MiB", processes = 16 }\n\n'
            '[servers.boxed]\ncommand = "npx"\nsandbox = true\n[servers.boxed.limits]\ntmp = "8MiB"\n\n'
            '[servers.plain]\ncommand = "npx"\n'
        )
    )
    assert config.server_params("fs")["limits"] == {"memory": 64 * 1024**2, "processes": 16}
    assert config.server_params("boxed")["limits"] == {"tmp": 8 * 1024**2}
    assert "limits" not in config.server_params("plain")  # a server gets no limits it was not given
    parsed = parse_server_params("fs", config.server_params("fs"), environ={})
    assert isinstance(parsed, StdioServerParams) and parsed.limits is not None
    assert (parsed.limits.memory, parsed.limits.processes) == (64 * 1024**2, 16)


def test_a_tmp_limit_on_an_unsandboxed_server_is_an_error_at_its_key(write_config: WriteConfig) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(
            write_config('[servers.fs]\ncommand = "npx"\nlimits = { memory = "64MiB", tmp = "8MiB" }\n')
        )
    assert (info.value.line, info.value.column) == (3, 30)  # at `tmp`
    assert "servers.fs.limits.tmp" in str(info.value) and "set sandbox = true, or remove tmp" in str(
        info.value
    )
    with pytest.raises(ConfigError) as info:
        load_config(write_config('[servers.fs]\ncommand = "npx"\n\n[servers.fs.limits]\ntmp = "8MiB"\n'))
    assert info.value.line == 5 and "servers.fs.limits.tmp" in str(info.value)


def test_limits_on_a_remote_server_are_an_error_at_their_line(write_config: WriteConfig) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(
            write_config('[servers.gh]\nurl = "https://example.com/mcp"\nlimits = { memory = "1GiB" }\n')
        )
    assert info.value.line == 3 and "'limits' is for stdio servers" in str(info.value)
