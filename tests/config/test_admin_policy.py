"""The admin tier: policy files outside the workspace whose rules and sandbox minimums `ipybox.toml`
cannot loosen, read when the workspace loads and refused (never skipped) when they can't be trusted."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ipybox.config import ConfigError, admin_policy, load_config
from ipybox.rules import ToolCall

TIER = """
[[approval.rules]]
id = "no-deletes"
tool = "delete_*"
decision = "deny"
reason = "nothing is deleted on this machine"

[sandbox]
enabled = true
allowedDomains = ["pypi.org", "*.pythonhosted.org"]
"""


@pytest.fixture
def tiers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """The system tier's file (absent until a test writes it) and the user tier's."""
    system = tmp_path / "etc" / "ipybox" / "policy.toml"
    system.parent.mkdir(parents=True)
    monkeypatch.setattr(admin_policy, "SYSTEM_POLICY", system)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    user = tmp_path / "config" / "ipybox" / "policy.toml"
    user.parent.mkdir(parents=True)
    return system, user


def workspace(tmp_path: Path, text: str) -> Path:
    directory = tmp_path / "ws"
    directory.mkdir(exist_ok=True)
    (directory / "ipybox.toml").write_text(text)
    return directory


SANDBOXED = (
    '[sandbox]\nenabled = true\n[sandbox.network]\nallowedDomains = ["pypi.org", "files.pythonhosted.org"]\n'
)
ALLOW_ALL = (
    '[approval]\ndefault = "allow"\n[[approval.rules]]\nid = "all"\ndecision = "allow"\npriority = 1000\n'
)


def test_a_tier_deny_decides_over_a_workspace_allow_of_any_priority(
    tiers: tuple[Path, Path], tmp_path: Path
) -> None:
    system, _ = tiers
    system.write_text(TIER)
    config = load_config(workspace(tmp_path, SANDBOXED + ALLOW_ALL))
    verdict = config.approval.decide(ToolCall("fs", "delete_file"))
    assert (verdict.decision, verdict.rule_id, verdict.tier) == ("deny", "no-deletes", "system")
    assert verdict.explanation == "nothing is deleted on this machine"
    assert config.approval.decide(ToolCall("fs", "read_file")).decision == "allow"


def test_both_tiers_apply_the_system_one_first(tiers: tuple[Path, Path], tmp_path: Path) -> None:
    system, user = tiers
    system.write_text('[[approval.rules]]\nid = "asks"\ntool = "write_*"\ndecision = "ask"\n')
    user.write_text('[[approval.rules]]\nid = "mine"\ntool = "write_*"\ndecision = "deny"\n')
    config = load_config(workspace(tmp_path, ALLOW_ALL))
    assert [tier.name for tier in config.approval.admin] == ["system", "user"]
    verdict = config.approval.decide(ToolCall("fs", "write_file"))
    assert (verdict.decision, verdict.rule_id, verdict.tier) == ("deny", "mine", "user")


def test_a_workspace_that_turns_the_required_sandbox_off_does_not_load(
    tiers: tuple[Path, Path], tmp_path: Path
) -> None:
    system, _ = tiers
    system.write_text(TIER)
    with pytest.raises(ConfigError) as caught:
        load_config(workspace(tmp_path, "[sandbox]\nenabled = false\n"))
    message = str(caught.value)
    assert (
        f"ipybox.toml:2:1: sandbox.enabled: the system admin policy ({system}) requires sandboxed" in message
    )


def test_a_workspace_may_reach_no_domain_beyond_the_tiers_list(
    tiers: tuple[Path, Path], tmp_path: Path
) -> None:
    system, _ = tiers
    system.write_text(TIER)
    load_config(workspace(tmp_path, SANDBOXED))  # a subdomain that `*.pythonhosted.org` covers
    beyond = SANDBOXED.replace('"pypi.org"', '"pypi.org", "evil.example"')
    with pytest.raises(
        ConfigError, match=r"lets kernels reach only pypi.org, \*.pythonhosted.org; remove evil.example"
    ):
        load_config(workspace(tmp_path, beyond))
    # Asking about unknown hosts would let a person allow any host: refused, at the key.
    asking = SANDBOXED + 'unknown = "ask"\n'
    with pytest.raises(
        ConfigError, match=r'ipybox.toml:5:\d+: sandbox.network.unknown: .*set unknown = "deny"'
    ):
        load_config(workspace(tmp_path, asking))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[[approval.rules]]\nid = "ok"\ndecision = "allow"\n', "rule 'ok': an admin policy only tightens"),
        ("[approval]\ndefault = 'allow'\n", "default"),
        ("[sandbox]\nenabled = 'sometimes'\n", "enabled"),
        ("[[approval.rules]\n", "not valid TOML"),
    ],
)
def test_a_tier_that_does_not_load_stops_the_workspace_from_loading_naming_its_file(
    tiers: tuple[Path, Path], tmp_path: Path, text: str, message: str
) -> None:
    _, user = tiers
    user.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(workspace(tmp_path, ""))
    assert str(user) in str(caught.value) and message in str(caught.value)


def test_a_tier_others_can_write_is_refused_not_skipped(tiers: tuple[Path, Path], tmp_path: Path) -> None:
    _, user = tiers
    user.write_text(TIER)
    os.chmod(user, 0o666)
    with pytest.raises(ConfigError, match="writable by others: `chmod go-w"):
        load_config(workspace(tmp_path, SANDBOXED))


def test_a_tier_inside_the_workspace_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = workspace(tmp_path, "")
    monkeypatch.setattr(admin_policy, "SYSTEM_POLICY", tmp_path / "none.toml")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(directory / "config"))  # the workspace is the home
    (directory / "config" / "ipybox").mkdir(parents=True)
    (directory / "config" / "ipybox" / "policy.toml").write_text(TIER)
    with pytest.raises(ConfigError, match="inside the workspace, where kernels can write"):
        load_config(directory)
