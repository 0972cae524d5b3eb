"""What the MCP server tells the agent (`ipybox.mcp_server.instructions`), rendered from a workspace's
configuration: pure logic, no processes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ipybox.config.loading import load_config_text
from ipybox.mcp_server.instructions import (
    AgentFacts,
    cell_note,
    facts_of,
    package_failure_hint,
    package_note,
    render_instructions,
)


@pytest.fixture(autouse=True)
def no_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in os.environ:
        if key.upper().startswith("IPYBOX_"):
            monkeypatch.delenv(key)


def facts(tmp_path: Path, toml: str) -> AgentFacts:
    return facts_of(load_config_text(tmp_path / "ipybox.toml", toml))


def test_an_unsandboxed_workspace_is_never_called_sandboxed(tmp_path: Path) -> None:
    text = render_instructions(facts(tmp_path, "[sandbox]\nenabled = false\n"))
    assert text.startswith("ipybox runs Python in a stateful IPython kernel. MCP servers")
    assert "sandboxed" not in text.replace("Kernels are not sandboxed", "")
    assert "This workspace: Kernels are not sandboxed: code runs with the user's permissions" in text
    assert "install_package installs a package with pip" in text


def test_a_sandbox_without_hosts_says_there_is_no_network_and_install_package_cannot_work(
    tmp_path: Path,
) -> None:
    sandboxed = facts(tmp_path, "[sandbox]\nenabled = true\n")
    text = render_instructions(sandboxed)
    assert text.startswith("ipybox runs Python in a stateful IPython kernel in a sandbox. MCP servers")
    assert "Network: none (no host is allowed); connections to other hosts are refused." in text
    assert "a new file or directory at the workspace's top level can't be created" in text
    assert "install_package can't work here" in text
    assert package_note(sandboxed).startswith("install_package can't work here")
    hint = package_failure_hint(sandboxed)
    assert hint is not None and "don't retry" in hint


def test_a_sandbox_names_its_allowed_hosts_and_writable_paths(tmp_path: Path) -> None:
    toml = (
        '[sandbox]\nenabled = true\n\n[sandbox.filesystem]\nallowWrite = ["~/scratch"]\n\n'
        '[sandbox.network]\nallowedDomains = ["api.github.com", { host = "pypi.org", methods = ["GET"] }, '
        '"*.pythonhosted.org"]\nreadOnly = true\n'
    )
    sandboxed = facts(tmp_path, toml)
    note = cell_note(sandboxed)
    assert (
        "Network: only api.github.com, pypi.org, *.pythonhosted.org (GET, HEAD and OPTIONS only), through "
        "ipybox's proxy; connections to other hosts are refused."
    ) in note
    assert "existing top-level directories and files, in ~/scratch and in their private /tmp" in note
    # PyPI's hosts are allowed (one by a wildcard): installing can work.
    assert sandboxed.package_index_reachable and package_failure_hint(sandboxed) is None
    assert note in render_instructions(sandboxed)
    asked = facts(tmp_path, '[sandbox]\nenabled = true\n\n[sandbox.network]\nunknown = "ask"\n')
    assert (
        "Network: none (no host is allowed); a connection to another host waits while a person at the "
        in (cell_note(asked))
    )


def test_who_answers_asks_follows_the_console_and_the_default(tmp_path: Path) -> None:
    text = render_instructions(
        facts(tmp_path, '[endpoints]\nconsole = false\n\n[approval]\ndefault = "deny"\n')
    )
    assert "a call no rule matches is denied." in text
    assert "otherwise to a person running `ipybox approve` (the web console is off)" in text
    text = render_instructions(facts(tmp_path, "[sandbox]\nenabled = false\n"))
    assert "a call no rule matches is asked about." in text
    assert "otherwise to a person at the workspace's web console or `ipybox approve`" in text


def test_a_configuration_that_does_not_load_is_described_as_unknown() -> None:
    text = render_instructions(None)
    assert "does not load now, so what its kernels may do is not known here" in text
    assert "sandbox" not in text.split("does not load now")[0] and cell_note(None) == ""
