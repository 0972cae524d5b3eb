"""The admin tier: policy files outside any workspace whose rules and sandbox minimums a workspace's
`ipybox.toml` cannot loosen.

Two files are read, both optional, strongest first:

- the system tier, `/etc/ipybox/policy.toml` (`SYSTEM_POLICY`), which must be owned by root;
- the user tier, `$XDG_CONFIG_HOME/ipybox/policy.toml` (default `~/.config/ipybox/policy.toml`,
  `user_policy_path()`), owned by root or the user running ipybox.

```toml
[approval]
[[approval.rules]]
id = "no-shell-rm"
server = "shell"
tool = "rm"
decision = "deny"
reason = "deleting files is not allowed on this machine"

[sandbox]
enabled = true                          # every workspace must sandbox its kernels
allowedDomains = ["pypi.org", "*.pythonhosted.org"]   # the most a workspace may let kernels reach
```

Contracts:

- Rules only tighten. A tier's rules may `deny` or `ask` (an `allow` is refused when the file loads:
  it could only be overridden, which would make it a lie); a call is decided by the strictest verdict of
  the tiers and the workspace (`ApprovalPolicy.decide`), and `ipybox status`, `ipybox policy check` and
  the audit log name the tier that decided.
- Sandbox minimums are checked when the workspace loads: `[sandbox] enabled = true` refuses a workspace
  that turns the sandbox off (or runs kernels on a `[kernel.gateway]`, which this machine does not
  sandbox), and `allowedDomains` bounds the workspace's `allowedDomains` (each of its entries must be one
  of the tier's, or a subdomain a `*.` entry covers). A violation is a `ConfigError` at the workspace's
  key, naming the tier's file: `ipybox up` refuses to start, a running workspace keeps its last good
  configuration.
- Fail closed: a tier file that exists but cannot be trusted (not a regular file, writable by group or
  others, owned by another user, in a directory others can write) or does not load is an error, never
  skipped: an admin policy that silently does not apply is worse than none.
- Read on every load of the workspace (start-up and each reload), so an edit of a tier applies when the
  workspace next reloads or starts. Kernels must not be able to write a tier: the system tier is root's;
  the user tier is refused when it lies inside the workspace or a path `[sandbox]` makes writable, and
  with `[sandbox] enabled = false` kernels run as the user and could edit it, which `ipybox status`
  reports (use the system tier where that matters).
"""

from __future__ import annotations

import fnmatch
import os
import stat
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ipybox.config.diagnostics import ValueSource, in_file, problems_from_errors
from ipybox.config.errors import ConfigError, ConfigProblem
from ipybox.paths import user_policy_path
from ipybox.rules.models import AdminTier, Rule

__all__ = [
    "SYSTEM_POLICY",
    "AdminPolicy",
    "AdminPolicyFile",
    "admin_tiers",
    "read_admin_policy",
    "user_policy_path",
]

SYSTEM_POLICY = Path("/etc/ipybox/policy.toml")
"""The system tier's file: owned by root."""

_MAX_CHARS = 1 << 20


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_by_name=True, validate_by_alias=True)


class AdminApproval(_Strict):
    """`[approval]` of a tier: its rules (deny and ask only)."""

    rules: list[Rule] = Field(default_factory=list)

    @field_validator("rules")
    @classmethod
    def _only_tighten(cls, rules: list[Rule]) -> list[Rule]:
        for index, rule in enumerate(rules):
            if rule.decision == "allow":
                name = repr(rule.id) if rule.id is not None else f"rules[{index}]"
                raise ValueError(
                    f"rule {name}: an admin policy only tightens (deny or ask); a workspace's ipybox.toml "
                    "allows what the admin tier does not deny"
                )
        return rules


class AdminSandbox(_Strict):
    """`[sandbox]` of a tier: minimums every workspace must meet."""

    enabled: bool = False
    allowed_domains: list[str] | None = Field(default=None, alias="allowedDomains")


class AdminPolicyFile(_Strict):
    """A tier's file: `[approval]` rules and `[sandbox]` minimums."""

    approval: AdminApproval = Field(default_factory=AdminApproval)
    sandbox: AdminSandbox = Field(default_factory=AdminSandbox)


