"""Inside a sandbox: `python -m ipybox.sandbox.netbridge SOCKET -- COMMAND...`.

The sandbox's network namespace has only a loopback interface. This launcher listens on a free port of
that loopback, forwards every connection to the host's [DomainProxy][ipybox.sandbox.proxy.DomainProxy]
through its bind-mounted Unix socket, and runs COMMAND (a kernel, an MCP server) with the standard proxy
variables pointing at it, so pip, requests, httpx, urllib, curl, git and Node (with NODE_USE_ENV_PROXY)
go through the proxy. It forwards termination signals to COMMAND and exits with its status.

Standard library only: it starts before every sandboxed process that has network access.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

_LOCAL = ("localhost", "127.0.0.1", "::1")


def proxy_env(port: int) -> dict[str, str]:
    """The variables that send a process's HTTP(S) traffic to the bridge on `port`."""
    url = f"http://127.0.0.1:{port}"
    env = {"NODE_USE_ENV_PROXY": "1"}
    for name in ("HTTP_PROXY", "HTTPS_PROXY"):
        env[name] = env[name.lower()] = url
    env["NO_PROXY"] = env["no_proxy"] = ",".join(_LOCAL)
    return env


async def _forward(proxy_socket: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        upstream_reader, upstream_writer = await asyncio.open_unix_connection(proxy_socket)
    except OSError:
        writer.close()
        return
    await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))
    upstream_writer.close()
    writer.close()


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until end of stream, then pass the end on (half-close), so each direction ends on its own."""
    try:
        while chunk := await reader.read(64 * 1024):
            writer.write(chunk)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        writer.close()


async def run(proxy_socket: str, command: list[str]) -> int:
    """Serve the bridge while COMMAND runs; COMMAND's exit status."""
    server = await asyncio.start_server(
        lambda r, w: _forward(proxy_socket, r, w), "127.0.0.1", 0, reuse_address=True
    )
    port = server.sockets[0].getsockname()[1]
    process = await asyncio.create_subprocess_exec(*command, env={**os.environ, **proxy_env(port)})
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(signum, process.send_signal, signum)
    status = await process.wait()
    server.close()
    return status if status >= 0 else 128 - status


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 3 or args[1] != "--":
        sys.exit("usage: python -m ipybox.sandbox.netbridge PROXY_SOCKET -- COMMAND [ARGS...]")
    sys.exit(asyncio.run(run(args[0], args[2:])))


if __name__ == "__main__":
    main()
