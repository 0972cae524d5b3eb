"""`ipybox.config.server_import`: other clients' configurations read into the same `[servers.<name>]`
tables, names mapped, secrets moved out, what can't be run skipped with a reason; and the pieces of the
server model and writer it relies on (`type = "stdio"`, `write_servers`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ipybox.config import ConfigError, load_config
from ipybox.config.server_import import (
    SOURCES,
    ServerImportError,
    parse_source,
    plan_import,
    source_paths,
)
from ipybox.config.server_writer import ServerWriteError, write_servers
from ipybox.config.servers import map_server_name

# The same three servers as each client writes them.
MCP_JSON = {
    "mcpServers": {
        "time-server": {"type": "stdio", "command": "uvx", "args": ["mcp-server-time"]},
        "github": {
            "type": "http",
            "url": "https://api.githubcopilot.com/mcp/",
            "headers": {"Authorization": "Bearer ${GITHUB_PAT}"},
        },
        "memory": {"command": "npx", "args": ["-y", "server-memory"], "env": {"MEMORY_FILE": "${MEM}"}},
    }
}
CURSOR = {
    "mcpServers": {
        "time-server": {"command": "uvx", "args": ["mcp-server-time"]},
        "github": {
            "url": "https://api.githubcopilot.com/mcp/",
            "type": "streamable-http",
            "headers": {"Authorization": "Bearer ${env:GITHUB_PAT}"},
        },
        "memory": {"command": "npx", "args": ["-y", "server-memory"], "env": {"MEMORY_FILE": "${env:MEM}"}},
    }
}
VSCODE = """\
{
  // VS Code's own format: JSON with comments and trailing commas
  "inputs": [],
  "servers": {
    "time-server": {"type": "stdio", "command": "uvx", "args": ["mcp-server-time"]},
    "github": {
      "type": "http",
      "url": "https://api.githubcopilot.com/mcp/",
      "headers": {"Authorization": "Bearer ${env:GITHUB_PAT}"},
    },
    /* a stdio server */
    "memory": {"type": "stdio", "command": "npx", "args": ["-y", "server-memory"], "env": {"MEMORY_FILE": "${env:MEM}"}},
  },
}
"""
CODEX = """\
[mcp_servers.time-server]
command = "uvx"
args = ["mcp-server-time"]

[mcp_servers.github]
url = "https://api.githubcopilot.com/mcp/"
bearer_token_env_var = "GITHUB_PAT"

