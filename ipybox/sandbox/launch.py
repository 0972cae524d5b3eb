"""Starts one sandboxed kernel: `python -m ipybox.sandbox.launch PLAN CONNECTION_FILE -- KERNEL ARGV`.

The kernel gateway runs this on the host for every kernel start (it is the kernelspec's command); it
builds the sandbox's filesystem from what exists at that moment ([view][ipybox.sandbox.view]) and
replaces itself with bubblewrap. Two things are only known here, per kernel:

- the kernel's own connection file (its HMAC key) and ipc socket directory, which are the only ones of
  the gateway's runtime files bound into its sandbox: a kernel can't reach another kernel's sockets;
- the workspace as it is now: a `.env` the host created after the gateway started is hidden all the same.

The plan (a resource of [sandboxed_kernel_launch][ipybox.sandbox.bwrap.sandboxed_kernel_launch], which
ipybox's gateway writes next to its kernelspec, in its private runtime directory) is host-only: no
kernel can read or write it.
Stdlib only, to keep kernel starts fast. ipybox's own gateway builds the same command line in its
process instead of running this one ([gateway_kernels][ipybox.kernels.gateway_kernels]).
"""

from __future__ import annotations

import json
import os
import sys

from ipybox.sandbox.view import View, mount_args

TYPE_CHECKING = False  # not `typing`: see view
if TYPE_CHECKING:
    from typing import Any

PLAN_FILE = "sandbox.json"
LAUNCH_MODULE = "ipybox.sandbox.launch"


def make_plan(
    bwrap: str, namespaces: list[str], view: View, environment: list[str], prefix: list[str]
) -> str:
    """The plan file's content: the parts of a kernel's bubblewrap command line fixed when the gateway
    starts (the executable, namespace options, the view's rules, environment, a command prefix)."""
    plan = {"bwrap": bwrap, "namespaces": namespaces, "view": view.to_json()}
    return json.dumps({**plan, "environment": environment, "prefix": prefix})


def command_line(plan: dict[str, Any], connection_file: str, command: list[str]) -> list[str]:
    """The bubblewrap command line that starts `command` as the kernel of `connection_file`."""
    view = View.from_json(plan["view"])
    with open(connection_file) as f:
        connection = json.load(f)
    view.readable.append(connection_file)
    if connection.get("transport") == "ipc":
        # Its own socket directory (the gateway gives every kernel one), where the kernel binds its sockets.
        view.writable.append(os.path.dirname(connection["ip"]))
    bwrap = str(plan["bwrap"])
    return [
        bwrap,
        *plan["namespaces"],
        *mount_args(view),
        *plan["environment"],
        "--",
        *plan["prefix"],
        *command,
    ]


def main(argv: list[str]) -> None:
    if len(argv) < 4 or argv[2] != "--":
        sys.exit("usage: python -m ipybox.sandbox.launch PLAN CONNECTION_FILE -- COMMAND...")
    plan_path, connection_file, command = argv[0], argv[1], argv[3:]
    with open(plan_path) as f:
        plan = json.load(f)
    args = command_line(plan, connection_file, command)
    os.execv(args[0], args)


if __name__ == "__main__":
    main(sys.argv[1:])
