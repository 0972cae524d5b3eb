"""Sandbox policies: files in the sandbox-runtime format, the paths they protect, and the schema."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ipybox.paths import user_state_dir
from ipybox.sandbox import SandboxPolicy
from ipybox.sandbox.bwrap import bwrap_args, sandboxed_command
from ipybox.sandbox.schema import SCHEMA_FILE, render
from ipybox.sandbox.view import PathRule

ROOT = Path(__file__).resolve().parents[2]


def test_policy_file_in_the_published_format(tmp_path: Path) -> None:
    path = tmp_path / "policy.json"
    path.write_text(
        json.dumps(
            {
                "filesystem": {"denyRead": ["~/.secret"], "allowWrite": ["/data"], "denyWrite": ["locked/"]},
                "network": {"allowedDomains": [], "deniedDomains": ["evil.example"]},
            }
        )
    )
    policy = SandboxPolicy.from_file(path)
    assert policy.filesystem.deny_read == ["~/.secret"]
    assert policy.filesystem.allow_write == ["/data"]
    assert policy.network.denied_domains == ["evil.example"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{", r"policy\.json:1:2: not valid JSON"),
        ('{"filesystem": {"denyReads": []}}', r"filesystem\.denyReads: Extra inputs are not permitted"),
        (
            '{"network": {"allowedDomains": "pypi.org"}}',
            r"network\.allowedDomains: Input should be a valid list",
        ),
    ],
)
def test_bad_policy_files_get_one_clear_error(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "policy.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        SandboxPolicy.from_file(path)


def test_missing_policy_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no such file"):
        SandboxPolicy.from_file(tmp_path / "nope.json")


# Glob characters in the workspace's or home's own path are literal: only policy entries are patterns.
@pytest.mark.parametrize("name", ["ws", "ws[1]", "what?", "a*b"])
def test_protected_paths(tmp_path: Path, name: str) -> None:
    home, workspace = tmp_path / f"home-{name}", tmp_path / "parent" / name
    (home / ".ssh").mkdir(parents=True)
    workspace.mkdir(parents=True)
    (workspace / ".env").write_text("A=1")
    (tmp_path / "parent" / ".env.production").write_text("B=2")  # a parent's .env too
    (workspace / ".git" / "hooks").mkdir(parents=True)
    (workspace / "ipybox.toml").write_text("")
    (workspace / "keys").mkdir()
    (workspace / "keys" / "a.pem").write_text("")
    policy = SandboxPolicy.model_validate({"filesystem": {"denyRead": ["keys/*.pem"]}})
    # ipybox's own state is hidden too, once something made it (earlier tests of the run may have).
    state = {user_state_dir()} if user_state_dir().exists() else set()
    assert set(policy.deny_read_paths(workspace, home)) == {
        workspace / ".env",
        tmp_path / "parent" / ".env.production",
        home / ".ssh",
        workspace / "keys" / "a.pem",
        *state,
    }
    assert set(policy.deny_write_paths(workspace, home)) == {workspace / ".git", workspace / "ipybox.toml"}
    args = bwrap_args(policy, workspace, home=home)

    def mounted(*words: str) -> bool:
        return any(args[i : i + len(words)] == list(words) for i in range(len(args)))

    # The workspace is frozen: a read-only tmpfs with one mount per entry, so protected names can't be
    # created or replaced there; hidden files can't be opened, protected ones are read-only.
    assert mounted("--tmpfs", str(workspace)) and mounted("--remount-ro", str(workspace))
    assert mounted("--ro-bind-try", "/dev/null", str(workspace / ".env"))
    assert mounted("--ro-bind-try", str(workspace / ".git"), str(workspace / ".git"))
    assert mounted("--ro-bind-try", str(workspace / "ipybox.toml"), str(workspace / "ipybox.toml"))
    assert mounted("--tmpfs", str(workspace / "keys"))  # holds a hidden name: frozen too
    assert mounted("--ro-bind-try", "/dev/null", str(workspace / "keys" / "a.pem"))
    # The parent and the home are under /tmp here, which the sandbox replaces: not even listed.
    assert str(tmp_path / "parent" / ".env.production") not in args and str(home) not in args
    assert "--unshare-all" in args and "--share-net" not in args


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        ("https://pypi.org", "without scheme, port or path"),
        ("pypi.org:443", "without scheme, port or path"),
        ("pypi..org", "not a valid host name"),
        ("*.10.0.0.1", "a wildcard needs a domain"),
    ],
)
def test_bad_domain_entries_are_named(tmp_path: Path, entry: str, reason: str) -> None:
    path = tmp_path / "policy.json"
    path.write_text(json.dumps({"network": {"allowedDomains": ["pypi.org", entry]}}))
    with pytest.raises(ValueError, match=re.escape(reason)) as caught:
        SandboxPolicy.from_file(path)
    assert "network.allowedDomains" in str(caught.value) and entry in str(caught.value)


@pytest.mark.integration
def test_allowed_domains_need_a_proxy(tmp_path: Path) -> None:
    policy = SandboxPolicy.model_validate({"network": {"allowedDomains": ["pypi.org", "*.pythonhosted.org"]}})
    with pytest.raises(ValueError, match="needs a DomainProxy"):
        sandboxed_command(["true"], policy, tmp_path)
    argv = sandboxed_command(["true"], policy, tmp_path, proxy_socket=tmp_path / "p" / "proxy.sock")
    bridge = argv.index("ipybox.sandbox.netbridge")
    assert argv[bridge + 1 : bridge + 4] == [str(tmp_path / "p" / "proxy.sock"), "--", "true"]
    assert ["--ro-bind-try", str(tmp_path / "p"), str(tmp_path / "p")] == argv[
        argv.index(str(tmp_path / "p")) - 1 : argv.index(str(tmp_path / "p")) + 2
    ]


def test_schema_file_is_current() -> None:
    path = ROOT / "schemas" / SCHEMA_FILE
    assert path.read_text() == render(), "schemas/ drifted: run `python -m ipybox.sandbox.schema`"


def test_the_published_example_files_load(tmp_path: Path) -> None:
    # As in ipybox 0.9's documentation (sandbox-runtime's format, with its extra options).
    path = tmp_path / "sandbox-kernel.json"
    path.write_text(
        json.dumps(
            {
                "enableWeakerNestedSandbox": False,
                "filesystem": {"denyRead": [".env"], "allowWrite": [".", "~/.ipython"], "denyWrite": []},
                "network": {
                    "allowedDomains": ["example.org"],
                    "deniedDomains": [],
                    "allowLocalBinding": True,
                },
            }
        )
    )
    policy = SandboxPolicy.from_file(path)
    assert policy.network.allowed_domains == ["example.org"] and policy.filesystem.deny_read == [".env"]


def test_all_unix_sockets_are_refused_named_ones_are_bound(tmp_path: Path) -> None:
    path = tmp_path / "policy.json"
    path.write_text(json.dumps({"network": {"allowAllUnixSockets": True}}))
    with pytest.raises(ValueError, match="list the ones it needs in allowUnixSockets"):
        SandboxPolicy.from_file(path)
    agent = tmp_path / "agent.sock"
    agent.touch()
    policy = SandboxPolicy.model_validate({"network": {"allowUnixSockets": [str(agent)]}})
    args = bwrap_args(policy, tmp_path)
    assert ["--bind-try", str(agent), str(agent)] == args[
        args.index(str(agent)) - 1 : args.index(str(agent)) + 2
    ]


def test_guarding_names_the_workspace_and_its_state_for_a_process_that_runs_elsewhere(tmp_path: Path) -> None:
    workspace, state = tmp_path / "ws", tmp_path / "state"
    (workspace / "sub").mkdir(parents=True)
    policy = SandboxPolicy()
    # In the workspace, with the state in its `.ipybox`, the view guards all of it already.
    assert policy.guarding(workspace, workspace / ".ipybox", cwd=workspace) is policy
    below = policy.guarding(workspace, state, cwd=workspace / "sub")
    assert {f"{workspace}/.env*", f"{workspace}/.ipybox", str(state)} <= set(below.filesystem.deny_read)
    assert {f"{workspace}/ipybox.toml", f"{workspace}/.git", str(state)} <= set(below.filesystem.deny_write)
    view = below.view(workspace / "sub", tmp_path)
    # A pattern in the last name of an absolute entry covers names made later too.
    assert PathRule(str(workspace), ".env*") in view.hidden
    assert PathRule(str(workspace), "ipybox.toml") in view.protected
