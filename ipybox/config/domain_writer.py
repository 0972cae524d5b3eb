"""`write_domain_answer()`: a person's `always` answer to an ask about a host (`[sandbox.network] unknown =
"ask"`), written into `ipybox.toml`: the host appended to `allowedDomains` (allowed) or `deniedDomains`
(denied) of `[sandbox.network]`, as an exact entry.

The array is edited in place with tomlkit, wherever the file keeps it (a `[sandbox.network]` table, an
inline `network = { ... }`, dotted keys), its other entries, comments and layout kept; a missing array
(or table) is added. The running kernels' proxy gets the edit as any other network edit: the reconciler
applies it without replacing them (`ipybox.config.changes.NETWORK_KEYS`).

Contract: the file is changed by `ipybox.config.file_edit.edit_config_file` (atomically, only if it loads
afterwards with the real loader, an admin policy's bounds included) and only if the host is then allowed
(or denied) by the loaded policy; otherwise `DomainWriteError` says why (an environment variable that sets
the array, a `deniedDomains` entry that covers the host, ...) and nothing is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import tomlkit
from tomlkit.items import Array

from ipybox.config.file_edit import EditRules, edit_config_file
from ipybox.config.loading import CONFIG_FILE
from ipybox.config.workspace_config import WorkspaceConfig
from ipybox.errors import IpyboxError
from ipybox.sandbox.domains import domain_entry_error, normalize_host

__all__ = ["DomainWriteError", "write_domain_answer"]

_ANYWAY = "Answering once or for this session still works."


class DomainWriteError(IpyboxError, ValueError):
    """The host could not be written into `ipybox.toml`; nothing was written. `str(error)` says why."""


def write_domain_answer(config_path: Path, host: str, *, accept: bool) -> str:
    """Add `host` to `[sandbox.network] allowedDomains` (`accept`) or `deniedDomains` of `ipybox.toml`.

    Args:
        config_path: The workspace's `ipybox.toml` (or the workspace directory).
        host: The host asked about (a name or an address, as the proxy saw it).
        accept: `True` allows it, `False` denies it.

    Returns:
        The key it was added to (`sandbox.network.allowedDomains`).

    Raises:
        DomainWriteError: It was not written; the message says why and what to do instead.
    """
    path = Path(config_path)
    if path.is_dir():
        path = path / CONFIG_FILE
    key = "allowedDomains" if accept else "deniedDomains"
    name = normalize_host(host)

    def refuse(why: str) -> DomainWriteError:
        return DomainWriteError(f"{name} was not added to {key} in {path}: {why}")

    if (problem := domain_entry_error(name)) is not None:
        raise refuse(problem)
    rules = EditRules(
        refuse=refuse,
        fix_first="fix it, then answer again",
        missing="there is no such file (was the workspace moved?)",
        by_hand=f"add it by hand. {_ANYWAY}",
        again=f"answer again once it is saved. {_ANYWAY}",
        change=f"{name} in {key}",
    )

    def edit(text: str, current: WorkspaceConfig) -> tuple[str, None]:
        document = tomlkit.parse(text)
        entries = _array(_table(_table(document, "sandbox", super_table=True), "network"), key)
        entries.append(name)
        return tomlkit.dumps(document), None

    def took_effect(config: WorkspaceConfig, _: None) -> str | None:
        hosts = config.sandbox.network.domain_filter()
        if accept and not hosts.allows(name):
            return (
                f"with it the file still does not allow {name} (a deniedDomains entry covers it, or an "
                f"environment variable sets {key}); {_ANYWAY}"
            )
        if not accept and not hosts.denies(name):
            return (
                f"with it the file still does not deny {name} (an environment variable sets {key}); {_ANYWAY}"
            )
        return None

    edit_config_file(path, edit, took_effect, rules)
    return f"sandbox.network.{key}"


def _table(container: Any, key: str, *, super_table: bool = False) -> Any:
    table = container.get(key)
    if table is None:
        table = tomlkit.table(is_super_table=super_table)
        container[key] = table
    elif not hasattr(table, "get"):
        raise DomainWriteError(f"{key} in ipybox.toml is not a table")
    return table


def _array(table: Any, key: str) -> Array:
    entries = table.get(key)
    if entries is None:
        table[key] = tomlkit.array()
        entries = table[key]
    if not isinstance(entries, Array):
        raise DomainWriteError(f"{key} in ipybox.toml is not an array")
    return entries
