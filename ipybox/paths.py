"""Where ipybox keeps per-user state on the host, outside every workspace.

Stdlib only: the sandbox reads it to keep these places out of a sandboxed process's reach.
"""

from __future__ import annotations

import os
from pathlib import Path


def user_policy_path() -> Path:
    """The user tier of the admin policy (`ipybox.config.admin_policy`): `$XDG_CONFIG_HOME/ipybox/policy.toml`
    (default `~/.config/ipybox/policy.toml`). A sandboxed process can't write its directory."""
    config = os.environ.get("XDG_CONFIG_HOME", "")
    base = Path(config) if os.path.isabs(config) else Path.home() / ".config"
    return base / "ipybox" / "policy.toml"


def user_state_dir() -> Path:
    """`$XDG_STATE_HOME/ipybox` (default `~/.local/state/ipybox`): the server registry and other state
    that only the host writes; a sandboxed process can't, even in a workspace that is the home."""
    # Only an absolute XDG_STATE_HOME counts, as the XDG spec says.
    state = os.environ.get("XDG_STATE_HOME", "")
    base = Path(state) if os.path.isabs(state) else Path.home() / ".local" / "state"
    return base / "ipybox"
