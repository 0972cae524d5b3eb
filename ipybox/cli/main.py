"""`ipybox` command: entry point and sub-commands."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from ipybox import __version__


async def _exec(code: str, workspace: Path, timeout: float) -> int:
    from ipybox.code_exec.result import CodeExecutionError
    from ipybox.facade import CodeExecutor

    async with CodeExecutor(working_dir=workspace, spare_kernel=False) as executor:
        try:
            async for item in executor.stream(code, timeout=timeout, chunks=True):
                from ipybox.code_exec.result import CodeExecutionChunk, CodeExecutionResult

                if isinstance(item, CodeExecutionChunk):
                    (sys.stderr if item.stream == "stderr" else sys.stdout).write(item.text)
                elif isinstance(item, CodeExecutionResult):
                    for image in item.images:
                        print(f"[image: {image}]")
        except CodeExecutionError as e:
            print(str(e), file=sys.stderr)
            return 1
        except TimeoutError as e:
            print(f"ipybox: {e}", file=sys.stderr)
            return 124
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the `ipybox` command."""
    parser = argparse.ArgumentParser(
        prog="ipybox", description="Sandboxed Python code execution with MCP tools."
    )
    parser.add_argument("--version", action="version", version=f"ipybox {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    run = commands.add_parser("exec", help="execute Python code in a fresh kernel and print its output")
    run.add_argument("code", nargs="?", help="the code (default: read from standard input)")
    run.add_argument("--workspace", type=Path, default=Path("."), help="working directory of the kernel")
    run.add_argument("--timeout", type=float, default=120, help="seconds the code may run (default: 120)")
    args = parser.parse_args(argv)
    if args.command == "exec":
        code = args.code if args.code is not None else sys.stdin.read()
        try:
            return asyncio.run(_exec(code, args.workspace.resolve(), args.timeout))
        except KeyboardInterrupt:
            return 130
    parser.print_help()
    return 0
