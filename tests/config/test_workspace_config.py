"""Loading `ipybox.toml`: the models, every kind of error with its place, and overrides from the
environment and `.env`."""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import ValidationError

from ipybox.config import (
    ConfigError,
    WorkspaceConfig,
    check_server_name,
    load_config,
    suggest_server_name,
)
from ipybox.config.servers import RemoteServerSection, StdioServerSection, parse_server_section
from ipybox.mcp_client.params import HttpServerParams, StdioServerParams, parse_server_params
from ipybox.rules import ToolCall
from ipybox.sandbox import SandboxPolicy
from tests.config.conftest import ROOT

WriteConfig = Callable[[str], Path]

FULL = """\
#:schema ./schemas/ipybox.schema.json
[workspace]
name = "demo-ws"
mcptools_dir = "tools"
images_dir = "plots"
state_dir = ".state"

[kernel]
env = { API_BASE = "http://localhost:8000", TOKEN = "${API_TOKEN}" }
warm_pool = 2
timeout = 30.5

[sandbox]
enabled = false
[sandbox.filesystem]
denyRead = ["~/.secret"]
allow_write = ["/data"]
[sandbox.network]
deniedDomains = ["evil.example"]

[servers.fs]
command = "npx"
args = ["-y", "@modelcontextprotocol/server-filesystem", "."]
env = { DEBUG = "1" }
sandbox = true

[servers.jail]
command = "/usr/bin/tool"
cwd = "sub"
[servers.jail.sandbox]
filesystem = { allowWrite = ["/data/out"] }

[servers.github]
url = "https://api.githubcopilot.com/mcp/"
headers = { Authorization = "Bearer ${GITHUB_TOKEN}" }
type = "sse"
enabled = false

[approval]
default = "deny"
ask_timeout = 15

[[approval.rules]]
id = "reads"
tool = "read_*"
decision = "allow"
match = [{ server = "fs", tool = "read_file" }]
not_match = [{ server = "fs", tool = "write_file" }]

[endpoints]
mcp = false
host = "::1"
port = 8765
unix_socket = true
"""


def test_full_file(write_config: WriteConfig, workspace: Path) -> None:
    config = load_config(write_config(FULL))
    assert config.path == workspace / "ipybox.toml"
    assert config.root == workspace
    assert config.name == "demo-ws"
    assert config.resolve(config.workspace.mcptools_dir) == workspace / "tools"
    assert (config.workspace.images_dir, config.workspace.state_dir) == ("plots", ".state")
    assert config.kernel.env == {"API_BASE": "http://localhost:8000", "TOKEN": "${API_TOKEN}"}
    assert (config.kernel.warm_pool, config.kernel.timeout) == (2, 30.5)
    assert config.sandbox.enabled is False
    assert config.sandbox.filesystem.deny_read == ["~/.secret"]
    assert config.sandbox.filesystem.allow_write == ["/data"]  # snake_case accepted too
    assert config.sandbox.network.denied_domains == ["evil.example"]
    assert config.sandbox.policy() == SandboxPolicy.model_validate(
        {
            "filesystem": {"denyRead": ["~/.secret"], "allowWrite": ["/data"]},
            "network": {"deniedDomains": ["evil.example"]},
        }
    )
    assert list(config.servers) == ["fs", "jail", "github"]
    assert list(config.enabled_servers()) == ["fs", "jail"]
    assert config.approval.default == "deny" and config.approval.ask_timeout == 15
    assert config.approval.decide(ToolCall("fs", "read_file", {"path": "a"})).decision == "allow"
    assert config.approval.decide(ToolCall("fs", "write_file", {"path": "a"})).decision == "deny"
    endpoints = config.endpoints
    assert (endpoints.mcp, endpoints.host, endpoints.port, endpoints.unix_socket) == (
        False,
        "::1",
        8765,
        True,
    )


def test_defaults(write_config: WriteConfig, workspace: Path) -> None:
    write_config("")
    config = load_config(workspace)  # the directory works as well as the file
    assert config.name == "demo"  # the directory's name
    assert config.workspace.name is None
    assert (config.workspace.mcptools_dir, config.workspace.images_dir) == ("mcptools", "images")
    assert config.workspace.state_dir == ".ipybox"
    assert (config.kernel.env, config.kernel.warm_pool, config.kernel.timeout) == ({}, 1, 120)
    assert config.sandbox.enabled is True
    assert config.sandbox.policy() == SandboxPolicy()
    assert config.servers == {}
    assert (config.approval.default, config.approval.rules) == ("ask", [])
    endpoints = config.endpoints
    assert (endpoints.mcp, endpoints.host, endpoints.port, endpoints.unix_socket) == (
        True,
        "127.0.0.1",
        0,
        False,
    )


