"""`ipybox lock accept [SERVER] [-w DIR]`: pin in `ipybox.lock` what a workspace's servers serve now.

In a running workspace the supervisor pins what its servers listed (`POST /lock/accept`): their changed
and new tools are decided by the rules again at once. Otherwise each server (or `SERVER`) is started
just long enough to list its tools, and the lock is written from that listing; a server that can't start
is reported and its pins are left as they are. Exit status: 0, or 2 when the workspace or a server can't
be read (one line saying what to fix). `--json` prints `{"accepted": [...], "failed": {name: why}}`.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ipybox.display_text import printable

if TYPE_CHECKING:
    import mcp_types as types

from ipybox.cli.policy import EXIT_TROUBLE
from ipybox.cli.policy import fail as _fail


def accept(workspace: Path, server: str | None, *, as_json: bool) -> int:
    """`ipybox lock accept`: see the module."""
    from ipybox.errors import IpyboxError
    from ipybox.running.state import NotRunningError, read_state

    try:
        read_state(workspace)
        running = True
    except NotRunningError:
        running = False
    try:
        failed: dict[str, str] = {}
        if running:
            accepted = asyncio.run(_accept_running(workspace, server))
        else:
            accepted, failed = asyncio.run(_accept_offline(workspace, server))
    except (IpyboxError, KeyError) as e:
        return _fail(str(e.args[0]) if isinstance(e, KeyError) else str(e), as_json)
    if as_json:
        print(json.dumps({"accepted": accepted, "failed": failed, "running": running}))
    else:
        if accepted:
            print(printable(f"pinned in ipybox.lock: {', '.join(accepted)}"))
        else:
            print("ipybox.lock already pins what the servers serve: nothing to accept")
        for name, why in failed.items():
            print(printable(f"ipybox: server {name!r} was not pinned: {why}"), file=sys.stderr)
    return EXIT_TROUBLE if failed else 0


async def _accept_running(workspace: Path, server: str | None) -> list[str]:
    from ipybox.running.control_client import ControlClient

    async with ControlClient.of(workspace) as client:
        return await client.accept_pins(server)


async def _accept_offline(workspace: Path, server: str | None) -> tuple[list[str], dict[str, str]]:
    from ipybox.cli.validate_live import list_server_tools
    from ipybox.config import load_config
    from ipybox.config.tool_lock import (
        LOCK_FILE,
        LockFileError,
        ToolLock,
        accept,
        compare,
        pin_server,
        read_lock,
        write_lock,
    )

    config = load_config(workspace)
    if server is not None and server not in config.enabled_servers():
        known = ", ".join(sorted(config.enabled_servers())) or "none"
        raise KeyError(f"the workspace has no enabled server {server!r} (its servers: {known})")
    if server is not None:
        config = config.model_copy(update={"servers": {server: config.servers[server]}})
    listed: dict[str, tuple[str | None, list[types.Tool]]] = {}

    def on_listed(name: str, version: str | None, tools: list[types.Tool]) -> None:
        listed[name] = (version, tools)

    results = await list_server_tools(config, workspace, on_listed=on_listed)
    failed = {name: why for name, why in results.items() if isinstance(why, str)}
    path = workspace / LOCK_FILE
    try:
        lock = read_lock(path)
    except LockFileError:
        lock = ToolLock()  # unreadable: written anew from what the servers serve
    accepted = []
    for name, (version, tools) in sorted(listed.items()):
        current = pin_server(version, tools)
        pinned = lock.servers.get(name)
        if pinned is not None and compare(pinned, current).clean:
            continue
        lock = accept(lock, name, current)
        accepted.append(name)
    if accepted:
        await asyncio.to_thread(write_lock, path, lock)
    return accepted, failed