@dataclass(frozen=True)
class AdminPolicy:
    """One tier as read.

    Attributes:
        name: `system` or `user`.
        path: Its file.
        policy: What it says.
    """

    name: str
    path: Path
    policy: AdminPolicyFile

    def tier(self) -> AdminTier:
        """Its rules, for `ApprovalPolicy.with_admin`."""
        return AdminTier(self.name, str(self.path), list(self.policy.approval.rules))


def admin_tiers() -> list[tuple[str, Path]]:
    """The tiers' names and files, strongest first (whether the files exist or not)."""
    return [("system", SYSTEM_POLICY), ("user", user_policy_path())]


def read_admin_policy(workspace: Path | None = None, writable: Iterable[Path] = ()) -> list[AdminPolicy]:
    """The tiers whose files exist, strongest first.

    Args:
        workspace: The workspace being loaded: a tier inside it is refused (its kernels write there).
        writable: Other paths kernels may write (`[sandbox] allowWrite`): a tier under one is refused.

    Raises:
        ConfigError: A tier exists but cannot be trusted or does not load (see the module).
    """
    found = []
    for name, path in admin_tiers():
        policy = _read_tier(name, path, workspace, writable)
        if policy is not None:
            found.append(AdminPolicy(name, path, policy))
    return found


def _read_tier(
    name: str, path: Path, workspace: Path | None, writable: Iterable[Path]
) -> AdminPolicyFile | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        return None
    except OSError as e:
        _fail(path, f"the {name} admin policy cannot be read ({e.strerror}); fix its permissions")
    try:
        info = os.fstat(fd)
        _check_trust(name, path, info, workspace, writable)
        with open(fd, encoding="utf-8", closefd=False) as file:
            source = file.read(_MAX_CHARS + 1)
    except UnicodeDecodeError as e:
        _fail(path, f"not UTF-8 text ({e.reason} at byte {e.start})")
    finally:
        os.close(fd)
    if len(source) > _MAX_CHARS:
        _fail(path, f"longer than {_MAX_CHARS} characters (an admin policy is a few kilobytes)")
    try:
        data = tomllib.loads(source)
    except tomllib.TOMLDecodeError as e:
        _fail(path, f"not valid TOML: {e}")
    try:
        return AdminPolicyFile.model_validate(data)
    except ValidationError as e:
        located = [ValueSource(data, in_file(path, source))]
        problems = problems_from_errors(e.errors(), located, AdminPolicyFile)
        raise ConfigError(path, problems) from None


def _check_trust(
    name: str, path: Path, info: os.stat_result, workspace: Path | None, writable: Iterable[Path]
) -> None:
    if not stat.S_ISREG(info.st_mode):
        _fail(path, f"the {name} admin policy is not a regular file")
    owners = {0} if name == "system" else {0, os.geteuid()}
    if info.st_uid not in owners:
        who = "root" if name == "system" else "root or you"
        _fail(path, f"the {name} admin policy is owned by uid {info.st_uid}, not {who}: chown it")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        _fail(path, f"the {name} admin policy is writable by others: `chmod go-w {path}`")
    try:
        parent = os.stat(path.parent)
    except OSError:
        parent = None
    if parent is not None and parent.st_mode & stat.S_IWOTH and not parent.st_mode & stat.S_ISVTX:
        _fail(path, f"{path.parent} is writable by anyone, who could replace the {name} admin policy")
    real = path.resolve()
    places = [("the workspace", workspace)] if workspace is not None else []
    places += [("a path [sandbox] allowWrite makes writable", Path(p)) for p in writable]
    for what, place in places:
        if place is not None and real.is_relative_to(place.resolve()):
            _fail(path, f"the {name} admin policy is inside {what}, where kernels can write: move it")


def _fail(path: Path, reason: str) -> Any:
    raise ConfigError(path, [ConfigProblem(str(path), None, None, reason)])


def domain_allowed(domain: str, allowed: Iterable[str]) -> bool:
    """Whether a workspace's `allowedDomains` entry stays within a tier's: equal to one of its entries,
    or covered by a `*.` entry (`*.example.com` covers `api.example.com` and `*.api.example.com`)."""
    for entry in allowed:
        if domain == entry:
            return True
        if entry.startswith("*.") and (domain.endswith(entry[1:]) or fnmatch.fnmatchcase(domain, entry)):
            return True
    return False