def test_server_params(write_config: WriteConfig, workspace: Path) -> None:
    config = load_config(write_config(FULL))
    assert config.server_params("fs") == {
        "command": "npx",
        "args": ["-y", "@modelcontextprotocol/server-filesystem", "."],
        "env": {"DEBUG": "1"},
        "cwd": str(workspace),
        # The workspace's state (`state_dir = ".state"`) is hidden from its servers as from its kernels.
        "sandbox": SandboxPolicy(
            filesystem={"denyRead": [str(workspace / ".state")], "denyWrite": [str(workspace / ".state")]}
        ).model_dump(by_alias=True),
    }
    jail = config.server_params("jail")
    assert jail.pop("sandbox")["filesystem"]["allowWrite"] == ["/data/out"]
    assert jail == {"command": "/usr/bin/tool", "args": [], "cwd": str(workspace / "sub")}
    # Placeholders stay: they are filled from the host's environment when the server starts.
    assert config.server_params("github") == {
        "url": "https://api.githubcopilot.com/mcp/",
        "headers": {"Authorization": "Bearer ${GITHUB_TOKEN}"},
        "type": "sse",
    }
    assert StdioServerSection(command="x", cwd="rel").server_params() == {
        "command": "x",
        "args": [],
        "cwd": "rel",
    }
    assert RemoteServerSection(url="http://127.0.0.1:9/sse").server_params() == {
        "url": "http://127.0.0.1:9/sse"
    }
    with pytest.raises(KeyError):
        config.server_params("nope")


def test_server_params_are_what_the_mcp_client_takes(write_config: WriteConfig, workspace: Path) -> None:
    config = load_config(write_config(FULL))
    fs = parse_server_params("fs", config.server_params("fs"), environ={})
    assert isinstance(fs, StdioServerParams)
    assert (fs.command, fs.env, fs.cwd) == ("npx", {"DEBUG": "1"}, str(workspace))
    assert fs.sandbox_policy() == SandboxPolicy().guarding(workspace, workspace / ".state", cwd=workspace)
    jail = parse_server_params("jail", config.server_params("jail"), environ={})
    assert isinstance(jail, StdioServerParams) and jail.sandbox is not None
    assert jail.sandbox.filesystem.allow_write == ["/data/out"]
    github = parse_server_params("github", config.server_params("github"), environ={"GITHUB_TOKEN": "t"})
    assert isinstance(github, HttpServerParams)
    assert (github.headers, github.transport) == ({"Authorization": "Bearer t"}, "sse")


def test_server_sandbox_forms(write_config: WriteConfig) -> None:
    config = load_config(write_config(FULL))
    fs, jail, github = config.servers["fs"], config.servers["jail"], config.servers["github"]
    assert fs.is_stdio and not github.is_stdio
    assert fs.sandbox_policy() == SandboxPolicy()  # `true`: the defaults
    assert fs.sandbox is not None and fs.sandbox.policy() == SandboxPolicy()
    jail_policy = jail.sandbox_policy()
    assert jail_policy is not None and jail_policy.filesystem.allow_write == ["/data/out"]
    assert github.sandbox_policy() is None
    assert parse_server_section({"command": "x", "sandbox": False}).sandbox_policy() is None
    assert parse_server_section({"command": "x", "sandbox": {"enabled": False}}).sandbox_policy() is None


def _error(path: Path) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(path)
    error = info.value
    # One exception: no pydantic or TOML error shown chained to it.
    assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__)
    assert not isinstance(error, ValidationError)
    return error


