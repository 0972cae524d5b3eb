"""MCP sessions against ipybox's container image, the last step of scripts/test-docker (by hand, not in CI).

Each session is `docker run -i --rm -v <workspace>:/workspace <image>` (the image's default command,
`ipybox mcp --workspace /workspace`) driven by the Python `mcp` package's stdio client from this
checkout's .venv, as an MCP client on the host would drive it. What is checked, in order:

1. `ipybox doctor` in the container: exit 1, and the container check explains that bubblewrap cannot nest
   and which `docker run` flags would let it.
2. A new, empty workspace: `initialize` (timed from `docker run`), `execute_ipython_cell` (timed: the
   first call, and the median of 20 round trips), a file written to /workspace that appears on the host
   owned by the image's user (whose uid is the host user's: scripts/docker-build), an `ipybox.toml`
   created with the sandbox disabled, and the image's one-line note on stderr that kernels run
   unsandboxed.
3. A workspace whose `ipybox.toml` registers MCP servers that work offline inside the image: the repository's
   own test server (tests/servers/edge_server.py, copied into the workspace, run by the image's Python)
   and, when `bash scripts/setup` has installed it, the npm server-memory (mounted read-only, run by the
   image's Node). Code calls a tool of each through the generated API, approved by this client over MCP
   elicitation (the "ask" goes from the container to the host client and back).
4. A workspace that enables the sandbox fails closed (the process exits, nothing is served) with the
   container explanation on stderr.
5. The same workspace with the nesting flags the explanation names: `ipybox doctor` passes, and a kernel
   runs inside bubblewrap inside the container (it sees only a loopback interface).

No container of the image is left running afterwards. Exit status 0 only if every check passed.

As root (the usual case here) the workspace directories are given to the image's user, standing in for a
host user with that uid.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import mcp_types as types
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from ipybox.sandbox import container

ROOT = Path(__file__).resolve().parents[1]
EDGE_SERVER = ROOT / "tests" / "servers" / "edge_server.py"
NODE_MODULES = ROOT / ".cache" / "npm" / "node_modules"
SERVER_MEMORY = NODE_MODULES / "@modelcontextprotocol" / "server-memory" / "dist" / "index.js"
# Mounted read-only where the image's Node finds the server and, walking up, its dependencies.
NODE_MODULES_IN_CONTAINER = "/opt/node_modules"
# The options ipybox's own error and `ipybox doctor` name for letting bubblewrap nest.
NESTING_FLAGS = shlex.split(container.NESTING_FLAGS)
ROUND_TRIPS = 20


class CheckFailed(Exception):
    pass


def check(condition: bool, what: str) -> None:
    if not condition:
        raise CheckFailed(what)
    print(f"  ok  {what}")


def text(result: types.CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, types.TextContent))


class Image:
    """The image under test, its user, and workspaces for it."""

    def __init__(self, tag: str, scratch: Path) -> None:
        self.tag = tag
        self.scratch = scratch
        user = subprocess.run(
            ["docker", "image", "inspect", "--format", "{{.Config.User}}", tag],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        uid, _, gid = user.partition(":")
        self.uid, self.gid = int(uid), int(gid or uid)
        if os.geteuid() != 0 and self.uid != os.geteuid():
            raise CheckFailed(
                f"the image's user has uid {self.uid}, you have {os.geteuid()}: files it writes would not be "
                "yours; rebuild it with scripts/docker-build"
            )

    def workspace(self, name: str) -> Path:
        directory = self.scratch / name
        directory.mkdir()
        if os.geteuid() == 0:
            os.chown(directory, self.uid, self.gid)
        return directory

    def give(self, path: Path) -> None:
        """Files the test writes into a workspace belong to the workspace's user, as a user's own would."""
        if os.geteuid() == 0:
            os.chown(path, self.uid, self.gid)

    def run_args(self, workspace: Path, *extra: str, command: tuple[str, ...] = ()) -> list[str]:
        return ["run", "-i", "--rm", "-v", f"{workspace}:/workspace", *extra, self.tag, *command]


async def open_session(
    stack: AsyncExitStack,
    image: Image,
    workspace: Path,
    errlog: Any,
    *extra: str,
    asks: list[str] | None = None,
) -> ClientSession:
    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        if asks is None:
            return types.ElicitResult(action="decline")
        asks.append(params.message)
        return types.ElicitResult(action="accept", content={"allow": True})

    params = StdioServerParameters(command="docker", args=image.run_args(workspace, *extra))
    read, write = await stack.enter_async_context(stdio_client(params, errlog=errlog))
    session = ClientSession(read, write, elicitation_callback=elicit)
    return await stack.enter_async_context(session)


async def execute(session: ClientSession, code: str) -> str:
    result = await session.call_tool("execute_ipython_cell", {"code": code})
    if result.is_error:
        raise CheckFailed(f"execute_ipython_cell failed: {text(result)}")
    return text(result)


def doctor(image: Image, *extra: str) -> subprocess.CompletedProcess[str]:
    workspace = image.workspace(f"doctor{len(extra)}")
    args = image.run_args(workspace, *extra, command=("ipybox", "doctor"))
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=120, check=False)


def check_doctor(image: Image) -> None:
    print("1. ipybox doctor in the container")
    done = doctor(image)
    line = next((line for line in done.stdout.splitlines() if "container:" in line), "")
    print(f"      {line.strip()[:240]}...")
    check(done.returncode == 1, "doctor exits 1: sandbox=True is not available in a default container")
    check("cannot nest" in line and "seccomp=unconfined" in line, "it says why and which flags would help")


async def check_new_workspace(image: Image, timings: dict[str, float]) -> None:
    print("2. a new workspace, the image's default command")
    workspace = image.workspace("new")
    errlog_path = image.scratch / "new.stderr"
    with errlog_path.open("w") as errlog:
        async with AsyncExitStack() as stack:
            started = time.perf_counter()
            session = await open_session(stack, image, workspace, errlog)
            await session.initialize()
            timings["first initialize"] = time.perf_counter() - started
            tools = {tool.name for tool in (await session.list_tools()).tools}
            check("execute_ipython_cell" in tools, f"initialize and list_tools ({len(tools)} tools)")
            started = time.perf_counter()
            out = await execute(
                session,
                "import os, pathlib\n"
                "pathlib.Path('hello.txt').write_text('written in the container')\n"
                "print(os.getuid(), os.getcwd())",
            )
            timings["first execute"] = time.perf_counter() - started
            check(out == f"{image.uid} /workspace", f"the kernel runs as uid {image.uid} in /workspace")
            samples = []
            for _ in range(ROUND_TRIPS):
                started = time.perf_counter()
                await execute(session, "x = 1")
                samples.append(time.perf_counter() - started)
            timings[f"execute round trip (median of {ROUND_TRIPS})"] = statistics.median(samples)
    hello = workspace / "hello.txt"
    check(hello.is_file() and hello.read_text() == "written in the container", "hello.txt is on the host")
    check(hello.stat().st_uid == image.uid, f"and owned by uid {image.uid}, the host user's")
    config = workspace / "ipybox.toml"
    check(
        config.is_file() and "enabled = false" in config.read_text(), "ipybox.toml created, sandbox disabled"
    )
    notes = [line for line in errlog_path.read_text().splitlines() if "kernels run unsandboxed" in line]
    check(len(notes) == 1, f"stderr says once that kernels run unsandboxed: {notes[0] if notes else ''!r}")


async def check_servers(image: Image) -> None:
    print("3. MCP servers inside the container, approved over elicitation")
    workspace = image.workspace("servers")
    shutil.copy(EDGE_SERVER, workspace / "edge_server.py")
    image.give(workspace / "edge_server.py")
    lines = [
        "[sandbox]",
        "enabled = false",
        "",
        "[servers.edge]",
        'command = "python"',
        'args = ["edge_server.py"]',
    ]
    extra: list[str] = []
    node = SERVER_MEMORY.is_file()
    if node:
        path = f"{NODE_MODULES_IN_CONTAINER}/{SERVER_MEMORY.relative_to(NODE_MODULES)}"
        lines += [
            "",
            "[servers.memory]",
            'command = "node"',
            f"args = [{json.dumps(path)}]",
            'env = { MEMORY_FILE_PATH = "/workspace/memory.jsonl" }',
        ]
        extra = ["-v", f"{NODE_MODULES}:{NODE_MODULES_IN_CONTAINER}:ro"]
    else:
        print(
            "      (no npm server-memory in .cache/npm: run `bash scripts/setup` to check a Node server too)"
        )
    (workspace / "ipybox.toml").write_text("\n".join(lines) + "\n")
    image.give(workspace / "ipybox.toml")
    asks: list[str] = []
    with (image.scratch / "servers.stderr").open("w") as errlog:
        async with AsyncExitStack() as stack:
            session = await open_session(stack, image, workspace, errlog, *extra, asks=asks)
            await session.initialize()
            out = await execute(
                session, "from mcptools.edge import echo\nprint(echo.run(echo.Params(text='via docker')))"
            )
            check(out == "via docker", "the edge server's echo tool answers through its generated API")
            if node:
                code = (
                    "from mcptools.memory import create_entities, read_graph\n"
                    "create_entities.run(create_entities.Params(entities=[create_entities.Entity("
                    "name='ipybox', entityType='project', observations=['runs in a container'])]))\n"
                    "print(read_graph.run(read_graph.Params()).entities[0].observations[0])"
                )
                out = await execute(session, code)
                check(out == "runs in a container", "the npm server-memory's tools answer (the image's Node)")
    calls = 3 if node else 1
    check(len(asks) == calls, f"each of the {calls} tool calls was asked over elicitation")
    if node:
        memory = workspace / "memory.jsonl"
        check(memory.is_file() and memory.stat().st_uid == image.uid, "server-memory's file is the user's")


def check_sandbox_fails_closed(image: Image) -> Path:
    print("4. a workspace that enables the sandbox, default container")
    workspace = image.workspace("sandboxed")
    (workspace / "ipybox.toml").write_text("[sandbox]\nenabled = true\n")
    image.give(workspace / "ipybox.toml")
    done = subprocess.run(
        ["docker", *image.run_args(workspace)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    print(f"      exit {done.returncode}: {done.stderr.strip()[:400]}...")
    check(done.returncode != 0 and done.stdout == "", "it does not start")
    check(
        "this is a container" in done.stderr and "enabled = false" in done.stderr,
        "it says why, and what to do",
    )
    return workspace


async def check_nested_sandbox(image: Image, workspace: Path) -> None:
    print(f"5. the same workspace with {shlex.join(NESTING_FLAGS)}")
    done = doctor(image, *NESTING_FLAGS)
    check(done.returncode == 0, "doctor: sandbox=True works")
    with (image.scratch / "nested.stderr").open("w") as errlog:
        async with AsyncExitStack() as stack:
            session = await open_session(stack, image, workspace, errlog, *NESTING_FLAGS)
            await session.initialize()
            out = await execute(session, "import socket\nprint([name for _, name in socket.if_nameindex()])")
            check(out == "['lo']", f"a kernel runs in bubblewrap (network interfaces: {out})")


def check_nothing_left(image: Image) -> None:
    deadline = time.monotonic() + 30
    while True:
        left = subprocess.run(
            ["docker", "ps", "--quiet", "--filter", f"ancestor={image.tag}"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    check(not left, "no container of the image is left running")


def make_scratch() -> Path:
    scratch = Path(tempfile.mkdtemp(prefix="ipybox-docker-"))
    scratch.chmod(0o755)  # the image's user reaches its workspaces through it
    return scratch


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image", default="ipybox")
    parser.add_argument("--build-seconds", type=float, default=None)
    parser.add_argument("--size", default=None)
    args = parser.parse_args()
    scratch = make_scratch()
    timings: dict[str, float] = {}
    try:
        image = Image(args.image, scratch)
        print(f"image {image.tag}, user {image.uid}:{image.gid}, workspaces in {scratch}")
        check_doctor(image)
        await check_new_workspace(image, timings)
        await check_servers(image)
        await check_nested_sandbox(image, check_sandbox_fails_closed(image))
        check_nothing_left(image)
    except Exception as e:
        # A check that fails inside a session reaches here wrapped in the client's task groups.
        while isinstance(e, BaseExceptionGroup) and len(e.exceptions) == 1:
            e = e.exceptions[0]
        if not isinstance(e, CheckFailed | subprocess.SubprocessError | OSError):
            raise
        print(f"FAILED: {e}\n(workspaces and the containers' stderr are kept in {scratch})", file=sys.stderr)
        return 1
    print("\ntimings:")
    if args.build_seconds is not None:
        print(f"  build (scripts/docker-build, base image present): {args.build_seconds:.1f} s")
    for what, seconds in timings.items():
        print(f"  {what}: {seconds * 1000:.0f} ms" if seconds < 1 else f"  {what}: {seconds:.2f} s")
    if args.size:
        print(f"  image size: {args.size}")
    print("all checks passed")
    shutil.rmtree(scratch)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
