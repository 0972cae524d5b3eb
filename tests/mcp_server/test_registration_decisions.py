"""`ipybox.mcp_server.registration` without a running workspace: what a registration parses to and writes,
and how the approval rules decide it."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest

from ipybox.config import load_config
from ipybox.mcp_server.registration import (
    Registration,
    add_server,
    decide_registration,
    load_workspace_config,
    parse_registration,
)
from ipybox.rules import ApprovalPolicy

FILE = """\
# my workspace
[sandbox]
enabled = {sandboxed}  # kernels

[servers.kept]
command = "kept"  # a comment that stays
"""


def workspace(tmp_path: Path, *, sandboxed: bool) -> Path:
    (tmp_path / "ipybox.toml").write_text(FILE.format(sandboxed=str(sandboxed).lower()))
    return tmp_path


def parse(directory: Path, name: str, params: dict[str, Any]) -> Registration:
    return parse_registration(directory, load_workspace_config(directory), name, params)


def register(directory: Path, name: str, params: dict[str, Any]) -> dict[str, Any]:
    """Parse and write; the server's table as `ipybox.toml` then loads it."""
    add_server(directory, parse(directory, name, params))
    return load_config(directory).servers[name].model_dump(exclude_unset=True)


def test_sandbox_true_given_in_an_unsandboxed_workspace_is_written(tmp_path: Path) -> None:
    directory = workspace(tmp_path, sandboxed=False)
    register(directory, "fs", {"command": sys.executable, "sandbox": True})
    config = load_config(directory)
    assert config.servers["fs"].sandbox_policy() is not None
    assert "sandbox = true" in (directory / "ipybox.toml").read_text()


def test_a_stdio_server_in_an_unsandboxed_workspace_stays_unsandboxed_unless_asked(tmp_path: Path) -> None:
    directory = workspace(tmp_path, sandboxed=False)
    register(directory, "plain", {"command": "plain", "sandbox": False})
    register(directory, "bare", {"command": "bare"})
    config = load_config(directory)
    assert config.servers["plain"].sandbox_policy() is None and config.servers["bare"].sandbox is None


def test_the_file_keeps_its_comments_and_other_servers(tmp_path: Path) -> None:
    directory = workspace(tmp_path, sandboxed=True)
    (directory / ".env").write_text("TOKEN_X=secret-value\n")
    register(directory, "new", {"command": "x", "args": ["-v"], "env": {"TOKEN": "${TOKEN_X}"}})
    text = (directory / "ipybox.toml").read_text()
    assert text.startswith(FILE.format(sandboxed="true"))
    assert 'TOKEN = "${TOKEN_X}"' in text and "sandbox = true" in text and "secret-value" not in text


def test_nulls_count_as_not_given(tmp_path: Path) -> None:
    directory = workspace(tmp_path, sandboxed=True)
    registration = parse(directory, "n", {"command": "x", "env": None, "cwd": None, "sandbox": None})
    assert registration.table == {"command": "x", "sandbox": True} and registration.sandboxed_by_default


def test_a_url_server_is_written_with_its_transport(tmp_path: Path) -> None:
    directory = workspace(tmp_path, sandboxed=True)
    server = register(directory, "remote", {"url": "https://example.com/sse", "type": "sse"})
    assert server == {"url": "https://example.com/sse", "type": "sse"}


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"command": "x", "headers": {}}, "'headers' is for url servers"),
        ({"url": "https://example.com/mcp", "args": []}, "'args' is for stdio servers"),
        ({"args": ["x"]}, "a stdio server takes command, args, env, cwd, sandbox"),
        ({"command": "x", "enabled": False}, "key 'enabled' is not accepted"),
        ({"command": "x", "env": {"A": 1}}, "server_params.env.A: Input should be a valid string"),
        ({"command": "x", "env": {"A": "${NOT_SET_ANYWHERE_XYZ}"}}, "NOT_SET_ANYWHERE_XYZ is not set"),
        ({"command": "x", "sandbox": {"network": {"allowAllUnixSockets": True}}}, "server_params.sandbox"),
    ],
)
def test_bad_parameters_are_one_clear_error(tmp_path: Path, params: dict[str, Any], message: str) -> None:
    directory = workspace(tmp_path, sandboxed=True)
    with pytest.raises(ValueError, match=re.escape(message)):
        parse(directory, "bad", params)


def test_the_name_ipybox_is_reserved_for_the_rules(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="reserved"):
        parse(workspace(tmp_path, sandboxed=True), "ipybox", {"command": "x"})


def test_a_file_that_does_not_load_refuses_registrations(tmp_path: Path) -> None:
    (tmp_path / "ipybox.toml").write_text("[sandbox]\nenabeld = true\n")
    with pytest.raises(ValueError, match="does not load"):
        load_workspace_config(tmp_path)


