"""`[servers.<name>]` in `ipybox.toml`: the call limits reach the server parameters the tool server starts
servers with, and a bad value is an error at its line."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from ipybox.config import ConfigError, load_config
from ipybox.mcp_client.params import parse_server_params

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
