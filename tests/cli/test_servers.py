"""`ipybox server add / remove / list`: in-process for what needs no running workspace, and against a
workspace started with `ipybox up -d` for what the workspace does with the change."""

from __future__ import annotations

import json
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ipybox.cli.main import main
from tests.cli.test_main import ipybox
from tests.servers.params import EDGE_SERVER, time_server
from tests.supervisor.workspaces import make_workspace

WORKSPACE = """\
# A workspace.
[sandbox]
enabled = {sandboxed}

[servers.edge]
command = "edge"
"""


def workspace(tmp_path: Path, *, sandboxed: bool = False) -> Path:
    (tmp_path / "ipybox.toml").write_text(WORKSPACE.format(sandboxed=str(sandboxed).lower()))
    return tmp_path


def servers(directory: Path) -> dict[str, Any]:
    table: dict[str, Any] = tomllib.loads((directory / "ipybox.toml").read_text())["servers"]
    return table


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_add_writes_the_table_and_says_ipybox_up_starts_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = workspace(tmp_path)
    code, out, err = run(capsys, "server", "add", "time", "-w", str(directory), "--", "sh", "mcp-server-time")
    assert (code, err) == (0, "")
    assert servers(directory)["time"] == {"command": "sh", "args": ["mcp-server-time"]}
    assert out == (
        f"added [servers.time] to {directory / 'ipybox.toml'}:8\n"
        f"ipybox is not running in {directory}: `ipybox up` starts it and generates mcptools.time\n"
    )


def test_the_command_keeps_its_own_options_and_double_dashes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = workspace(tmp_path)
    argv = ["npx", "-y", "@scope/pkg", "--", "--flag=${VALUE}"]
    code, _, _ = run(capsys, "server", "add", "pkg", "--workspace", str(directory), "--", *argv)
    assert code == 0 and servers(directory)["pkg"] == {"command": "npx", "args": argv[1:]}


def test_in_a_sandboxed_workspace_a_stdio_server_is_sandboxed_unless_no_sandbox_is_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = workspace(tmp_path, sandboxed=True)
    assert run(capsys, "server", "add", "boxed", "-w", str(directory), "--", "x")[0] == 0
    code, _, err = run(capsys, "server", "add", "plain", "--no-sandbox", "-w", str(directory), "--", "x")
    assert code == 0 and "runs unsandboxed on the host" in err
    assert servers(directory)["boxed"]["sandbox"] is True and servers(directory)["plain"]["sandbox"] is False


@pytest.mark.parametrize("runner", ["npx", "/usr/local/bin/uvx"])
def test_a_sandboxed_server_run_by_a_package_runner_is_warned_that_it_will_have_no_network(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], runner: str
) -> None:
    directory = workspace(tmp_path, sandboxed=True)
    code, _, err = run(capsys, "server", "add", "pkg", "-w", str(directory), "--", runner, "some-server")
    assert code == 0 and servers(directory)["pkg"]["sandbox"] is True
    assert "a sandboxed server has no network: install the server first" in err and "--no-sandbox" in err
    code, _, err = run(
        capsys, "server", "add", "open", "--no-sandbox", "-w", str(directory), "--", runner, "s"
    )
    assert code == 0 and "has no network" not in err