def policy(*rules: dict[str, Any], default: str = "ask") -> ApprovalPolicy:
    return ApprovalPolicy.model_validate({"default": default, "rules": list(rules)})


def registration(tmp_path: Path, name: str = "fs") -> Registration:
    directory = workspace(tmp_path, sandboxed=True)
    return parse(directory, name, {"command": "x"})


def test_no_rule_means_ask_whatever_the_default(tmp_path: Path) -> None:
    for default in ("allow", "deny", "ask"):
        verdict = decide_registration(policy(default=default), registration(tmp_path))
        assert verdict.decision == "ask" and verdict.rule_id is None


def test_with_unsandboxed_local_kernels_no_rule_means_allow_and_rules_still_decide(tmp_path: Path) -> None:
    # Those kernels can start any host process and edit ipybox.toml themselves: registering adds nothing.
    unconfined = parse(workspace(tmp_path, sandboxed=False), "fs", {"command": "x"})
    assert unconfined.kernels_unconfined
    verdict = decide_registration(policy(), unconfined)
    assert verdict.decision == "allow" and verdict.rule_id is None and "not sandboxed" in verdict.reason
    ask = {"id": "ask-me", "server": "ipybox", "decision": "ask"}
    deny = {"id": "no", "tool": "register_*", "decision": "deny"}
    assert decide_registration(policy(ask), unconfined).decision == "ask"
    assert decide_registration(policy(deny), unconfined).decision == "deny"


def test_with_kernels_on_a_remote_gateway_no_rule_still_means_ask(tmp_path: Path) -> None:
    # Unsandboxed there, they are on another machine: a registration starts a command on this one.
    directory = workspace(tmp_path, sandboxed=False)
    with (directory / "ipybox.toml").open("a") as file:
        file.write('\n[kernel.gateway]\nurl = "https://eg.example.com:8888"\n')
    remote = parse(directory, "fs", {"command": "x"})
    assert not remote.kernels_unconfined and decide_registration(policy(), remote).decision == "ask"


def test_an_allow_rule_must_name_the_ipybox_server(tmp_path: Path) -> None:
    catch_all = {"id": "all", "decision": "allow"}
    glob = {"id": "glob", "server": "ipy*", "decision": "allow"}
    named = {"server": ["other", "ipybox"], "tool": "register_*", "decision": "allow"}
    assert decide_registration(policy(catch_all, glob), registration(tmp_path)).decision == "ask"
    verdict = decide_registration(policy(catch_all, named), registration(tmp_path))
    assert verdict.decision == "allow" and verdict.rule_id == "rules[1]"


def test_deny_rules_apply_through_globs_and_beat_allow_rules(tmp_path: Path) -> None:
    allow = {"id": "allow", "server": "ipybox", "decision": "allow"}
    deny = {"id": "deny", "tool": "register_*", "decision": "deny"}
    verdict = decide_registration(policy(allow, deny), registration(tmp_path))
    assert verdict.decision == "deny" and verdict.rule_id == "deny"
    higher = {**allow, "priority": 1}
    assert decide_registration(policy(higher, deny), registration(tmp_path)).decision == "allow"


def test_rules_see_the_written_parameters_and_whether_a_server_is_replaced(tmp_path: Path) -> None:
    sandboxed_only = {
        "server": "ipybox",
        "args": {"server_params.sandbox": True},
        "decision": "allow",
    }
    keep_existing = {"server": "ipybox", "annotations": {"destructiveHint": True}, "decision": "deny"}
    rules = policy(sandboxed_only, keep_existing)
    assert decide_registration(rules, registration(tmp_path, "fresh")).decision == "allow"
    assert decide_registration(rules, registration(tmp_path, "kept")).decision == "deny"


# The two bugs of the four-models era, and the round trip that keeps them fixed


def test_a_transport_spelt_http_is_written_as_streamable_http_and_the_file_loads(tmp_path: Path) -> None:
    # ipybox 0.9 took `"type": "http"` for a `/mcp` URL (streamable HTTP): it is normalised, never written as
    # `type = "http"`, which ipybox.toml would not load.
    directory = workspace(tmp_path, sandboxed=True)
    server = register(directory, "remote", {"url": "https://example.com/mcp", "type": "http"})
    assert server == {"url": "https://example.com/mcp", "type": "streamable_http"}
    assert 'type = "streamable_http"' in (directory / "ipybox.toml").read_text()


