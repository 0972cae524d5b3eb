"""Workspaces for the supervisor and CLI tests: our edge server with rules that allow, deny and ask."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ipybox.limits import unenforceable_defaults
from tests.servers.params import EDGE_SERVER
from tests.servers.processes import TAG_ENV

RULES = """
[approval]
default = "ask"
ask_timeout = {ask_timeout}

[[approval.rules]]
id = "echo-ok"
server = "edge"
tool = ["echo", "add"]
decision = "allow"
match = [{{ server = "edge", tool = "echo", args = {{ text = "hi" }} }}]

[[approval.rules]]
id = "no-getenv"
server = "edge"
tool = "getenv"
decision = "deny"
"""


def edge_server(tag: str, name: str = "edge") -> str:
    """A `[servers.<name>]` table running our edge server, its processes tagged with `tag`."""
    return (
        f"[servers.{name}]\ncommand = {json.dumps(sys.executable)}\nargs = [{json.dumps(str(EDGE_SERVER))}]\n"
        f'env = {{ {TAG_ENV} = "{tag}" }}\n'
    )


def sandboxed_kernels(network: str) -> str:
    """The head of an `ipybox.toml` for one sandboxed warm kernel (with what this machine can't enforce
    lifted, as `ipybox init` writes it), and `[sandbox.network]` with the lines in `network`."""
    lifted = unenforceable_defaults(sandboxed=True)
    limits = "[kernel.limits]\n" + "".join(f'{n} = "unlimited"\n' for n in lifted) + "\n" if lifted else ""
    return f"[kernel]\nwarm_pool = 1\n\n{limits}[sandbox]\nenabled = true\n\n[sandbox.network]\n{network}\n"


def make_workspace(
    directory: Path, tag: str, *, sandbox: bool = False, warm_pool: int = 1, ask_timeout: float = 10
) -> Path:
    """Write `ipybox.toml` into `directory` (plus a `.env` with a secret) and return the directory."""
    (directory / ".env").write_text("WORKSPACE_SECRET=never-in-a-kernel\n")
    # As `ipybox init` writes it: a default this machine can't enforce (memory for an unsandboxed kernel of
    # an unprivileged user without a control group) is lifted in the file.
    lifted = unenforceable_defaults(sandboxed=sandbox)
    limits = (
        "[kernel.limits]\n" + "".join(f'{name} = "unlimited"\n' for name in lifted) + "\n" if lifted else ""
    )
    (directory / "ipybox.toml").write_text(
        f'[kernel]\nwarm_pool = {warm_pool}\nenv = {{ {TAG_ENV} = "{tag}" }}\n\n'
        + limits
        + f"[sandbox]\nenabled = {str(sandbox).lower()}\n\n"
        + edge_server(tag)
        + RULES.format(ask_timeout=ask_timeout)
    )
    return directory