def test_a_url_server_takes_headers_and_a_transport(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = workspace(tmp_path)
    (directory / ".env").write_text("GH_TOKEN=secret-in-dotenv\n")
    argv = ["--url", "https://example.com/mcp", "--header", "Authorization: Bearer ${GH_TOKEN}"]
    code, _, err = run(capsys, "server", "add", "gh", "-w", str(directory), *argv, "--transport", "http")
    assert (code, err) == (0, "")
    assert servers(directory)["gh"] == {
        "url": "https://example.com/mcp",
        "headers": {"Authorization": "Bearer ${GH_TOKEN}"},
        "type": "streamable_http",
    }
    assert "secret-in-dotenv" not in (directory / "ipybox.toml").read_text()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["ipybox", "--", "x"], "the server name 'ipybox' is reserved"),
        (["x"], "give the server's command after --, e.g. `ipybox server add x -- uvx mcp-server-time`"),
        (["x", "--env", "NOEQUALS", "--", "c"], "--env 'NOEQUALS': expected NAME=VALUE"),
        (["x", "--env", "A=1", "--env", "A=2", "--", "c"], "--env A is given twice"),
        (["x", "--url", "https://a", "--header", "NoColon"], "--header 'NoColon': expected 'NAME: VALUE'"),
        (["x", "--url", "ftp://a"], "--url: 'ftp://a' is not an http:// or https:// URL"),
        (
            ["x", "--url", "https://a", "--transport", "ws"],
            "--transport: Input should be 'streamable_http' or 'sse'",
        ),
        (
            ["x", "--url", "https://a", "--", "c"],
            "give either --url URL (a remote server) or a command after --",
        ),
        (["x", "--url", "https://a", "--no-sandbox"], "--no-sandbox is for stdio servers"),
        (["x", "--transport", "sse", "--", "c"], "--transport is for --url servers"),
        (["x", "c", "--", "d"], "give the server's command once: after --"),
        (["x", "--", "c"], "has a server 'x' already"),
    ],
)
def test_bad_input_is_one_clear_line_and_nothing_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    directory = workspace(tmp_path)
    (directory / "ipybox.toml").write_text(
        WORKSPACE.format(sandboxed="false") + '[servers.x]\ncommand = "c"\n'
    )
    before = (directory / "ipybox.toml").read_bytes()
    code, out, err = run(capsys, "server", "add", "-w", str(directory), *argv)
    assert code == 1 and out == ""
    assert err.startswith("ipybox: ") and message in err and err.count("\n") == 1, err
    assert (directory / "ipybox.toml").read_bytes() == before


def test_an_existing_server_is_replaced_only_with_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = workspace(tmp_path)
    code, _, err = run(capsys, "server", "add", "edge", "-w", str(directory), "--", "other")
    assert code == 1 and "--force replaces it, `ipybox server remove edge` removes it" in err
    code, out, _ = run(capsys, "server", "add", "edge", "--force", "-w", str(directory), "--", "other")
    assert code == 0 and out.startswith("replaced [servers.edge]")
    assert servers(directory) == {"edge": {"command": "other"}}
    assert (directory / "ipybox.toml").read_text().startswith("# A workspace.\n")


def test_placeholders_are_written_as_given_and_unset_ones_are_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = workspace(tmp_path)
    (directory / ".env").write_text("IN_DOTENV=1\n")
    monkeypatch.setenv("IN_ENVIRONMENT", "1")
    monkeypatch.delenv("SET_NOWHERE", raising=False)
    env = ["--env", "A=${IN_DOTENV}", "--env", "B=${IN_ENVIRONMENT}", "--env", "C=${SET_NOWHERE}"]
    code, _, err = run(capsys, "server", "add", "s", "-w", str(directory), *env, "--", "sh")
    assert code == 0
    assert servers(directory)["s"]["env"] == {
        "A": "${IN_DOTENV}",
        "B": "${IN_ENVIRONMENT}",
        "C": "${SET_NOWHERE}",
    }
    assert err == (
        f"ipybox: warning: ${{SET_NOWHERE}} (in --env C) is set neither in this environment nor in "
        f"{directory / '.env'}: the server starts once it is set where the workspace runs\n"
    )


def test_a_secret_given_literally_gets_a_hint_to_use_a_placeholder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = workspace(tmp_path)
    code, _, err = run(
        capsys, "server", "add", "gh", "-w", str(directory), "--env", "GITHUB_TOKEN=ghp_x", "--", "x"
    )
    assert code == 0 and err.startswith(
        "ipybox: hint: --env GITHUB_TOKEN is written into ipybox.toml as given"
    )
    assert "--env GITHUB_TOKEN='${GITHUB_TOKEN}'" in err
    url = ["--url", "https://example.com/mcp", "--header", "Authorization: Bearer ghp_x"]
    code, _, err = run(capsys, "server", "add", "remote", "-w", str(directory), *url)
    assert code == 0 and "--header 'Authorization: Bearer ${REMOTE_TOKEN}'" in err