@pytest.mark.parametrize("sandboxed", [True, False])
@pytest.mark.parametrize(
    "sandbox",
    [
        True,
        {"network": {"allowedDomains": ["api.github.com"]}},
        {"enabled": True, "filesystem": {"denyRead": ["x"]}},
    ],
)
def test_a_sandbox_given_by_the_client_is_never_dropped(
    tmp_path: Path, sandboxed: bool, sandbox: Any
) -> None:
    directory = workspace(tmp_path, sandboxed=sandboxed)
    registration = parse(directory, "fs", {"command": sys.executable, "sandbox": sandbox})
    assert registration.table["sandbox"] == sandbox
    add_server(directory, registration)
    loaded = load_config(directory).servers["fs"]
    assert (
        loaded.sandbox_policy() is not None
        and loaded.sandbox_policy() == registration.server.sandbox_policy()
    )
    assert "sandbox" in load_config(directory).server_params("fs")  # what the tool server starts it with


ROUND_TRIP_CASES: list[dict[str, Any]] = [
    {"command": "npx"},
    {"command": "npx", "args": ["-y", "@scope/pkg", "--flag=${VALUE}"], "env": {"TOKEN": "${TOKEN}"}},
    {"command": "uvx", "args": [], "env": {}, "cwd": "sub/dir"},
    {"command": "x", "sandbox": True},
    {"command": "x", "sandbox": False},
    {"command": "x", "sandbox": {"enabled": False}},
    {"command": "x", "sandbox": {"filesystem": {"denyRead": ["~/.ssh"], "allowWrite": ["out"]}}},
    {"command": "x", "sandbox": {"network": {"allowedDomains": ["*.example.com"], "deniedDomains": ["a.b"]}}},
    {"command": "x", "sandbox": {"filesystem": {"deny_read": ["snake_case"]}}},
    {"url": "https://example.com/mcp"},
    {"url": "http://127.0.0.1:8000/sse", "type": "sse"},
    {"url": "https://example.com/x", "type": "streamable_http", "headers": {"Authorization": "Bearer ${T}"}},
    {"url": "https://example.com/x", "type": "HTTP"},
    {"url": "https://example.com/x", "type": "streamable-http", "headers": {}},
    {"url": "${MCP_URL}", "headers": {"X-Key": "${KEY}"}},
]


@pytest.mark.parametrize("params", ROUND_TRIP_CASES)
def test_dict_to_model_to_file_to_model_is_the_identity(tmp_path: Path, params: dict[str, Any]) -> None:
    from ipybox.mcp_client.params import dump_server_params, validate_server_params

    (tmp_path / ".env").write_text("VALUE=v\nTOKEN=t\nT=t\nMCP_URL=https://example.com/mcp\nKEY=k\n")
    model = validate_server_params("srv", params)
    directory = workspace(tmp_path, sandboxed=False)
    registration = parse(directory, "srv", params)
    assert registration.server == model and registration.table == dump_server_params(model)
    add_server(directory, registration)
    loaded = load_config(directory).servers["srv"]
    assert validate_server_params("srv", dump_server_params(loaded)) == model
    assert dump_server_params(loaded) == registration.table  # the file holds exactly what was parsed


# The workspace's sandbox bounds a registration's: beyond it, a rule never allows without asking

BOUNDED = """\
[sandbox]
enabled = true
filesystem = { allowWrite = ["/srv/shared"] }
network = { allowedDomains = ["api.github.com", "*.example.com"], deniedDomains = ["admin.example.com"], \
allowUnixSockets = ["/run/agent.sock"] }
"""


def bounded(tmp_path: Path, extra: str = "") -> Path:
    directory = tmp_path / "ws"
    (directory / "out").mkdir(parents=True)
    (directory / "link").symlink_to(tmp_path)
    (directory / "ipybox.toml").write_text(BOUNDED + extra)
    return directory


