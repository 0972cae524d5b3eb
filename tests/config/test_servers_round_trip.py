"""`[servers.<name>]` is the server-parameters model of `ipybox.mcp_client.params`: any published
`server_params` dict, validated, written to `ipybox.toml` as its dump and loaded back, is the same model."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
import tomlkit
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ipybox.config import load_config
from ipybox.config.servers import RemoteServerSection, StdioServerSection
from ipybox.mcp_client.params import dump_server_params, validate_server_params

_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
_placeholder = st.from_regex(r"\$\{[A-Z_][A-Z0-9_]{0,5}\}", fullmatch=True)
_value = st.one_of(_text, _placeholder, st.builds(lambda a, b: a + b, _text, _placeholder))
_key = st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,8}", fullmatch=True)
_paths = st.lists(st.sampled_from(["~/.ssh", "private", "/data/out", "out/**"]), max_size=2)
_domains = st.lists(st.sampled_from(["pypi.org", "*.example.com", "10.0.0.1"]), max_size=2)
_policy = st.fixed_dictionaries(
    {},
    optional={
        "enabled": st.booleans(),
        "filesystem": st.fixed_dictionaries({}, optional={"denyRead": _paths, "allowWrite": _paths}),
        "network": st.fixed_dictionaries(
            {}, optional={"allowedDomains": _domains, "deniedDomains": _domains}
        ),
    },
)
_limits = st.fixed_dictionaries(
    {},
    optional={
        "memory": st.sampled_from(["64MiB", "2 GB", 1 << 30, "unlimited"]),
        "cpus": st.sampled_from([0.5, 2, "unlimited"]),
        "processes": st.integers(1, 4096),
        "open_files": st.sampled_from([64, "unlimited"]),
        "enforce": st.sampled_from(["auto", "cgroup", "rlimit"]),
    },
)
_stdio = st.fixed_dictionaries(
    {"command": _value.filter(bool)},
    optional={
        "args": st.lists(_value, max_size=3),
        "env": st.dictionaries(_key, _value, max_size=3),
        "cwd": _value,
        "sandbox": st.one_of(st.booleans(), _policy),
        "limits": _limits,
    },
)
_url = st.sampled_from(
    ["https://example.com/mcp", "http://127.0.0.1:8000/sse", "https://h.example/v1/x?q=1", "${MCP_URL}"]
)
_transport = st.sampled_from(["streamable_http", "sse", "http", "Streamable-HTTP", "streamablehttp"])
_remote = st.fixed_dictionaries(
    {"url": _url},
    optional={"headers": st.dictionaries(_key, _value, max_size=3), "type": _transport},
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(params=st.one_of(_stdio, _remote), enabled=st.sampled_from([None, True, False]))
@pytest.mark.integration  # no process, but a property test that takes seconds
def test_server_params_written_to_the_file_load_back_as_the_same_model(
    params: dict[str, Any], enabled: bool | None
) -> None:
    model = validate_server_params("srv", params)
    table = dump_server_params(model)
    assert validate_server_params("srv", table) == model  # the dump is the model
    if enabled is not None:
        table["enabled"] = enabled
    document = tomlkit.document()
    servers = tomlkit.table(is_super_table=True)
    servers["srv"] = table
    document["servers"] = servers
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "ipybox.toml"
        path.write_text(tomlkit.dumps(document))
        loaded = load_config(path).servers["srv"]
    assert isinstance(loaded, StdioServerSection if model.is_stdio else RemoteServerSection)
    assert loaded.enabled is (enabled is not False)
    reloaded = dump_server_params(loaded)
    reloaded.pop("enabled", None)
    assert validate_server_params("srv", reloaded) == model
