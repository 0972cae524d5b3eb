"""`diff()`: what changed between two workspace configurations, sorted by what it takes to apply.

- servers: started (or restarted) and their packages generated, or stopped and their packages removed;
- approval rules: handed to the rule engine;
- the kernels' environment, sandbox, warm pool and shell-command approval, and `[secrets]` (resolved
  again by whoever runs the kernels): running kernels are replaced;
- the sandbox's network policy alone (`[sandbox.network]` `allowedDomains`, `deniedDomains`, `readOnly`,
  `unknown`): the running kernels' proxy filters by it from their next connection, when they have one (a
  sandbox that allowed no domain and asked about none has no proxy: then giving it one replaces the
  kernels);
- `kernel.timeout`: applies to the next execution;
- endpoints and workspace directories: only a restart of `ipybox up` applies them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ipybox.config.workspace_config import WorkspaceConfig


@dataclass(frozen=True)
class ConfigChanges:
    """The differences between the configuration that runs and a new one.

    Attributes:
        added: Servers to start and generate: new, or enabled again.
        changed: Enabled servers whose parameters changed: to restart and regenerate.
        removed: Servers to stop and whose packages go: deleted from the file, or disabled.
        approval_changed: `[approval]` differs.
        kernel_reasons: Why running kernels must be replaced (kernel environment, sandbox, warm pool), one
            line each; empty when they need not be.
        network_reasons: Edits of the sandbox's network policy that the running kernels' proxy can apply
            without replacing them (`NETWORK_KEYS`), one line each. When `kernel_reasons` is not empty the
            kernels are replaced anyway, and start with the new policy.
        kernel_timeout_changed: `kernel.timeout` differs (it applies to the next execution).
        restart_reasons: Changes that take effect only when `ipybox up` restarts (endpoints, workspace
            directories), one line each.

    Example:
        ```python
        changes = diff(old, new)
        if changes.removed:
            print("stopping", ", ".join(changes.removed))
        ```
    """

    added: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    approval_changed: bool = False
    kernel_reasons: tuple[str, ...] = ()
    network_reasons: tuple[str, ...] = ()
    kernel_timeout_changed: bool = False
    restart_reasons: tuple[str, ...] = ()

    @property
    def to_generate(self) -> tuple[str, ...]:
        """The servers to (re)start and generate: `added` and `changed`."""
        return (*self.added, *self.changed)

    @property
    def kernels_changed(self) -> bool:
        """Whether running kernels must be replaced."""
        return bool(self.kernel_reasons)

    @property
    def network_changed(self) -> bool:
        """Whether only the running kernels' proxy must be told a new network policy (their sandbox's
        network edits, and nothing that replaces them)."""
        return bool(self.network_reasons) and not self.kernels_changed

    def __bool__(self) -> bool:
        return bool(
            self.added
            or self.changed
            or self.removed
            or self.approval_changed
            or self.kernel_reasons
            or self.network_reasons
            or self.kernel_timeout_changed
            or self.restart_reasons
        )


def diff(old: WorkspaceConfig | None, new: WorkspaceConfig) -> ConfigChanges:
    """What `new` changes over `old` (pure: nothing is read or started).

    Only enabled servers count: a server disabled in `new` is `removed`, one enabled again is `added`.
    Without `old` (start-up) every enabled server is added and the approval policy counts as changed, so
    it reaches the rule engine the way later changes do; kernels and endpoints start with `new` anyway.

    Example:
        ```python
        changes = diff(old, new)
        assert changes.changed == ("time",)  # its args were edited
        ```
    """
    new_servers = {name: new.server_params(name) for name in new.enabled_servers()}
    if old is None:
        return ConfigChanges(added=tuple(sorted(new_servers)), approval_changed=True)
    old_servers = {name: old.server_params(name) for name in old.enabled_servers()}
    return ConfigChanges(
        added=tuple(sorted(new_servers.keys() - old_servers.keys())),
        changed=tuple(
            sorted(n for n in new_servers.keys() & old_servers.keys() if new_servers[n] != old_servers[n])
        ),
        removed=tuple(sorted(old_servers.keys() - new_servers.keys())),
        approval_changed=_dump(old.approval) != _dump(new.approval),
        kernel_reasons=tuple(_kernel_reasons(old, new)),
        network_reasons=tuple(_network_reasons(old, new)),
        kernel_timeout_changed=old.kernel.timeout != new.kernel.timeout,
        restart_reasons=tuple(
            _changed_values("endpoints", _dump(old.endpoints), _dump(new.endpoints))
            + _changed_values("workspace", _dump(old.workspace), _dump(new.workspace))
        ),
    )


def _kernel_reasons(old: WorkspaceConfig, new: WorkspaceConfig) -> list[str]:
    reasons = []
    env_change = _env_change(old.kernel.env, new.kernel.env)
    if env_change:
        reasons.append(f"kernel.env changed: {env_change}")
    # Secrets are resolved again, and kernels get new placeholders and a proxy with the new routes.
    secrets_change = _env_change(_dump_all(old.secrets), _dump_all(new.secrets))
    if secrets_change:
        reasons.append(f"secrets changed: {secrets_change}")
    sandbox_old, sandbox_new = _dump(old.sandbox), _dump(new.sandbox)
    if not _proxy_added(old, new):
        for table in (sandbox_old, sandbox_new):
            for key in NETWORK_KEYS:
                table.get("network", {}).pop(key, None)
    reasons += _changed_values("sandbox", sandbox_old, sandbox_new)
    if old.kernel.warm_pool != new.kernel.warm_pool:
        reasons.append(f"kernel.warm_pool: {old.kernel.warm_pool} -> {new.kernel.warm_pool}")
    # Kernels install shell-command approval when they start: only new kernels get a changed setting.
    for key in ("approve_shell", "require_shell_escape"):
        before, after = getattr(old.kernel, key), getattr(new.kernel, key)
        if before != after:
            reasons.append(f"kernel.{key}: {_show(before)} -> {_show(after)}")
    return reasons


NETWORK_KEYS = ("allowedDomains", "deniedDomains", "readOnly", "unknown")
"""The keys of `[sandbox.network]` a running kernels' proxy applies (`DomainProxy.update`); the others
(`allowUnixSockets`, ...) shape the sandbox a kernel is started in."""


def _proxy_added(old: WorkspaceConfig, new: WorkspaceConfig) -> bool:
    """Sandboxed kernels of `old` had no proxy (no allowed domain and `unknown = "deny"`: no proxy socket in
    their sandbox, no `HTTP(S)_PROXY`), and those of `new` have one: only new kernels can reach it."""
    return old.sandbox.enabled and new.sandbox.enabled and not _has_proxy(old) and _has_proxy(new)


def _has_proxy(config: WorkspaceConfig) -> bool:
    network = config.sandbox.network
    return bool(network.allowed_domains) or network.unknown == "ask"


def _network_reasons(old: WorkspaceConfig, new: WorkspaceConfig) -> list[str]:
    if _proxy_added(old, new):
        return []  # in `kernel_reasons`
    network_old, network_new = _dump(old.sandbox.network), _dump(new.sandbox.network)
    return _changed_values(
        "sandbox.network",
        {key: network_old.get(key) for key in NETWORK_KEYS},
        {key: network_new.get(key) for key in NETWORK_KEYS},
    )


def _env_change(old: Mapping[str, str], new: Mapping[str, str]) -> str:
    # Variable names only: the values may be secrets.
    parts = [f"{name} added" for name in sorted(new.keys() - old.keys())]
    parts += [f"{name} removed" for name in sorted(old.keys() - new.keys())]
    parts += [f"{name} changed" for name in sorted(new.keys() & old.keys()) if old[name] != new[name]]
    return ", ".join(parts)


def _changed_values(prefix: str, old: Any, new: Any) -> list[str]:
    """`path: old -> new` for each differing leaf of two dumped tables."""
    if isinstance(old, dict) and isinstance(new, dict):
        lines = []
        for key in [*old, *(k for k in new if k not in old)]:
            lines += _changed_values(f"{prefix}.{key}", old.get(key), new.get(key))
        return lines
    return [] if old == new else [f"{prefix}: {_show(old)} -> {_show(new)}"]


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()  # as written in TOML
    return "(unset)" if value is None else repr(value)


def _dump_all(models: Mapping[str, Any]) -> dict[str, Any]:
    return {name: _dump(model) for name, model in models.items()}


def _dump(model: Any) -> Any:
    # Dumps, not the models: models compare their private state too (a compiled rule engine).
    return model.model_dump(mode="json", by_alias=True)
