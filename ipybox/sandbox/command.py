"""`sandboxed`: run any command (e.g. a stdio MCP server) in a sandbox of its own, with its own policy."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from ipybox.sandbox.platforms import sandboxed_command
from ipybox.sandbox.policy import SandboxPolicy
from ipybox.sandbox.proxy import DomainProxy


@contextlib.asynccontextmanager
async def sandboxed(
    command: Sequence[str], policy: SandboxPolicy, workspace: Path, *, tmp_size: int | None = None
) -> AsyncIterator[list[str]]:
    """The command line that runs `command` confined by `policy`, valid while the context is open (a
    [DomainProxy][ipybox.sandbox.proxy.DomainProxy] serves it then, if the policy allows domains). That
    proxy has no secrets and no interception CA: `[secrets]` are a workspace's, for its kernels (a
    sandboxed MCP server gets credentials through its own `env`), and a host with method or path rules
    is refused over HTTPS.

    Example:
        ```python
        async with sandboxed(["node", "server.js"], SandboxPolicy(), Path.cwd()) as argv:
            process = await asyncio.create_subprocess_exec(*argv)
            await process.wait()
        ```

    Args:
        command: What to run in the sandbox.
        policy: The sandbox policy.
        workspace: The working directory (writable).
        tmp_size: The private `/tmp`'s size in bytes (Linux only; None: no limit of its own).

    Raises:
        SandboxUnavailableError: This machine can't sandbox (see `ipybox doctor`), or the policy allows
            domains on macOS, which doesn't support that.
        ValueError: A `tmp_size` on macOS, which has no private `/tmp`, or one that is not a whole number
            of bytes above zero.
    """
    # The process's temp files go here on macOS, which has no private /tmp (a Linux sandbox mounts its
    # own and leaves this empty); it goes when the context closes.
    with tempfile.TemporaryDirectory(prefix="ipybox-sandbox-") as temp_dir:
        network = policy.network
        if not network.allowed_domains:
            yield sandboxed_command(command, policy, workspace, temp_dir=Path(temp_dir), tmp_size=tmp_size)
            return
        async with DomainProxy(
            network.allowed_domains, network.denied_domains, read_only=network.read_only
        ) as proxy:
            proxy_socket = await proxy.start()
            yield sandboxed_command(
                command,
                policy,
                workspace,
                proxy_socket=proxy_socket,
                temp_dir=Path(temp_dir),
                tmp_size=tmp_size,
            )
