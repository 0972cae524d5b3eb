"""The stdio wire: the client's pipes move off fds 0 and 1, lines of any size go both ways in order, and
a stdin that is a regular file is left to mcp's own transport."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

# A process that claims the wire, then echoes every line it reads back in upper case. What it (or a child)
# prints on fd 1 after the claim must land on stderr, not on the wire.
ECHO = """
import asyncio, os, subprocess, sys
from ipybox.mcp_server.wire import claim_wire, wire_streams

async def main():
    wire = claim_wire()
    if wire is None:
        print("no wire", file=sys.stderr)
        return
    print("stray print")
    subprocess.run([sys.executable, "-c", "print('stray child')"], check=True)
    async with wire_streams(wire) as (lines, out):
        async for line in lines:
            await out.write(line.upper())
            await out.flush()

asyncio.run(main())
"""


async def test_lines_round_trip_and_stray_output_misses_the_wire() -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        ECHO,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        limit=16 * 1024 * 1024,
    )
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None
    big = "x" * (3 * 1024 * 1024)  # far past asyncio's default 64 KiB line limit
    for line in ("first", big, "é ünïcode"):
        process.stdin.write(f"{line}\n".encode())
        await process.stdin.drain()
        reply = await asyncio.wait_for(process.stdout.readline(), 30)
        assert reply.decode() == f"{line.upper()}\n"
    process.stdin.close()
    assert await asyncio.wait_for(process.stdout.read(), 30) == b""  # EOF in, EOF out, nothing else
    stderr = (await process.stderr.read()).decode()
    assert await process.wait() == 0, stderr
    assert "stray print" in stderr and "stray child" in stderr


@pytest.mark.parametrize("kind", ["regular file", "terminal"])
def test_stdin_that_is_no_pipe_is_left_to_mcp(tmp_path: Path, kind: str) -> None:
    # A terminal would be left non-blocking for the shell after us; a regular file asyncio can't serve.
    if kind == "terminal":
        controller, stdin = os.openpty()
        os.close(controller)
    else:
        requests = tmp_path / "requests.jsonl"
        requests.write_text("hello\n")
        stdin = os.open(requests, os.O_RDONLY)
    try:
        done = subprocess.run(
            [sys.executable, "-c", ECHO], stdin=stdin, capture_output=True, text=True, timeout=60
        )
    finally:
        os.close(stdin)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and "no wire" in done.stderr