def test_a_directory_without_ipybox_toml_points_at_ipybox_init(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "server", "add", "x", "-w", str(tmp_path), "--", "c")
    assert (
        code == 1
        and err
        == f"ipybox: {tmp_path} is not a workspace: it has no ipybox.toml (`ipybox init -w {tmp_path}` writes one)\n"
    )


def test_add_and_remove_print_a_json_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = workspace(tmp_path)
    code, out, _ = run(capsys, "server", "add", "t", "--disabled", "--json", "-w", str(directory), "--", "sh")
    assert code == 0
    assert json.loads(out) == {
        "name": "t",
        "action": "added",
        "config": str(directory / "ipybox.toml"),
        "line": 8,
        "server": {"command": "sh", "enabled": False},
        "running": False,
        "outcome": None,
        "modules": [],
        "ok": True,
        "warnings": [],
    }
    code, out, _ = run(capsys, "server", "remove", "t", "--json", "-w", str(directory))
    assert code == 0 and json.loads(out)["action"] == "removed" and json.loads(out)["line"] == 8


def test_remove_takes_the_table_out_and_an_unknown_name_lists_the_configured_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = workspace(tmp_path)
    code, _, err = run(capsys, "server", "remove", "nope", "-w", str(directory))
    assert code == 1 and err.endswith("it has no server 'nope' (its servers are edge)\n")
    code, out, _ = run(capsys, "server", "remove", "edge", "-w", str(directory))
    assert code == 0 and out == f"removed [servers.edge] from {directory / 'ipybox.toml'}\n"
    assert (directory / "ipybox.toml").read_text() == "# A workspace.\n[sandbox]\nenabled = false\n"


def test_list_shows_each_server_and_that_the_workspace_is_not_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = workspace(tmp_path, sandboxed=True)
    run(
        capsys,
        "server",
        "add",
        "remote",
        "-w",
        str(directory),
        "--url",
        "https://example.com/sse",
        "--disabled",
    )
    run(capsys, "server", "add", "boxed", "-w", str(directory), "--", "node", "server.js", "a b")
    code, out, _ = run(capsys, "server", "list", "-w", str(directory))
    assert code == 0
    assert out == (
        "edge    enabled           stdio: edge\n"
        "remote  disabled          url (sse): https://example.com/sse\n"
        "boxed   enabled           stdio, sandboxed: node server.js 'a b'\n"
        f"ipybox is not running in {directory} (`ipybox up` starts these servers)\n"
    )
    code, out, _ = run(capsys, "server", "list", "--json", "-w", str(directory))
    listing = json.loads(out)
    assert listing["running"] is False and [s["name"] for s in listing["servers"]] == [
        "edge",
        "remote",
        "boxed",
    ]
    assert listing["servers"][2] == {
        "name": "boxed",
        "enabled": True,
        "kind": "stdio",
        "command": ["node", "server.js", "a b"],
        "url": None,
        "transport": None,
        "sandboxed": True,
        "line": 12,
        "state": None,
        "tools": None,
        "error": None,
    }


def test_add_maps_a_hyphenated_name_and_says_so_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = workspace(tmp_path)
    code, out, err = run(capsys, "server", "add", "my-server", "-w", str(directory), "--", "sh")
    assert code == 0 and servers(directory)["my_server"] == {"command": "sh"}
    assert err == (
        "ipybox: 'my-server' is the server 'my_server' in ipybox: a server's name is its Python package "
        "(mcptools.my_server), so ipybox.toml, rules and `ipybox server` use 'my_server'\n"
    )
    assert out.startswith(f"added [servers.my_server] to {directory / 'ipybox.toml'}:")
    code, _, err = run(capsys, "server", "add", "my.server", "-w", str(directory), "--", "sh")
    assert code == 1 and "has a server 'my_server' (the name 'my.server' maps to) already" in err
    code, out, _ = run(capsys, "server", "remove", "my-server", "-w", str(directory))
    assert code == 0 and "my_server" not in servers(directory)