@pytest.mark.parametrize(
    ("text", "line", "column", "reason"),
    [
        pytest.param(
            "[sandbx]\nenabled = true\n",
            1,
            2,
            "unknown key 'sandbx' at the top level (did you mean 'sandbox'?)",
            id="unknown-top-level-table",
        ),
        pytest.param(
            'name = "x"\n',
            1,
            1,
            "unknown key 'name' at the top level (expected one of: workspace, kernel, sandbox, servers, "
            "secrets, approval, provenance, endpoints)",
            id="unknown-top-level-key-without-close-match",
        ),
        pytest.param(
            '[servers.fs]\nargs = []\ncomand = "npx"\n',
            3,
            1,
            "unknown key 'comand' in [servers.fs] (did you mean 'command'?)",
            id="unknown-server-key",
        ),
        pytest.param(
            "[sandbox]\nenabled = true\n[sandbox.filesystem]\ndenyReads = []\n",
            4,
            1,
            "unknown key 'denyReads' in [sandbox.filesystem] (did you mean 'denyRead'?)",
            id="unknown-sandbox-key",
        ),
        pytest.param(
            '[servers.fs]\ncommand = "x"\nsandbox = { network = { allowedDomain = [] } }\n',
            3,
            25,
            "unknown key 'allowedDomain' in [servers.fs.sandbox.network] (did you mean 'allowedDomains'?)",
            id="unknown-key-in-server-sandbox",
        ),
        pytest.param(
            "[kernel]\ntimeout = 10\nwarmpool = 2\n",
            3,
            1,
            "unknown key 'warmpool' in [kernel] (did you mean 'warm_pool'?)",
            id="unknown-kernel-key",
        ),
        pytest.param(
            '[servers.my-server]\ncommand = "x"\n',
            1,
            10,
            "server name 'my-server' is not a valid Python package name (it becomes mcptools/<name>): use "
            "ASCII letters, digits and '_', not starting with a digit, and no Python keyword, e.g. 'my_server'",
            id="server-name-not-identifier",
        ),
        pytest.param(
            '[servers]\nclass = { command = "x" }\n',
            2,
            1,
            "server name 'class' is not a valid Python package name (it becomes mcptools/<name>): use "
            "ASCII letters, digits and '_', not starting with a digit, and no Python keyword, e.g. 'class_'",
            id="server-name-keyword",
        ),
        pytest.param(
            '[servers.fs]\ncommand = "npx"\nurl = "http://127.0.0.1:8000/mcp"\n',
            3,
            1,
            "servers.fs.url: a server has either 'command' (a stdio server) or 'url' (a remote server), not both",
            id="command-and-url",
        ),
        pytest.param(
            "[servers.fs]\nargs = []\n",
            1,
            10,
            "servers.fs: a server needs 'command' (a stdio server) or 'url' (a remote server)",
            id="neither-command-nor-url",
        ),
        pytest.param(
            '[servers.gh]\nurl = "https://example.com/mcp"\nsandbox = true\n',
            3,
            1,
            "servers.gh.sandbox: 'sandbox' is for stdio servers (with 'command'), and this is a url server, "
            "which ipybox does not start",
            id="url-server-with-sandbox",
        ),
        pytest.param(
            '[servers.fs]\ncommand = "x"\nheaders = { A = "b" }\n',
            3,
            1,
            "servers.fs.headers: 'headers' is for url servers, and this is a stdio server (with 'command')",
            id="stdio-server-with-headers",
        ),
        pytest.param(
            '[servers.gh]\nurl = "ftp://example.com"\n',
            2,
            1,
            "servers.gh.url: 'ftp://example.com' is not an http:// or https:// URL",
            id="url-not-http",
        ),
        pytest.param(
            '[servers.gh]\nurl = "https://example.com/mcp"\ntype = "websocket"\n',
            3,
            1,
            "servers.gh.type: Input should be 'streamable_http' or 'sse' (got 'websocket')",
            id="unknown-transport",
        ),
        pytest.param(
            '[endpoints]\nport = 0\nhost = "0.0.0.0"\n',
            3,
            1,
            "endpoints.host: endpoints bind to loopback only: use '127.0.0.1' or '::1', not '0.0.0.0' "
            "(reach them from elsewhere through a tunnel or proxy)",
            id="endpoint-not-loopback",
        ),
        pytest.param(
            "[kernel]\n  warm_pool = -1\n",
            2,
            3,
            "kernel.warm_pool: Input should be greater than or equal to 0 (got -1)",
            id="out-of-range",
        ),
        pytest.param(
            '[kernel]\ntimeout = "soon"\n',
            2,
            1,
            "kernel.timeout: Input should be a valid number, unable to parse string as a number (got 'soon')",
            id="wrong-type",
        ),
        pytest.param(
            '[[approval.rules]]\ntool = 3\ndecision = "allow"\n',
            2,
            1,
            "approval.rules[0].tool: Input should be a valid string, or Input should be a valid list (got 3)",
            id="union-type-one-problem",
        ),
        pytest.param(
            '[[approval.rules]]\ntool = "x"\n',
            1,
            1,
            "approval.rules[0].decision: Field required",
            id="missing-key",
        ),
        pytest.param(
            "[kernel]\ntimeout = 1\n\n[kernel]\nwarm_pool = 2\n",
            4,
            8,
            "not valid TOML: Cannot declare ('kernel',) twice",
            id="toml-duplicate-table",
        ),
        pytest.param(
            '[servers.fs]\ncommand = "npx\n',
            2,
            15,
            "not valid TOML: Illegal character '\\n'",
            id="toml-unterminated-string",
        ),
        pytest.param(
            "_env_file = '/etc/passwd'\n",
            1,
            1,
            "unknown key '_env_file' at the top level (expected one of: workspace, kernel, sandbox, servers, "
            "secrets, approval, provenance, endpoints)",
            id="settings-option-is-no-key",
        ),
    ],
)
def test_errors_say_where_and_why(
    write_config: WriteConfig, text: str, line: int, column: int, reason: str
) -> None:
    path = write_config(text)
    error = _error(path)
    assert (error.path, error.line, error.column, error.reason) == (path, line, column, reason)
    assert str(error) == f"{path}:{line}:{column}: {reason}"