@pytest.mark.parametrize(
    ("params", "beyond"),
    [
        (
            {"sandbox": {"filesystem": {"allowWrite": ["/etc"]}}},
            "allowWrite '/etc': /etc is outside the workspace",
        ),
        ({"cwd": "/root"}, "cwd '/root': /root is outside the workspace"),
        ({"cwd": "../elsewhere"}, "cwd '../elsewhere': "),
        ({"sandbox": {"filesystem": {"allowWrite": ["/tmp"]}}}, "/tmp is outside the workspace"),
        (
            {"sandbox": {"filesystem": {"allowWrite": ["link"]}}},
            "is outside the workspace (through a symlink)",
        ),
        ({"sandbox": {"filesystem": {"allowWrite": ["out/deep"]}}}, "below the workspace's top level"),
        ({"cwd": "out/deep"}, "where a kernel could put a symlink in its place"),
        ({"sandbox": {"filesystem": {"allowWrite": [".git"]}}}, "a name the workspace keeps from kernels"),
        ({"cwd": ".ipybox"}, "a name the workspace keeps from kernels"),
        ({"sandbox": {"filesystem": {"allowWrite": ["*"]}}}, "allowWrite '*': a pattern"),
        ({"sandbox": {"network": {"allowedDomains": ["*.com"]}}}, "allowedDomains '*.com': not covered"),
        (
            {"sandbox": {"network": {"allowedDomains": ["github.com"]}}},
            "allowedDomains 'github.com': not covered",
        ),
        ({"sandbox": {"network": {"allowedDomains": ["www.example.com"]}}}, "needs the same exact host"),
        (
            {"sandbox": {"network": {"allowedDomains": ["*.example.com"]}}},
            "allowedDomains '*.example.com': reaches 'admin.example.com', which the workspace's deniedDomains has",
        ),
        (
            {"sandbox": {"network": {"allowUnixSockets": ["/var/run/docker.sock"]}}},
            "allowUnixSockets '/var/run/docker.sock': not in the workspace's allowUnixSockets",
        ),
    ],
)
def test_a_sandbox_beyond_the_workspaces_is_named_and_asked_even_under_an_allow_rule(
    tmp_path: Path, params: dict[str, Any], beyond: str
) -> None:
    registration = parse(bounded(tmp_path), "srv", {"command": "uvx", **params})
    assert any(beyond in phrase for phrase in registration.beyond), registration.beyond
    assert registration.exceeds is not None and "a person must approve it" in registration.exceeds
    by_command = {
        "id": "uvx",
        "server": "ipybox",
        "args": {"server_params.command": "uvx"},
        "decision": "allow",
    }
    verdict = decide_registration(policy(by_command), registration)
    assert (verdict.decision, verdict.rule_id) == ("ask", "uvx")
    assert (
        verdict.reason.startswith("rule 'uvx'")
        and "would allow it, but its sandbox goes beyond" in verdict.reason
    )
    assert beyond in verdict.reason and beyond in str(registration)  # what the person asked is shown
    assert decide_registration(policy(), registration).reason.endswith(registration.exceeds)
    deny = {"server": "ipybox", "decision": "deny"}
    assert decide_registration(policy(by_command, deny), registration).decision == "deny"


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"sandbox": True, "cwd": "out"},
        {"sandbox": {"filesystem": {"allowWrite": ["out", "/srv/shared"], "denyWrite": ["x"]}}},
        {"sandbox": {"network": {"allowedDomains": ["api.github.com", "*.api.example.com"]}}},
        {
            "sandbox": {
                "network": {
                    "allowedDomains": ["*.example.com"],
                    "deniedDomains": ["*.admin.example.com", "admin.example.com"],
                }
            }
        },
        {"sandbox": {"network": {"allowUnixSockets": ["/run/agent.sock"]}}},
    ],
)
def test_a_sandbox_within_the_workspaces_is_allowed_by_an_allow_rule(
    tmp_path: Path, params: dict[str, Any]
) -> None:
    registration = parse(bounded(tmp_path), "srv", {"command": "uvx", **params})
    assert registration.beyond == () and registration.exceeds is None
    by_command = {"server": "ipybox", "args": {"server_params.command": "uvx"}, "decision": "allow"}
    assert decide_registration(policy(by_command), registration).decision == "allow"


def test_a_registration_must_keep_what_the_workspace_hides_and_protects(tmp_path: Path) -> None:
    directory = bounded(tmp_path)
    (directory / "ipybox.toml").write_text(
        BOUNDED.replace('allowWrite = ["/srv/shared"]', 'denyRead = ["~/secrets"], denyWrite = ["out/final"]')
    )
    assert parse(directory, "srv", {"command": "uvx"}).beyond == (
        "denyRead: leaves out the workspace's '~/secrets', which kernels can't read",
        "denyWrite: leaves out the workspace's 'out/final', which kernels can't write",
    )
    kept = {"filesystem": {"denyRead": ["~/secrets"], "denyWrite": ["out/final"]}}
    assert parse(directory, "srv", {"command": "uvx", "sandbox": kept}).beyond == ()
    # Where the server can't write anyway, the workspace's denyWrite need not be repeated.
    elsewhere = {"filesystem": {"denyRead": ["~/secrets"]}}
    assert parse(directory, "srv", {"command": "uvx", "cwd": "other", "sandbox": elsewhere}).beyond == ()


def test_an_unsandboxed_workspace_bounds_nothing(tmp_path: Path) -> None:
    directory = workspace(tmp_path, sandboxed=False)
    sandbox = {"filesystem": {"allowWrite": ["/etc"]}, "network": {"allowedDomains": ["*.com"]}}
    assert parse(directory, "srv", {"command": "uvx", "sandbox": sandbox}).beyond == ()
