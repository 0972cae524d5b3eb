"""`sandboxed`: a command (e.g. a stdio MCP server) in a sandbox of its own, with a private `/tmp` size."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from ipybox.sandbox.command import sandboxed
from ipybox.sandbox.policy import SandboxPolicy

MIB = 2**20
PROBE = """
import os
s = os.statvfs("/tmp")
print(s.f_blocks * s.f_frsize)
try:
    open("/tmp/big", "wb").write(bytes(16 * 2**20))
except OSError as e:
    print(e.strerror)
"""


@pytest.mark.integration
async def test_a_sandboxed_command_gets_a_private_tmp_of_its_size(tmp_path: Path) -> None:
    async with sandboxed([sys.executable, "-c", PROBE], SandboxPolicy(), tmp_path, tmp_size=8 * MIB) as argv:
        process = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE)
        out, _ = await process.communicate()
    assert out.decode().splitlines() == [str(8 * MIB), "No space left on device"]