def test_rule_with_failing_example_points_at_the_rule(write_config: WriteConfig) -> None:
    path = write_config(
        textwrap.dedent(
            """\
            [approval]
            default = "ask"

            [[approval.rules]]
            id = "fine"
            tool = "read_*"
            decision = "allow"
            match = [{ server = "fs", tool = "read_file" }]

            [[approval.rules]]
            id = "reads"
            tool = "read_*"
            decision = "allow"
            match = [{ server = "fs", tool = "write_file" }]
            """
        )
    )
    error = _error(path)
    assert (error.line, error.column) == (10, 1)
    assert error.reason.startswith(
        "rule 'reads': example {server='fs', tool='write_file'} is listed under match"
    )


def test_all_problems_are_listed_in_file_order(write_config: WriteConfig) -> None:
    path = write_config(
        textwrap.dedent(
            """\
            [servers.fs]
            comand = "npx"

            [kernel]
            timeout = 0

            [endpoints]
            host = "example.com"
            """
        )
    )
    error = _error(path)
    assert [(p.line, p.column) for p in error.problems] == [(2, 1), (5, 1), (8, 1)]
    assert (error.line, error.column) == (2, 1)
    lines = str(error).splitlines()
    assert len(lines) == 3
    assert lines[0] == f"{path}:2:1: unknown key 'comand' in [servers.fs] (did you mean 'command'?)"
    assert lines[1] == f"{path}:5:1: kernel.timeout: Input should be greater than 0 (got 0)"
    assert lines[2].startswith(f"{path}:8:1: endpoints.host: endpoints bind to loopback only")


def test_missing_file(workspace: Path) -> None:
    error = _error(workspace)
    assert error.path == workspace / "ipybox.toml"
    assert (error.line, error.column) == (None, None)
    assert (
        str(error)
        == f"{workspace / 'ipybox.toml'}: no such file: create ipybox.toml (`ipybox init` writes one)"
    )


