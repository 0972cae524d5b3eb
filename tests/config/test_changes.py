"""`diff()`: which servers are added, changed and removed, and which other changes need what."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ipybox.config import WorkspaceConfig, load_config
from ipybox.config.changes import ConfigChanges, diff

WriteConfig = Callable[[str], Path]

BASE = """\
[kernel]
env = { API_BASE = "http://localhost", TOKEN = "${TOKEN}" }
warm_pool = 1
timeout = 60

[sandbox]
enabled = true

[servers.time]
command = "mcp-server-time"
args = ["--local-timezone", "UTC"]

[servers.fetch]
command = "uvx"
args = ["mcp-server-fetch"]

[servers.github]
url = "https://api.githubcopilot.com/mcp/"
enabled = false

[approval]
default = "ask"

[endpoints]
port = 0
"""


def _load(write_config: WriteConfig, text: str) -> WorkspaceConfig:
    return load_config(write_config(text))


def _edit(write_config: WriteConfig, old: str, new: str) -> ConfigChanges:
    assert old in BASE
    return diff(_load(write_config, BASE), _load(write_config, BASE.replace(old, new)))


def test_start_up_adds_the_enabled_servers_and_applies_the_rules(write_config: WriteConfig) -> None:
    changes = diff(None, _load(write_config, BASE))
    assert changes == ConfigChanges(added=("fetch", "time"), approval_changed=True)
    assert changes.to_generate == ("fetch", "time")
    assert not changes.kernels_changed


def test_the_same_configuration_changes_nothing(write_config: WriteConfig) -> None:
    changes = diff(_load(write_config, BASE), _load(write_config, BASE))
    assert changes == ConfigChanges()
    assert not changes


def test_comments_and_key_order_change_nothing(write_config: WriteConfig) -> None:
    reordered = BASE.replace(
        'command = "uvx"\nargs = ["mcp-server-fetch"]',
        '# fetches URLs\nargs = ["mcp-server-fetch"]\ncommand = "uvx"',
    )
    assert not diff(_load(write_config, BASE), _load(write_config, reordered))


def test_an_added_server(write_config: WriteConfig) -> None:
    changes = _edit(write_config, "[approval]", '[servers.git]\ncommand = "mcp-server-git"\n\n[approval]')
    assert changes == ConfigChanges(added=("git",))


def test_changed_args_env_cwd_and_sandbox_change_a_server(write_config: WriteConfig) -> None:
    for old, new in [
        ('"--local-timezone", "UTC"', '"--local-timezone", "Europe/Vienna"'),
        ('args = ["--local-timezone", "UTC"]', 'args = ["--local-timezone", "UTC"]\nenv = { TZ = "UTC" }'),
        ('args = ["--local-timezone", "UTC"]', 'args = ["--local-timezone", "UTC"]\ncwd = "sub"'),
        ('args = ["--local-timezone", "UTC"]', 'args = ["--local-timezone", "UTC"]\nsandbox = true'),
    ]:
        assert _edit(write_config, old, new) == ConfigChanges(changed=("time",)), new


def test_a_deleted_server_is_removed(write_config: WriteConfig) -> None:
    changes = _edit(write_config, '[servers.fetch]\ncommand = "uvx"\nargs = ["mcp-server-fetch"]\n', "")
    assert changes == ConfigChanges(removed=("fetch",))


def test_disabling_removes_and_enabling_adds(write_config: WriteConfig) -> None:
    disabled = _edit(
        write_config, 'args = ["mcp-server-fetch"]', 'args = ["mcp-server-fetch"]\nenabled = false'
    )
    assert disabled == ConfigChanges(removed=("fetch",))
    enabled = _edit(write_config, "enabled = false", "enabled = true")
    assert enabled == ConfigChanges(added=("github",))


def test_a_disabled_server_edited_changes_nothing(write_config: WriteConfig) -> None:
    assert not _edit(
        write_config, 'url = "https://api.githubcopilot.com/mcp/"', 'url = "https://example.com/mcp"'
    )


def test_approval_changes(write_config: WriteConfig) -> None:
    assert _edit(write_config, 'default = "ask"', 'default = "deny"') == ConfigChanges(approval_changed=True)
    rule = '[[approval.rules]]\ntool = "get_*"\ndecision = "allow"\n'
    assert _edit(write_config, "[endpoints]", f"{rule}\n[endpoints]") == ConfigChanges(approval_changed=True)


def test_kernel_env_changes_name_the_variables_not_their_values(write_config: WriteConfig) -> None:
    changes = _edit(
        write_config,
        'env = { API_BASE = "http://localhost", TOKEN = "${TOKEN}" }',
        'env = { API_BASE = "http://example.com", DEBUG = "1" }',
    )
    assert changes.kernel_reasons == ("kernel.env changed: DEBUG added, TOKEN removed, API_BASE changed",)
    assert "example.com" not in changes.kernel_reasons[0]
    assert changes.kernels_changed and not changes.to_generate and not changes.approval_changed


def test_sandbox_and_warm_pool_changes_replace_kernels(write_config: WriteConfig) -> None:
    assert _edit(write_config, "enabled = true", "enabled = false").kernel_reasons == (
        "sandbox.enabled: true -> false",
    )
    network = _edit(
        write_config, "enabled = true", 'enabled = true\nnetwork = { allowedDomains = ["pypi.org"] }'
    )
    assert network.kernel_reasons == ("sandbox.network.allowedDomains: [] -> ['pypi.org']",)
    assert _edit(write_config, "warm_pool = 1", "warm_pool = 3").kernel_reasons == (
        "kernel.warm_pool: 1 -> 3",
    )


def test_secret_edits_replace_kernels_naming_the_secrets(write_config: WriteConfig) -> None:
    network = '[sandbox.network]\nallowedDomains = ["api.github.com", "api.example.com"]\n'
    one = '[secrets.github]\nvalue = "${GH}"\nenv = "GH"\nhosts = ["api.github.com"]\n'
    other = '[secrets.other]\nvalue = "${OTHER}"\nenv = "OTHER"\nhosts = ["api.example.com"]\n'
    before = _load(write_config, BASE + network + one)
    after = _load(write_config, BASE + network + one.replace("${GH}", "${GH2}") + other)
    changes = diff(before, after)
    assert changes.kernel_reasons == ("secrets changed: other added, github changed",)
    assert diff(after, before).kernel_reasons == ("secrets changed: other removed, github changed",)


def _diff_network(write_config: WriteConfig, old: str, new: str) -> ConfigChanges:
    """`diff()` between BASE with `[sandbox] network = old` and with `network = new`."""
    before = BASE.replace("enabled = true", f"enabled = true\nnetwork = {old}")
    after = BASE.replace("enabled = true", f"enabled = true\nnetwork = {new}")
    return diff(_load(write_config, before), _load(write_config, after))


def test_network_policy_edits_update_the_proxy_without_replacing_kernels(write_config: WriteConfig) -> None:
    changes = _diff_network(
        write_config, '{ allowedDomains = ["pypi.org"] }', '{ allowedDomains = ["pypi.org", "example.com"] }'
    )
    assert changes == ConfigChanges(
        network_reasons=("sandbox.network.allowedDomains: ['pypi.org'] -> ['pypi.org', 'example.com']",)
    )
    assert changes.network_changed and not changes.kernels_changed
    denied = _diff_network(
        write_config,
        '{ allowedDomains = ["*.example.com"] }',
        '{ allowedDomains = ["*.example.com"], deniedDomains = ["x.example.com"], readOnly = true }',
    )
    assert denied.network_reasons == (
        "sandbox.network.deniedDomains: [] -> ['x.example.com']",
        "sandbox.network.readOnly: false -> true",
    )
    assert denied.network_changed and not denied.kernel_reasons
    # From some domains to none: the proxy stays, and refuses everything.
    emptied = _diff_network(write_config, '{ allowedDomains = ["pypi.org"] }', "{ allowedDomains = [] }")
    assert emptied.network_changed and not emptied.kernels_changed


def test_unknown_is_a_network_edit_and_ask_brings_the_proxy_kernels_without_one_lack(
    write_config: WriteConfig,
) -> None:
    edited = _diff_network(
        write_config,
        '{ allowedDomains = ["pypi.org"] }',
        '{ allowedDomains = ["pypi.org"], unknown = "ask" }',
    )
    assert edited.network_reasons == ("sandbox.network.unknown: 'deny' -> 'ask'",)
    assert edited.network_changed and not edited.kernels_changed
    # No domain and "deny": no proxy in the running kernels' sandboxes; "ask" needs one.
    asked = _diff_network(write_config, "{}", '{ unknown = "ask" }')
    assert asked.kernel_reasons == ("sandbox.network.unknown: 'deny' -> 'ask'",) and asked.kernels_changed
    # Asking already, with no domain: a proxy runs, and the first allowed domain reaches it.
    listed = _diff_network(
        write_config, '{ unknown = "ask" }', '{ unknown = "ask", allowedDomains = ["pypi.org"] }'
    )
    assert listed.network_changed and not listed.kernels_changed


def test_network_edits_that_change_the_sandbox_replace_kernels(write_config: WriteConfig) -> None:
    # No domain before: the running kernels' sandboxes have no proxy socket to reach a proxy through.
    added = _diff_network(write_config, "{ allowedDomains = [] }", '{ allowedDomains = ["pypi.org"] }')
    assert added.kernel_reasons == ("sandbox.network.allowedDomains: [] -> ['pypi.org']",)
    assert added.kernels_changed and not added.network_changed and not added.network_reasons
    # What the sandbox is started with is not the proxy's: new kernels.
    sockets = _diff_network(
        write_config,
        '{ allowedDomains = ["pypi.org"] }',
        '{ allowedDomains = ["example.com"], allowUnixSockets = ["/tmp/agent.sock"] }',
    )
    assert sockets.kernel_reasons == ("sandbox.network.allowUnixSockets: [] -> ['/tmp/agent.sock']",)
    assert sockets.network_reasons == ("sandbox.network.allowedDomains: ['pypi.org'] -> ['example.com']",)
    assert sockets.kernels_changed and not sockets.network_changed
    binding = _diff_network(write_config, "{}", "{ allowLocalBinding = false }")
    assert binding.kernel_reasons == ("sandbox.network.allowLocalBinding: true -> false",)


def test_shell_approval_changes_replace_kernels(write_config: WriteConfig) -> None:
    # Kernels install the approval of shell commands when they start: running ones must be replaced.
    assert _edit(write_config, "warm_pool = 1", "warm_pool = 1\napprove_shell = true").kernel_reasons == (
        "kernel.approve_shell: false -> true",
    )
    escape = _edit(
        write_config, "warm_pool = 1", "warm_pool = 1\napprove_shell = true\nrequire_shell_escape = true"
    )
    assert escape.kernel_reasons == (
        "kernel.approve_shell: false -> true",
        "kernel.require_shell_escape: false -> true",
    )


def test_timeout_applies_without_replacing_kernels(write_config: WriteConfig) -> None:
    assert _edit(write_config, "timeout = 60", "timeout = 5") == ConfigChanges(kernel_timeout_changed=True)


def test_endpoints_and_directories_need_a_restart(write_config: WriteConfig) -> None:
    changes = _edit(write_config, "port = 0", 'port = 8765\nhost = "::1"')
    assert changes == ConfigChanges(
        restart_reasons=("endpoints.host: '127.0.0.1' -> '::1'", "endpoints.port: 0 -> 8765")
    )
    moved = _edit(write_config, "[kernel]", '[workspace]\nmcptools_dir = "tools"\n\n[kernel]')
    assert moved.restart_reasons == ("workspace.mcptools_dir: 'mcptools' -> 'tools'",)


def test_several_changes_at_once(write_config: WriteConfig) -> None:
    edited = (
        BASE.replace('"UTC"]', '"Asia/Tokyo"]')
        .replace('[servers.fetch]\ncommand = "uvx"\nargs = ["mcp-server-fetch"]\n', "")
        .replace("enabled = false", "")
        .replace('default = "ask"', 'default = "allow"')
        .replace("warm_pool = 1", "warm_pool = 0")
    )
    changes = diff(_load(write_config, BASE), _load(write_config, edited))
    assert changes == ConfigChanges(
        added=("github",),
        changed=("time",),
        removed=("fetch",),
        approval_changed=True,
        kernel_reasons=("kernel.warm_pool: 1 -> 0",),
    )
    assert changes.to_generate == ("github", "time")


def test_max_idle_and_recycle_rss_apply_without_replacing_kernels_or_a_restart(
    write_config: WriteConfig,
) -> None:
    """The idle kernel reaper reads them from the configuration in effect at each check."""
    changes = _edit(write_config, "timeout = 60\n", 'timeout = 60\nmax_idle = 600\nrecycle_rss = "2GiB"\n')
    assert changes == ConfigChanges()