IMPORTED_WORKSPACE = """\
# A workspace.
[sandbox]
enabled = false

# The edge server, for tests.
[servers.edge]
command = "edge"
# args = ["--verbose"]

# Kernel settings.
[kernel]
timeout = 30
"""
MCP_JSON = {
    "mcpServers": {
        "time-server": {"type": "stdio", "command": "mcp-server-time", "args": ["--local-timezone", "UTC"]},
        "github": {
            "type": "http",
            "url": "https://api.example.com/mcp/",
            "headers": {"Authorization": "Bearer ghp_1"},
        },
        "bad": {"type": "sse", "command": "x"},
    }
}


def test_import_writes_every_server_in_one_edit_keeping_the_file_and_moves_secrets_to_dotenv(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GITHUB_TOKEN", raising=False)
    (tmp_path / "ipybox.toml").write_text(IMPORTED_WORKSPACE)
    (tmp_path / ".env").write_text("OTHER=1")
    (tmp_path / ".mcp.json").write_text(json.dumps(MCP_JSON))
    code, out, _ = run(capsys, "server", "import", str(tmp_path / ".mcp.json"), "-w", str(tmp_path))
    assert code == 1  # 'bad' was skipped for a reason (the others are written)
    assert (tmp_path / "ipybox.toml").read_text() == (
        "# A workspace.\n[sandbox]\nenabled = false\n\n# The edge server, for tests.\n[servers.edge]\n"
        'command = "edge"\n# args = ["--verbose"]\n\n[servers.time_server]\ncommand = "mcp-server-time"\n'
        'args = ["--local-timezone", "UTC"]\n\n[servers.github]\nurl = "https://api.example.com/mcp/"\n'
        'headers = { Authorization = "Bearer ${GITHUB_TOKEN}" }\ntype = "streamable_http"\n\n'
        "# Kernel settings.\n[kernel]\ntimeout = 30\n"
    )
    assert (tmp_path / ".env").read_text() == (
        "OTHER=1\n# Added by `ipybox server import`: secrets of the servers it imported\nGITHUB_TOKEN='ghp_1'\n"
    )
    assert (tmp_path / ".gitignore").read_text() == ".env\n"
    config = tmp_path / "ipybox.toml"
    assert out.splitlines()[:6] == [
        f"imported 2 servers from {tmp_path / '.mcp.json'} into {config}",
        "  time-server -> time_server  stdio  (line 10)",
        "                 named time_server (its package mcptools.time_server): 'time-server' is not a Python "
        "identifier",
        "                 warning: COMMAND mcp-server-time is not on this PATH (the server starts once it is)",
        "  github      -> github       streamable_http  (line 14)",
        "                 headers Authorization: the literal value was moved to .env as GITHUB_TOKEN",
    ]
    assert "skipped:\n  bad  type: 'sse' is a remote transport, and this server has 'command'" in out
    assert out.endswith(
        f"ipybox is not running in {tmp_path}: `ipybox up` starts them\nadded .env to {tmp_path / '.gitignore'} "
        "(it holds secrets now)\n"
    )
    # Again: what is there already is skipped, and that is no failure.
    code, out, _ = run(
        capsys, "server", "import", str(tmp_path / ".mcp.json"), "--only", "time-server", "-w", str(tmp_path)
    )
    assert code == 0
    assert out == (
        f"imported nothing from {tmp_path / '.mcp.json'}\nskipped:\n"
        "  time-server  ipybox.toml has a server 'time_server' ('time-server' maps to it) already (--force replaces it)\n"
    )


def test_import_dry_run_and_a_refused_write_leave_ipybox_toml_and_dotenv_as_they_were(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "ipybox.toml").write_text(IMPORTED_WORKSPACE)
    (tmp_path / ".mcp.json").write_text(json.dumps(MCP_JSON))
    code, out, _ = run(
        capsys, "server", "import", str(tmp_path / ".mcp.json"), "--dry-run", "--json", "-w", str(tmp_path)
    )
    report = json.loads(out)
    assert [(s["original"], s["name"], s["action"]) for s in report["imported"]] == [
        ("time-server", "time_server", None),
        ("github", "github", None),
    ]
    assert report["dry_run"] is True and report["ok"] is False and report["skipped"][0]["original"] == "bad"
    assert report["imported"][1]["dotenv"] == ["GITHUB_TOKEN"]  # names only: values are secrets
    assert sorted(p.name for p in tmp_path.iterdir()) == [".mcp.json", "ipybox.toml"]
    # ipybox.toml is refused once .env is written (ipybox does not write through a symlink): .env is put back.
    (tmp_path / "real.toml").write_text(IMPORTED_WORKSPACE)
    (tmp_path / "ipybox.toml").unlink()
    (tmp_path / "ipybox.toml").symlink_to("real.toml")
    (tmp_path / ".env").write_text("OTHER=1\n")
    code, out, err = run(capsys, "server", "import", str(tmp_path / ".mcp.json"), "-w", str(tmp_path))
    assert code == 1 and out == ""
    assert err.startswith(f"ipybox: {tmp_path / 'ipybox.toml'} was not changed: it is a symlink")
    assert (tmp_path / "real.toml").read_text() == IMPORTED_WORKSPACE
    assert (tmp_path / ".env").read_text() == "OTHER=1\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".env", ".mcp.json", "ipybox.toml", "real.toml"]


def test_import_needs_a_file_or_a_client_and_names_the_paths_it_tried(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CODEX_HOME", str(tmp_path / "codex"))
    (tmp_path / "ipybox.toml").write_text(IMPORTED_WORKSPACE)
    code, _, err = run(capsys, "server", "import", "-w", str(tmp_path))
    assert code == 1 and err.startswith(
        "ipybox: give the configuration to import: a FILE (e.g. .mcp.json) or"
    )
    code, _, err = run(capsys, "server", "import", "--from", "codex", "-w", str(tmp_path))
    assert code == 1 and err == (
        f"ipybox: --from codex: no configuration found (tried {tmp_path / 'codex' / 'config.toml'}); give the "
        "file instead: `ipybox server import FILE`\n"
    )


def test_the_clients_the_command_line_offers_are_those_import_reads() -> None:
    from ipybox.cli.servers import SOURCES as OFFERED
    from ipybox.config.server_import import SOURCES as READ

    assert OFFERED == READ


# Against a running workspace

TAG = "cli-servers"


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    directory = make_workspace(tmp_path_factory.mktemp("ws"), TAG)
    up = ipybox("up", "-d", str(directory))
    assert up.returncode == 0, up.stderr
    yield directory
    ipybox("down", str(directory))


@pytest.mark.integration
def test_add_to_a_running_workspace_prints_the_modules_and_a_kernel_imports_them(running: Path) -> None:
    server = time_server()
    done = ipybox("server", "add", "clock", "-w", str(running), "--", server["command"], *server["args"])
    assert done.returncode == 0, done.stderr
    assert "mcptools.clock: convert_time, get_current_time\n" in done.stdout
    assert "`from mcptools.clock import convert_time`" in done.stdout
    code = "from mcptools.clock import get_current_time\nprint(get_current_time.Params.model_fields)"
    imported = ipybox("exec", "--workspace", str(running), code)
    assert imported.returncode == 0 and "timezone" in imported.stdout, imported.stderr


@pytest.mark.integration
def test_a_server_that_fails_to_start_stays_in_the_file_and_exits_1(running: Path) -> None:
    done = ipybox("server", "add", "broken", "-w", str(running), "--", str(running / "no-such-program"))
    assert done.returncode == 1
    assert (
        f"[servers.broken] is in {running / 'ipybox.toml'}, but the server failed to start: " in done.stderr
    )
    assert "`ipybox server remove broken` removes it" in done.stderr
    assert "broken" in servers(running)
    listed = ipybox("server", "list", "-w", str(running))
    assert listed.stdout.startswith("edge    ready, ") and "broken  failed " in listed.stdout
    removed = ipybox("server", "remove", "broken", "-w", str(running))
    assert removed.returncode == 0, removed.stderr


@pytest.mark.integration
def test_remove_from_a_running_workspace_removes_the_package(running: Path) -> None:
    added = ipybox("server", "add", "edge2", "-w", str(running), "--", sys.executable, str(EDGE_SERVER))
    assert added.returncode == 0, added.stderr
    assert (running / "mcptools" / "edge2" / "__init__.py").exists()
    done = ipybox("server", "remove", "edge2", "-w", str(running))
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith("the workspace stopped it and removed its package mcptools.edge2\n")
    assert not (running / "mcptools" / "edge2").exists()


@pytest.mark.integration
def test_list_shows_the_live_state_of_each_server(running: Path) -> None:
    listed = ipybox("server", "list", "--json", "-w", str(running))
    entries = {entry["name"]: entry for entry in json.loads(listed.stdout)["servers"]}
    assert entries["edge"]["state"] == "ready" and entries["edge"]["tools"] > 0


@pytest.mark.integration
def test_import_of_an_mcp_json_with_hyphenated_names_starts_them_and_a_kernel_calls_a_tool(
    running: Path,
) -> None:
    # As Claude Code writes a project's servers; one server only, to keep the test's wall time down.
    mcp_json = {
        "mcpServers": {"time-server": {"type": "stdio", **time_server(), "env": {"API_TOKEN": "t-1"}}}
    }
    (running / ".mcp.json").write_text(json.dumps(mcp_json, indent=2))
    # Rules name a server by its name in ipybox.
    with (running / "ipybox.toml").open("a") as file:
        file.write(
            '\n[[approval.rules]]\nserver = "time_server"\ntool = "get_current_time"\ndecision = "allow"\n'
        )
    done = ipybox("server", "import", ".mcp.json", cwd=running)
    assert done.returncode == 0, done.stderr + done.stdout
    assert f"imported 1 server from .mcp.json into {running / 'ipybox.toml'}\n" in done.stdout
    assert "  time-server -> time_server  stdio  (line " in done.stdout and "  ready\n" in done.stdout
    assert "API_TOKEN='t-1'" in (running / ".env").read_text()
    assert 'server = "time_server"' in (running / "ipybox.toml").read_text()  # the rule is kept
    code = (
        "from mcptools.time_server import get_current_time\n"
        "print(get_current_time.run(get_current_time.Params(timezone='UTC')))"
    )
    called = ipybox("exec", "--workspace", str(running), code)
    assert called.returncode == 0 and "UTC" in called.stdout, called.stderr


def test_a_command_the_server_would_not_find_is_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "ws").mkdir()
    directory = workspace(tmp_path / "ws")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "server").write_text("")
    monkeypatch.chdir(tmp_path)
    # Relative to where the command runs, not to the server's working directory (the workspace).
    code, _, err = run(capsys, "server", "add", "rel", "-w", "ws", "--", "bin/server")
    assert code == 0 and err == (
        f"ipybox: warning: COMMAND bin/server is relative to the server's working directory {directory}, "
        f"where there is no such file; give {tmp_path / 'bin' / 'server'}\n"
    )
    code, _, err = run(capsys, "server", "add", "bare", "-w", "ws", "--", "no-such-program-xyz")
    assert code == 0 and err == (
        "ipybox: warning: COMMAND no-such-program-xyz is not on this PATH (the server starts once it is)\n"
    )