def test_environment_overrides_the_file(write_config: WriteConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_config(
        '[kernel]\ntimeout = 50\nwarm_pool = 2\n[sandbox]\nenabled = true\n[servers.fs]\ncommand = "x"\n'
    )
    monkeypatch.setenv("IPYBOX_KERNEL__TIMEOUT", "30")
    monkeypatch.setenv("IPYBOX_SANDBOX__ENABLED", "false")
    monkeypatch.setenv("IPYBOX_SANDBOX__NETWORK__DENIED_DOMAINS", '["evil.example"]')
    monkeypatch.setenv("ipybox_endpoints__port", "9000")  # names are case-insensitive
    config = load_config(path)
    assert config.kernel.timeout == 30
    assert config.kernel.warm_pool == 2  # tables merge key by key: the file's other keys stay
    assert config.sandbox.enabled is False
    assert config.sandbox.network.denied_domains == ["evil.example"]
    assert config.endpoints.port == 9000
    assert config.servers["fs"].command == "x"


def test_variables_override_a_key_however_the_file_spells_it(
    write_config: WriteConfig, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The sandbox policy keeps sandbox-runtime's camelCase; variables can only be upper case.
    path = write_config(
        '[sandbox.network]\nallowedDomains = ["pypi.org"]\nallowLocalBinding = true\ndeniedDomains = ["a.b"]\n'
    )
    monkeypatch.setenv("IPYBOX_SANDBOX__NETWORK__ALLOWED_DOMAINS", '["example.com"]')
    (workspace / ".env").write_text("IPYBOX_SANDBOX__NETWORK__ALLOW_LOCAL_BINDING=false\n")
    config = load_config(path)
    assert config.sandbox.network.allowed_domains == ["example.com"]
    assert config.sandbox.network.allow_local_binding is False
    assert config.sandbox.network.denied_domains == ["a.b"]


def test_dotenv_overrides_the_file_and_the_environment_overrides_dotenv(
    write_config: WriteConfig, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_config("[kernel]\ntimeout = 50\nwarm_pool = 2\n")
    # A .env mostly holds secrets for ${VAR} placeholders: those are no settings, and no error.
    (workspace / ".env").write_text(
        "GITHUB_TOKEN=secret\nIPYBOX_KERNEL__WARM_POOL=3\nIPYBOX_KERNEL__TIMEOUT=40\n"
    )
    config = load_config(path)
    assert (config.kernel.timeout, config.kernel.warm_pool) == (40, 3)
    monkeypatch.setenv("IPYBOX_KERNEL__TIMEOUT", "30")
    config = load_config(path)
    assert (config.kernel.timeout, config.kernel.warm_pool) == (30, 3)


def test_bad_environment_variables_are_named(
    write_config: WriteConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_config("[kernel]\ntimeout = 50\n")
    monkeypatch.setenv("IPYBOX_KERNEL__TIMOUT", "30")
    monkeypatch.setenv("IPYBOX_ENDPOINTS__HOST", "0.0.0.0")
    error = _error(path)
    assert [str(problem) for problem in error.problems] == [
        "environment variable IPYBOX_KERNEL__TIMOUT: unknown key 'timout' in [kernel] (did you mean 'timeout'?)",
        "environment variable IPYBOX_ENDPOINTS__HOST: endpoints.host: endpoints bind to loopback only: use "
        "'127.0.0.1' or '::1', not '0.0.0.0' (reach them from elsewhere through a tunnel or proxy)",
    ]


def test_bad_dotenv_lines_are_placed(write_config: WriteConfig, workspace: Path) -> None:
    path = write_config("[kernel]\ntimeout = 50\n")
    dotenv = workspace / ".env"
    dotenv.write_text("TOKEN=x\n\nexport IPYBOX_KERNEL__WARM_POOL=-2\n")
    error = _error(path)
    assert (
        str(error) == f"{dotenv}:3:8: kernel.warm_pool: Input should be greater than or equal to 0 (got '-2')"
    )


def test_environment_variable_that_is_not_json(
    write_config: WriteConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_config("")
    monkeypatch.setenv("IPYBOX_KERNEL__ENV", "A=1")
    error = _error(path)
    assert error.problems[0].source == "environment"
    assert 'field "kernel"' in error.reason and "are JSON" in error.reason


def test_a_file_error_is_reported_even_when_the_environment_sets_other_keys(
    write_config: WriteConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_config("[kernel]\ntimeuot = 5\n")
    monkeypatch.setenv("IPYBOX_KERNEL__TIMEOUT", "30")
    error = _error(path)
    assert str(error) == f"{path}:2:1: unknown key 'timeuot' in [kernel] (did you mean 'timeout'?)"


@pytest.mark.parametrize(
    ("name", "suggestion"),
    [
        ("my-server", "my_server"),
        ("class", "class_"),
        ("2fa", "server_2fa"),
        ("naïve", "na_ve"),
        ("", "server"),
    ],
)
def test_server_name_suggestions(name: str, suggestion: str) -> None:
    assert suggest_server_name(name) == suggestion
    assert check_server_name(suggestion) == suggestion
    with pytest.raises(ValueError, match=f"e.g. '{suggestion}'"):
        check_server_name(name)


@pytest.mark.parametrize("example", ["ipybox.toml.example", "example-workspace/ipybox.toml"])
def test_example_files_load(example: str, tmp_path: Path) -> None:
    path = tmp_path / "ipybox.toml"
    shutil.copy(ROOT / example, path)
    config = load_config(path)
    assert config.servers and config.approval.rules
    assert (ROOT / example).read_text().startswith("#:schema ")


def test_example_workspace_rules_decide_as_documented() -> None:
    config = load_config(ROOT / "example-workspace")
    assert set(config.servers) == {"filesystem", "memory", "time"}
    assert config.server_params("filesystem")["args"][-1] == "."
    writes = {"readOnlyHint": False, "destructiveHint": True}
    decide = config.approval.decide
    assert (
        decide(
            ToolCall("filesystem", "read_text_file", {"path": "hello.py"}, {"readOnlyHint": True})
        ).decision
        == "allow"
    )
    assert decide(ToolCall("filesystem", "write_file", {"path": "out/a.md"}, writes)).decision == "ask"
    assert decide(ToolCall("filesystem", "write_file", {"path": "hello.py"}, writes)).decision == "deny"
    assert (
        decide(ToolCall("filesystem", "write_file", {"path": "out/../hello.py"}, writes)).decision == "deny"
    )
    assert (
        decide(ToolCall("filesystem", "move_file", {"source": "a", "destination": "b"}, writes)).decision
        == "deny"
    )
    assert decide(ToolCall("time", "get_current_time", {"timezone": "UTC"})).decision == "allow"
    assert decide(ToolCall("memory", "read_graph", {}, {"readOnlyHint": True})).decision == "allow"
    assert decide(ToolCall("memory", "create_entities", {}, {"destructiveHint": False})).decision == "ask"
    assert decide(ToolCall("memory", "delete_entities", {}, writes)).decision == "deny"


def test_constructing_without_a_file_gives_defaults_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IPYBOX_KERNEL__WARM_POOL", "0")
    config = WorkspaceConfig()
    assert config.path is None and config.root == Path.cwd()
    assert config.kernel.warm_pool == 0


def test_missing_and_unknown_keys_in_one_table_are_both_reported(write_config: WriteConfig) -> None:
    path = write_config('[[approval.rules]]\ntoool = "read_*"\n')
    error = _error(path)
    assert [problem.reason for problem in error.problems] == [
        "approval.rules[0].decision: Field required",
        "unknown key 'toool' in [approval.rules[0]] (did you mean 'tool'?)",
    ]
    assert [(problem.line, problem.column) for problem in error.problems] == [(1, 1), (2, 1)]


def test_require_shell_escape_without_approve_shell_is_an_error_at_its_key(write_config: WriteConfig) -> None:
    path = write_config("[kernel]\nwarm_pool = 0\nrequire_shell_escape = true\n")
    (problem,) = _error(path).problems
    assert (problem.line, problem.column) == (3, 1)
    assert problem.reason.startswith(
        "kernel.require_shell_escape: require_shell_escape = true needs approve_shell"
    )
    config = load_config(write_config("[kernel]\napprove_shell = true\nrequire_shell_escape = true\n"))
    assert config.kernel.approve_shell and config.kernel.require_shell_escape


@pytest.mark.parametrize("name", ["shell", "ipybox"])
def test_the_names_rules_use_for_shell_commands_and_ipybox_are_no_server_names(
    write_config: WriteConfig, name: str
) -> None:
    (problem,) = _error(write_config(f'[servers.{name}]\ncommand = "x"\n')).problems
    assert problem.line == 1 and f"the server name {name!r} is reserved" in problem.reason
    assert f"e.g. '{name}_server'" in problem.reason


def test_a_dotenv_that_is_not_utf8_is_one_clear_error(write_config: WriteConfig, workspace: Path) -> None:
    path = write_config("[kernel]\nwarm_pool = 1\n")
    (workspace / ".env").write_bytes(b"IPYBOX_KERNEL__TIMEOUT=\xff\xfe\n")
    with pytest.raises(ConfigError, match=r"\.env: not UTF-8 text"):
        load_config(path)


def test_kernel_limits_default_on_and_unlimited_lifts_one(write_config: WriteConfig) -> None:
    assert load_config(write_config("")).kernel.limits.memory == 4 * 1024**3
    limits = load_config(write_config('[kernel.limits]\nmemory = "unlimited"\ncpus = 1.5\n')).kernel.limits
    assert limits.memory is None and limits.cpus == 1.5 and limits.processes == 256


@pytest.mark.parametrize(
    ("toml", "place", "reason"),
    [
        ('[kernel.limits]\nmemory = "lots"\n', ":2:1: kernel.limits.memory", "not a size: 'lots'"),
        ("[kernel.limits]\nprocesses = false\n", ":2:1: kernel.limits.processes", 'use "unlimited"'),
        (
            "[kernel.limits]\nswap = 1\n",
            ":2:1: unknown key 'swap' in [kernel.limits]",
            "expected one of: memory",
        ),
        (
            '[sandbox]\nenabled = false\n[kernel.limits]\ntmp = "1GiB"\n',
            ":4:1: kernel.limits.tmp",
            "unsandboxed kernels share the host's /tmp",
        ),
    ],
)
def test_a_bad_kernel_limit_is_a_config_error_at_its_line(
    write_config: WriteConfig, toml: str, place: str, reason: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(write_config(toml))
    assert place in str(caught.value) and reason in str(caught.value)


def test_max_idle_and_recycle_rss_are_off_unless_set(write_config: WriteConfig) -> None:
    kernel = load_config(write_config("")).kernel
    assert kernel.max_idle is None and kernel.recycle_rss is None
    kernel = load_config(write_config('[kernel]\nmax_idle = 1800\nrecycle_rss = "2GiB"\n')).kernel
    assert kernel.max_idle == 1800 and kernel.recycle_rss == 2 * 1024**3


def test_what_a_cell_writes_to_files_is_bounded_by_default_and_configurable(
    write_config: WriteConfig,
) -> None:
    kernel = load_config(write_config("")).kernel
    assert (kernel.max_output_file_bytes, kernel.max_image_bytes) == (256 * 1024**2, 32 * 1024**2)
    toml = '[kernel]\nmax_output_file_bytes = "1GiB"\nmax_image_bytes = 1000\n'
    kernel = load_config(write_config(toml)).kernel
    assert (kernel.max_output_file_bytes, kernel.max_image_bytes) == (1024**3, 1000)


@pytest.mark.parametrize(
    ("toml", "place", "reason"),
    [
        ('[kernel]\nrecycle_rss = "big"\n', ":2:1: kernel.recycle_rss", "not a size: 'big'"),
        ("[kernel]\nmax_idle = true\n", ":2:1: kernel.max_idle", "takes a number of seconds, not true"),
        ("[kernel]\nmax_idle = 0\n", ":2:1: kernel.max_idle", "greater than 0"),
        ('[kernel]\nmax_image_bytes = "huge"\n', ":2:1: kernel.max_image_bytes", "not a size: 'huge'"),
        ("[kernel]\nmax_output_file_bytes = true\n", ":2:1: kernel.max_output_file_bytes", "takes a size"),
        ("[kernel]\nmax_output_file_bytes = 0\n", ":2:1: kernel.max_output_file_bytes", "greater than 0"),
    ],
)
def test_a_bad_max_idle_or_recycle_rss_is_a_config_error_at_its_line(
    write_config: WriteConfig, toml: str, place: str, reason: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(write_config(toml))
    assert place in str(caught.value) and reason in str(caught.value)


def test_provenance_sources_load_and_a_bad_label_is_refused_at_its_line(write_config: WriteConfig) -> None:
    good = write_config('[[provenance.sources]]\nserver = "mail"\ntool = ["read_*"]\nlabel = "private"\n')
    config = load_config(good)
    assert config.provenance.label_for("mail", "read_inbox", {"openWorldHint": True}) == "private"
    assert config.provenance.label_for("web", "fetch", {}) == "untrusted"
    path = write_config(
        '[provenance]\nmin_length = 24\n\n[[provenance.sources]]\nserver = "web"\nlabel = "evil"\n'
    )
    error = _error(path)
    assert (error.line, error.column) == (6, 1)
    assert (
        "provenance.sources[0].label" in error.reason
        and "'untrusted', 'private' or 'trusted'" in error.reason
    )