[mcp_servers.memory]
command = "npx"
args = ["-y", "server-memory"]
env = { MEMORY_FILE = "${MEM}" }
"""
EXPECTED = {
    "time_server": {"command": "uvx", "args": ["mcp-server-time"]},
    "github": {
        "url": "https://api.githubcopilot.com/mcp/",
        "headers": {"Authorization": "Bearer ${GITHUB_PAT}"},
        "type": "streamable_http",
    },
    "memory": {"command": "npx", "args": ["-y", "server-memory"], "env": {"MEMORY_FILE": "${MEM}"}},
}


def tables(text: str, name: str, **options: Any) -> dict[str, dict[str, Any]]:
    plan = plan_import(parse_source(text, Path(name)), environ={}, **options)
    assert plan.skipped == []
    return {server.name: server.table for server in plan.servers}


@pytest.mark.parametrize(
    ("text", "name"),
    [
        (json.dumps(MCP_JSON), ".mcp.json"),
        (json.dumps(CURSOR), "mcp.json"),
        (VSCODE, "mcp.json"),
        (CODEX, "config.toml"),
        (json.dumps({"projects": {"/w": MCP_JSON}}), ".claude.json"),
    ],
    ids=["claude-code", "cursor", "vscode", "codex", "claude.json-local"],
)
def test_every_client_format_becomes_the_same_servers(text: str, name: str) -> None:
    found = parse_source(text, Path(name), workspace=Path("/w"))
    plan = plan_import(found, environ={})
    got = {server.name: server.table for server in plan.servers}
    # Codex writes no transport: the URL decides it (streamable HTTP), as it does for Codex.
    expected = {**EXPECTED, "github": {k: v for k, v in EXPECTED["github"].items() if k != "type"}}
    assert got == (expected if name == "config.toml" else EXPECTED)
    assert [(s.original, s.name, s.transport) for s in plan.servers] == [
        ("time-server", "time_server", "stdio"),
        ("github", "github", "streamable_http"),
        ("memory", "memory", "stdio"),
    ]


def test_the_user_scope_of_claude_json_is_read_under_the_projects_local_scope() -> None:
    data = {
        "mcpServers": {"a": {"command": "user-a"}, "b": {"command": "user-b"}},
        "projects": {
            "/w": {"mcpServers": {"a": {"command": "local-a"}}},
            "/other": {"mcpServers": {"c": {}}},
        },
    }
    assert tables(json.dumps(data), ".claude.json") == {
        "a": {"command": "user-a"},
        "b": {"command": "user-b"},
    }
    found = parse_source(json.dumps(data), Path(".claude.json"), workspace=Path("/w"))
    assert {s.name: s.entry["command"] for s in found} == {"a": "local-a", "b": "user-b"}


@pytest.mark.parametrize(
    ("given", "mapped"),
    [
        ("time", "time"),
        ("my-server", "my_server"),
        ("my.server", "my_server"),
        ("2fa", "server_2fa"),
        ("class", "class_"),
        ("shell", "shell_server"),
        ("ipybox", "ipybox_server"),
    ],
)
def test_a_name_becomes_the_closest_python_identifier_that_is_no_reserved_name(
    given: str, mapped: str
) -> None:
    assert map_server_name(given) == mapped


def test_a_mapped_name_is_said_once_with_both_names() -> None:
    plan = plan_import(parse_source(json.dumps(MCP_JSON), Path(".mcp.json")), environ={})
    server = plan.servers[0]
    assert server.notes[0] == (
        "named time_server (its package mcptools.time_server): 'time-server' is not a Python identifier"
    )
    assert not any("named" in note for note in plan.servers[1].notes)


def test_two_names_that_map_to_one_are_refused_naming_both() -> None:
    text = json.dumps({"mcpServers": {"my-server": {"command": "a"}, "my_server": {"command": "b"}}})
    with pytest.raises(ServerImportError) as refused:
        plan_import(parse_source(text, Path(".mcp.json")), environ={})
    assert str(refused.value).startswith(
        "'my-server' and 'my_server' would both be the server 'my_server' in ipybox"
    )


def test_a_server_already_in_ipybox_toml_is_skipped_unless_replaced() -> None:
    found = parse_source(json.dumps(MCP_JSON), Path(".mcp.json"))
    plan = plan_import(found, existing=["time_server"], environ={})
    assert [s.name for s in plan.servers] == ["github", "memory"]
    assert plan.skipped[0].original == "time-server"
    assert (
        plan.skipped[0].reason
        == "ipybox.toml has a server 'time_server' ('time-server' maps to it) already (--force replaces it)"
    )
    assert [
        s.name for s in plan_import(found, existing=["time_server"], replace=True, environ={}).servers
    ] == [
        "time_server",
        "github",
        "memory",
    ]


def test_only_picks_servers_by_either_name_and_an_unknown_one_is_an_error() -> None:
    found = parse_source(json.dumps(MCP_JSON), Path(".mcp.json"))
    assert [s.name for s in plan_import(found, only=["time_server", "memory"], environ={}).servers] == [
        "time_server",
        "memory",
    ]
    with pytest.raises(ServerImportError, match=r"--only nope: no such server in the source \(it has github"):
        plan_import(found, only=["nope"], environ={})


def test_literal_secrets_go_to_dotenv_under_names_not_taken_for_another_value() -> None:
    text = json.dumps(
        {
            "mcpServers": {
                "gh": {"url": "https://x.example/mcp", "headers": {"Authorization": "Bearer ghp_1"}},
                "api": {
                    "command": "srv",
                    "args": ["--api-key", "k-2", "--token=t-3", "--name", "plain"],
                    "env": {"API_KEY": "k-4", "LOG_LEVEL": "debug", "GITHUB_TOKEN": "${GITHUB_TOKEN}"},
                },
            }
        }
    )
    plan = plan_import(
        parse_source(text, Path(".mcp.json")), dotenv={"GH_TOKEN": "other"}, environ={"API_KEY": "k-4"}
    )
    gh, api = plan.servers
    assert gh.table["headers"] == {"Authorization": "Bearer ${GH_TOKEN_2}"}
    assert api.table["args"] == ["--api-key", "${API_API_KEY}", "--token=${API_TOKEN}", "--name", "plain"]
    # API_KEY is set to the same value already: reused, and still written, so .env has it where it runs.
    assert api.table["env"] == {
        "API_KEY": "${API_KEY}",
        "LOG_LEVEL": "debug",
        "GITHUB_TOKEN": "${GITHUB_TOKEN}",
    }
    assert plan.dotenv == {"GH_TOKEN_2": "ghp_1", "API_API_KEY": "k-2", "API_TOKEN": "t-3", "API_KEY": "k-4"}
    assert "headers Authorization: the literal value was moved to .env as GH_TOKEN_2" in gh.notes


def test_client_placeholders_become_ipybox_placeholders_with_a_note_where_the_meaning_changes() -> None:
    text = """{
      "inputs": [{"type": "promptString", "id": "perplexity-key", "description": "Perplexity API Key", "password": true}],
      "servers": {
        "perplexity": {
          "type": "stdio", "command": "npx", "args": ["${workspaceFolder}/x", "${userHome}/y", "${A:-1}"],
          "env": {"PERPLEXITY_API_KEY": "${input:perplexity-key}"}
        },
        "odd": {"command": "x", "args": ["${pathSeparator}"]}
      }
    }"""
    plan = plan_import(parse_source(text, Path("mcp.json")), environ={})
    (server,) = plan.servers
    assert server.table == {
        "command": "npx",
        "args": ["${IPYBOX_WORKSPACE}/x", "${HOME}/y", "${A}"],
        "env": {"PERPLEXITY_API_KEY": "${PERPLEXITY_KEY}"},
    }
    assert server.notes == (
        "args 1: ${workspaceFolder} became ${IPYBOX_WORKSPACE}",
        "args 2: ${userHome} became ${HOME}",
        "args 3: ${A:-1} became ${A} (ipybox has no defaults: set A in .env, e.g. to '1')",
        "env PERPLEXITY_API_KEY: ${input:perplexity-key} is asked for by VS Code (Perplexity API Key); ipybox "
        "reads ${PERPLEXITY_KEY} instead: set PERPLEXITY_KEY in .env",
    )
    assert plan.dotenv == {}
    claude = json.dumps({"mcpServers": {"p": {"command": "${CLAUDE_PROJECT_DIR}/bin/server"}}})
    assert tables(claude, ".mcp.json") == {"p": {"command": "${IPYBOX_WORKSPACE}/bin/server"}}
    assert [(s.original, s.reason) for s in plan.skipped] == [
        ("odd", "args 1 uses ${pathSeparator}, which ipybox can't fill in; add it by hand")
    ]


def test_what_ipybox_cannot_run_is_skipped_with_the_reason() -> None:
    text = json.dumps(
        {
            "mcpServers": {
                "contradiction": {"type": "sse", "command": "x"},
                "stdio-url": {"type": "stdio", "url": "https://x.example/mcp"},
                "oauth": {"url": "https://x.example/mcp", "oauth": {"clientId": "c"}},
                "neither": {"args": ["a"]},
            }
        }
    )
    plan = plan_import(parse_source(text, Path(".mcp.json")), environ={})
    assert plan.servers == []
    reasons = {s.original: s.reason for s in plan.skipped}
    assert reasons["contradiction"].startswith(
        "type: 'sse' is a remote transport, and this server has 'command'"
    )
    assert reasons["stdio-url"].startswith(
        "type: 'stdio' is the type of a server with 'command', and this one"
    )
    assert (
        reasons["oauth"] == "it signs in with 'oauth' (OAuth), which ipybox does not do; give a token header"
    )
    assert reasons["neither"] == "a server needs 'command' (a stdio server) or 'url' (a remote server)"


def test_a_sandboxed_workspace_gets_sandboxed_stdio_servers_and_dropped_keys_are_noted() -> None:
    text = CODEX + 'startup_timeout_sec = 20\ntool_timeout_sec = 60\nenabled = false\nenabled_tools = ["a"]\n'
    plan = plan_import(parse_source(text, Path("config.toml")), sandbox=True, environ={})
    memory = plan.servers[2]
    assert memory.table == {
        "command": "npx",
        "args": ["-y", "server-memory"],
        "env": {"MEMORY_FILE": "${MEM}"},
        "sandbox": True,
        "call_timeout": 60.0,
        "enabled": False,
    }
    assert memory.notes == ("ignored enabled_tools (not an ipybox setting)",)
    assert "sandbox" not in plan.servers[1].table  # a remote server has no sandbox


def test_a_file_that_is_no_client_configuration_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ServerImportError, match=r"x.json:2:7: not valid JSON: Expecting ':' delimiter"):
        parse_source('{\n  "a" 1}', tmp_path / "x.json")
    with pytest.raises(ServerImportError, match="has neither an mcpServers object"):
        parse_source('{"other": {}}', tmp_path / "x.json")
    with pytest.raises(ServerImportError, match=r"has no \[mcp_servers.<name>\] tables"):
        parse_source("[profile]\n", tmp_path / "config.toml")


@pytest.mark.parametrize("kind", SOURCES)
def test_a_client_without_a_configuration_names_every_path_tried(
    kind: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CODEX_HOME", raising=False)
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    with pytest.raises(ServerImportError) as refused:
        source_paths(kind, tmp_path / "ws", home=tmp_path / "home")
    message = str(refused.value)
    assert message.startswith(f"--from {kind}: no configuration found (tried {tmp_path}")
    expected = {
        "claude-code": ["ws/.mcp.json", "home/.claude.json"],
        "claude-desktop": ["home/.config/Claude/claude_desktop_config.json"],
        "codex": ["home/.codex/config.toml"],
        "cursor": ["ws/.cursor/mcp.json", "home/.cursor/mcp.json"],
        "vscode": ["ws/.vscode/mcp.json", "home/.config/Code/User/mcp.json"],
    }[kind]
    for path in expected:
        assert str(tmp_path / path) in message


def test_claude_code_reads_the_projects_mcp_json_and_the_users_claude_json(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / ".claude.json").write_text("{}")
    assert source_paths("claude-code", tmp_path / "ws", home=tmp_path / "home") == [
        tmp_path / "home/.claude.json"
    ]
    (tmp_path / "ws" / ".mcp.json").write_text("{}")
    assert source_paths("claude-code", tmp_path / "ws", home=tmp_path / "home") == [
        tmp_path / "ws/.mcp.json",
        tmp_path / "home/.claude.json",
    ]


# The server model and the writer


def test_type_stdio_is_taken_next_to_command_and_a_contradiction_is_an_error_at_its_place(
    tmp_path: Path,
) -> None:
    (tmp_path / "ipybox.toml").write_text(
        '[servers.a]\ncommand = "x"\ntype = "stdio"\n\n[servers.b]\ncommand = "x"\ntype = "http"\n\n'
        '[servers.c]\nurl = "https://x.example/mcp"\n  type = "stdio"\n'
    )
    with pytest.raises(ConfigError) as refused:
        load_config(tmp_path)
    path = tmp_path / "ipybox.toml"
    assert str(refused.value).splitlines() == [
        f"{path}:7:1: servers.b.type: 'http' is a remote transport, and this server has 'command' (a stdio "
        "server, which ipybox starts): give 'url' instead of 'command' for a remote server, or write type = "
        "'stdio' (or no type) (got 'http')",
        f"{path}:11:3: servers.c.type: 'stdio' is the type of a server with 'command', and this one has 'url' "
        "(a remote server): remove type, or write 'streamable_http' or 'sse' (got 'stdio')",
    ]
    (tmp_path / "ipybox.toml").write_text('[servers.a]\ncommand = "x"\ntype = "STDIO"\n')
    assert load_config(tmp_path).server_params("a") == {"command": "x", "args": [], "cwd": str(tmp_path)}


WORKSPACE = """\
#:schema ./ipybox.schema.json
# My workspace.

