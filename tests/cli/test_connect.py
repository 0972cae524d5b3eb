"""`ipybox connect` and `ipybox token rotate` without a running workspace: each client's entry as its
documentation shows it (exact JSON and TOML), merged into an existing file, `--write`'s backup and
refusals, and the persisted token. Nothing here starts a supervisor (the live parts are in
`tests/cli/test_workspace.py`, on its running workspace, and `tests/plugin/test_claude_code_plugin.py`)."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from ipybox.cli import connect
from ipybox.cli.client_config import (
    BadFileError,
    Client,
    ConflictError,
    ConnectError,
    Http,
    Stdio,
    claude_add_command,
    entry,
    merge,
    snippet,
    stdio_args,
)
from ipybox.cli.main import main
from ipybox.running import mcp_token
from ipybox.running.state import StatePaths

STDIO = Stdio("ipybox", stdio_args(Path("/home/me/project")))
HTTP = Http("http://127.0.0.1:8765/mcp", "t0k3n")
COMMAND = {"command": "ipybox", "args": ["mcp", "--workspace", "/home/me/project"]}
HEADERS = {"Authorization": "Bearer t0k3n"}


# -- the entries, as each client documents them --------------------------------------------------------


def test_each_clients_stdio_entry_is_the_form_its_file_takes() -> None:
    assert entry("claude", STDIO) == {"type": "stdio", **COMMAND}
    assert entry("vscode", STDIO) == {"type": "stdio", **COMMAND}
    assert entry("json", STDIO) == {"type": "stdio", **COMMAND}
    assert entry("cursor", STDIO) == COMMAND
    assert entry("desktop", STDIO) == COMMAND
    # Codex gives a server 10 s to start and a call 60 s: `ipybox mcp` starts a workspace, a cell runs 120 s.
    assert entry("codex", STDIO) == {**COMMAND, "startup_timeout_sec": 30, "tool_timeout_sec": 600}


def test_each_clients_http_entry_sends_the_bearer_token() -> None:
    url = HTTP.url
    assert entry("claude", HTTP) == {"type": "http", "url": url, "headers": HEADERS}
    assert entry("vscode", HTTP) == {"type": "http", "url": url, "headers": HEADERS}
    assert entry("cursor", HTTP) == {"url": url, "headers": HEADERS}
    # Codex ignores `headers` and refuses an inline `bearer_token`: literal headers are `http_headers`.
    assert entry("codex", HTTP) == {"url": url, "http_headers": HEADERS, "tool_timeout_sec": 600}


def test_claude_desktop_has_no_http_entry_and_says_to_connect_over_stdio() -> None:
    with pytest.raises(ConnectError, match=r"local \(stdio\) servers only.*without --http"):
        entry("desktop", HTTP)


def test_the_snippets_are_whole_documents_in_each_files_format() -> None:
    assert json.loads(snippet("vscode", STDIO)) == {"servers": {"ipybox": {"type": "stdio", **COMMAND}}}
    assert json.loads(snippet("cursor", HTTP)) == {
        "mcpServers": {"ipybox": {"url": HTTP.url, "headers": HEADERS}}
    }
    assert snippet("codex", HTTP) == (
        "[mcp_servers.ipybox]\n"
        'url = "http://127.0.0.1:8765/mcp"\n'
        'http_headers = {Authorization = "Bearer t0k3n"}\n'
        "tool_timeout_sec = 600\n"
    )


def test_the_claude_command_line_puts_every_option_before_the_name() -> None:
    assert claude_add_command(STDIO) == "claude mcp add ipybox -- ipybox mcp --workspace /home/me/project"
    assert claude_add_command(HTTP, scope="project") == (
        # `--header` takes every word up to the next option: before the name, it would take the name.
        "claude mcp add --scope project --transport http ipybox http://127.0.0.1:8765/mcp --header "
        "'Authorization: Bearer t0k3n'"
    )
    spaced = Stdio("/opt/my tools/ipybox", stdio_args(Path("/a b")))
    assert (
        claude_add_command(spaced) == "claude mcp add ipybox -- '/opt/my tools/ipybox' mcp --workspace '/a b'"
    )


# -- merging into the client's file ---------------------------------------------------------------------


def test_merging_into_a_json_file_leaves_its_other_entries_and_keys_as_they_were() -> None:
    existing = '{"mcpServers": {"time": {"command": "uvx", "args": ["mcp-server-time"]}}, "other": 1}\n'
    merged = merge("claude", existing, entry("claude", STDIO))
    assert not merged.unchanged and not merged.replaced
    assert merged.text == (
        "{\n"
        '  "mcpServers": {\n'
        '    "time": {\n'
        '      "command": "uvx",\n'
        '      "args": [\n'
        '        "mcp-server-time"\n'
        "      ]\n"
        "    },\n"
        '    "ipybox": {\n'
        '      "type": "stdio",\n'
        '      "command": "ipybox",\n'
        '      "args": [\n'
        '        "mcp",\n'
        '        "--workspace",\n'
        '        "/home/me/project"\n'
        "      ]\n"
        "    }\n"
        "  },\n"
        '  "other": 1\n'
        "}\n"
    )
    # VS Code's servers are under "servers"; an empty file is a new one.
    assert json.loads(merge("vscode", "", entry("vscode", HTTP)).text) == {
        "servers": {"ipybox": {"type": "http", "url": HTTP.url, "headers": HEADERS}}
    }


def test_merging_into_codex_config_keeps_its_comments_and_tables() -> None:
    existing = '# my settings\nmodel = "o3"\n\n[mcp_servers.time]\ncommand = "uvx"  # the clock\n'
    merged = merge("codex", existing, entry("codex", STDIO))
    assert merged.text == (
        '# my settings\nmodel = "o3"\n\n[mcp_servers.time]\ncommand = "uvx"  # the clock\n\n'
        "[mcp_servers.ipybox]\n"
        'command = "ipybox"\n'
        'args = ["mcp", "--workspace", "/home/me/project"]\n'
        "startup_timeout_sec = 30\n"
        "tool_timeout_sec = 600\n"
    )
    assert merge("codex", merged.text, entry("codex", STDIO)).unchanged


def test_the_same_entry_changes_nothing_and_a_different_one_needs_force() -> None:
    first = merge("cursor", None, entry("cursor", HTTP)).text
    assert merge("cursor", first, entry("cursor", HTTP)).unchanged
    rotated = entry("cursor", Http(HTTP.url, "n3w"))
    with pytest.raises(ConflictError) as refused:
        merge("cursor", first, rotated)
    # It names what the old entry reaches, never its token.
    assert "url http://127.0.0.1:8765/mcp" in str(refused.value) and "t0k3n" not in str(refused.value)
    assert "--force" in str(refused.value)
    forced = merge("cursor", first, rotated, force=True)
    assert forced.replaced and json.loads(forced.text)["mcpServers"]["ipybox"]["headers"] == {
        "Authorization": "Bearer n3w"
    }
    codex = merge("codex", None, entry("codex", STDIO)).text
    with pytest.raises(ConflictError, match="command ipybox mcp --workspace /home/me/project"):
        merge("codex", codex, entry("codex", HTTP))
    assert 'url = "http://127.0.0.1:8765/mcp"' in merge("codex", codex, entry("codex", HTTP), force=True).text


@pytest.mark.parametrize(
    ("client", "text", "problem"),
    [
        ("vscode", '{"servers": {}, // mine\n}', "is not plain JSON (line 1, column 17"),
        ("claude", "[1, 2]", "is not a JSON object"),
        ("cursor", '{"mcpServers": []}', '"mcpServers" that is not an object'),
        ("codex", "[mcp_servers\n", "is not valid TOML"),
        ("codex", 'mcp_servers = "none"\n', "mcp_servers that is not a table"),
    ],
)
def test_a_file_ipybox_cant_merge_into_is_refused_with_why(client: Client, text: str, problem: str) -> None:
    with pytest.raises(BadFileError, match="add the entry by hand") as refused:
        merge(client, text, entry(client, STDIO))
    assert problem in str(refused.value)


# -- the command ----------------------------------------------------------------------------------------


def test_the_stdio_command_is_the_bare_name_only_when_path_finds_this_ipybox(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ours, other = tmp_path / "venv" / "bin", tmp_path / "old" / "bin"
    for directory in (ours, other):
        directory.mkdir(parents=True)
        (directory / "ipybox").write_text("#!/bin/sh\n")
        (directory / "ipybox").chmod(0o755)
    monkeypatch.setattr(sys, "argv", [str(ours / "ipybox"), "connect"])
    monkeypatch.setenv("PATH", f"{ours}{os.pathsep}{other}")
    assert connect.ipybox_command() == ("ipybox", ())
    # Claude Desktop starts servers with the desktop session's PATH: always the path.
    assert connect.ipybox_command(absolute=True) == (str(ours / "ipybox"), ())
    # Another installation first on PATH would serve another version; none on PATH can't be started.
    monkeypatch.setenv("PATH", f"{other}{os.pathsep}{ours}")
    assert connect.ipybox_command() == (str(ours / "ipybox"), ())
    monkeypatch.setenv("PATH", str(tmp_path))
    assert connect.ipybox_command() == (str(ours / "ipybox"), ())


def test_the_client_files_are_where_each_client_reads_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project, home = tmp_path / "project", tmp_path / "home"
    project.mkdir()
    home.mkdir()
    for name in ("CODEX_HOME", "XDG_CONFIG_HOME", "APPDATA"):
        monkeypatch.delenv(name, raising=False)
    clients: tuple[Client, ...] = ("claude", "cursor", "vscode", "codex", "desktop")
    where = {client: connect.client_file(client, project, home, platform="linux").path for client in clients}
    assert where == {
        "claude": project / ".mcp.json",
        "cursor": project / ".cursor" / "mcp.json",
        "vscode": project / ".vscode" / "mcp.json",
        "codex": home / ".codex" / "config.toml",
        "desktop": home / ".config" / "Claude" / "claude_desktop_config.json",
    }
    mac = connect.client_file("desktop", project, home, platform="darwin").path
    assert mac == home / "Library" / "Application Support" / "Claude" / "claude_desktop_config.json"
    monkeypatch.setenv("CODEX_HOME", str(tmp_path / "codex"))
    assert connect.client_file("codex", project, home).path == tmp_path / "codex" / "config.toml"
    with pytest.raises(ConnectError, match="prints the entry only"):
        connect.client_file("json", project, home)


@pytest.fixture
def pinned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A workspace (not running) whose HTTP endpoint's port is pinned, and the current directory a project."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "ipybox.toml").write_text("[sandbox]\nenabled = false\n\n[endpoints]\nport = 18765\n")
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)
    return workspace


def test_http_with_a_pinned_port_needs_no_running_workspace_and_persists_its_token(
    pinned: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["connect", "cursor", "--http", "-w", str(pinned)]) == 0
    token_file = pinned / ".ipybox" / "mcp_token"
    token = token_file.read_text().strip()
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(token_file.parent.stat().st_mode) == 0o700
    out = capsys.readouterr()
    assert json.loads(out.out) == {
        "mcpServers": {
            "ipybox": {"url": "http://127.0.0.1:18765/mcp", "headers": {"Authorization": f"Bearer {token}"}}
        }
    }
    assert "holds the workspace's bearer token" in out.err
    # The same token the next time (an `ipybox up` reads it the same way), until it is rotated.
    assert mcp_token.load_or_create(StatePaths.of(pinned)) == token
    assert main(["token", "rotate", "-w", str(pinned)]) == 0
    assert "the next `ipybox up` serves it" in capsys.readouterr().out
    assert token_file.read_text().strip() != token


def test_http_without_a_pinned_port_or_a_running_workspace_says_what_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "ipybox.toml").write_text("[sandbox]\nenabled = false\n")
    assert main(["connect", "claude", "--http", "-w", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(
        f"ipybox: ipybox is not running in {tmp_path}, and its HTTP endpoint gets a new port"
    )
    assert "`ipybox up -d" in err and "[endpoints] port = N" in err and "over stdio" in err
    assert not (tmp_path / ".ipybox").exists()  # nothing made for an entry that was not given


def test_write_backs_up_the_file_refuses_a_different_entry_and_keeps_the_token_private(
    pinned: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mcp_json = Path(".mcp.json")
    others = {"mcpServers": {"time": {"command": "uvx", "args": ["mcp-server-time"]}}}
    mcp_json.write_text(json.dumps(others))
    mcp_json.chmod(0o644)

    assert main(["connect", "claude", "--http", "--write", "-w", str(pinned)]) == 0
    out = capsys.readouterr()
    backup = Path.cwd() / ".mcp.json.bak"
    assert (
        out.out
        == f"added the ipybox entry to {Path.cwd() / '.mcp.json'} (the file as it was is in {backup})\n"
    )
    assert json.loads(backup.read_text()) == others and stat.S_IMODE(backup.stat().st_mode) == 0o600
    written = json.loads(mcp_json.read_text())["mcpServers"]
    assert written["time"] == others["mcpServers"]["time"]
    assert written["ipybox"]["url"] == "http://127.0.0.1:18765/mcp"
    assert stat.S_IMODE(mcp_json.stat().st_mode) == 0o600  # it holds the token now

    assert main(["connect", "claude", "--http", "--write", "-w", str(pinned)]) == 0
    assert "already has this ipybox entry: nothing written" in capsys.readouterr().out

    assert main(["token", "rotate", "-w", str(pinned)]) == 0
    capsys.readouterr()
    before = mcp_json.read_text()
    assert main(["connect", "claude", "--http", "--write", "-w", str(pinned)]) == 1
    err = capsys.readouterr().err
    assert (
        "already has a different 'ipybox' entry (url http://127.0.0.1:18765/mcp): --force replaces it" in err
    )
    assert mcp_json.read_text() == before
    assert main(["connect", "claude", "--http", "--write", "--force", "-w", str(pinned)]) == 0
    assert "replaced the ipybox entry in" in capsys.readouterr().out
    new_token = (pinned / ".ipybox" / "mcp_token").read_text().strip()
    assert (
        json.loads(mcp_json.read_text())["mcpServers"]["ipybox"]["headers"]["Authorization"]
        == f"Bearer {new_token}"
    )
    assert (
        json.loads(backup.read_text())["mcpServers"]["ipybox"] == json.loads(before)["mcpServers"]["ipybox"]
    )


def test_write_makes_the_clients_directory_and_refuses_a_symlinked_file(
    pinned: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["connect", "vscode", "--write", "-w", str(pinned)]) == 0
    written = json.loads(Path(".vscode/mcp.json").read_text())["servers"]["ipybox"]
    assert written["type"] == "stdio" and written["args"][-2:] == ["--workspace", str(pinned)]
    assert stat.S_IMODE(Path(".vscode/mcp.json").stat().st_mode) == 0o644  # no token in it
    assert not Path(".vscode/mcp.json.bak").exists()  # nothing to back up
    capsys.readouterr()
    target = tmp_path / "dotfiles-mcp.json"
    target.write_text("{}")
    Path(".cursor").mkdir()
    Path(".cursor/mcp.json").symlink_to(target)
    assert main(["connect", "cursor", "--write", "-w", str(pinned)]) == 1
    assert f"{Path.cwd() / '.cursor' / 'mcp.json'} is a symlink (to {target})" in capsys.readouterr().err
    assert target.read_text() == "{}" and Path(".cursor/mcp.json").is_symlink()


def test_write_into_codex_config_merges_into_codex_home(
    pinned: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    codex_home = tmp_path / "codex"
    codex_home.mkdir()
    (codex_home / "config.toml").write_text('model = "o3"\n')
    monkeypatch.setenv("CODEX_HOME", str(codex_home))
    assert main(["connect", "codex", "--write", "-w", str(pinned)]) == 0
    text = (codex_home / "config.toml").read_text()
    assert text.startswith('model = "o3"\n\n[mcp_servers.ipybox]\n') and f'"--workspace", "{pinned}"]' in text
    assert (codex_home / "config.toml.bak").read_text() == 'model = "o3"\n'


def test_usage_errors_of_connect_name_the_option(pinned: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["connect", "claude", "--force"])
    assert "--force is for --write" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["connect", "claude", "--http", "--stdio"])
    assert "not allowed with argument" in capsys.readouterr().err
    assert main(["connect", "json", "--write", "-w", str(pinned)]) == 1
    assert "name a client to --write its file" in capsys.readouterr().err
    assert main(["connect", "desktop", "--http", "-w", str(pinned)]) == 1
    assert "stdio" in capsys.readouterr().err


def test_a_token_file_that_holds_no_token_is_replaced(tmp_path: Path) -> None:
    paths = StatePaths(tmp_path / ".ipybox")
    first = mcp_token.load_or_create(paths)
    assert len(first) == 43 and mcp_token.load_or_create(paths) == first
    (paths.dir / "mcp_token").write_text("short\n")
    replaced = mcp_token.load_or_create(paths)
    assert replaced != first and len(replaced) == 43
    assert stat.S_IMODE((paths.dir / "mcp_token").stat().st_mode) == 0o600