# The edge server.
[servers.edge]
command = "edge"
# args = ["--verbose"]

# Kernel settings.
[kernel]
timeout = 30
"""


def test_write_servers_adds_every_table_after_the_servers_and_keeps_the_rest_byte_for_byte(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ipybox.toml"
    path.write_text(WORKSPACE)
    edits = write_servers(path, {"a": {"command": "x"}, "b": {"url": "https://x.example/mcp"}})
    assert path.read_text() == (
        "#:schema ./ipybox.schema.json\n# My workspace.\n\n# The edge server.\n[servers.edge]\n"
        'command = "edge"\n# args = ["--verbose"]\n\n[servers.a]\ncommand = "x"\n\n[servers.b]\n'
        'url = "https://x.example/mcp"\n\n# Kernel settings.\n[kernel]\ntimeout = 30\n'
    )
    assert [(e.name, e.action, e.line) for e in edits] == [("a", "added", 9), ("b", "added", 12)]


def test_write_servers_writes_none_when_one_of_them_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ipybox.toml"
    path.write_text(WORKSPACE)
    with pytest.raises(ServerWriteError, match="it has a server 'edge' already"):
        write_servers(path, {"a": {"command": "x"}, "edge": {"command": "y"}})
    with pytest.raises(ServerWriteError, match=r"would not load with these servers:\n.*servers.c.command"):
        write_servers(path, {"b": {"command": "x"}, "c": {"command": ""}})
    assert path.read_text() == WORKSPACE
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ipybox.toml"]  # no temporary file left
