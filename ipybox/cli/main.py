"""`ipybox` command: entry point and sub-commands.

Errors: an [IpyboxError][ipybox.errors.IpyboxError] (ipybox could not do it, and the message says why)
is printed as `ipybox: <message>` and exits with `EXIT_ERROR`; any other exception is a bug in ipybox,
printed with its traceback and where to report it, and also exits with `EXIT_ERROR` (as an uncaught
exception would). Sub-commands handle only errors they print differently (a code error's traceback, a
timeout's exit status); everything else reaches `main`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import traceback
from pathlib import Path

from ipybox import __version__
from ipybox.cli import servers
from ipybox.cli.mcp_compat import LOG_LEVELS, configure_logging, unused_endpoint_options
from ipybox.errors import IpyboxError

EXIT_ERROR = 1
EXIT_TIMEOUT = 124
EXIT_INTERRUPTED = 130
REPORT_BUGS = "https://github.com/gradion-ai/ipybox/issues"

_UNUSED_ENDPOINT_OPTIONS: tuple[tuple[str, type], ...] = (
    ("--tool-server-host", str),
    ("--tool-server-port", int),
    ("--kernel-gateway-host", str),
    ("--kernel-gateway-port", int),
)
# Any of these without a sub-command is ipybox 0.9's form of `ipybox mcp` (`ipybox --workspace DIR`).
_MCP_OPTION_DESTS = (
    "mcp_workspace",
    "mcp_sandbox",
    "mcp_sandbox_config",
    "mcp_log_level",
    "mcp_tool_server_host",
    "mcp_tool_server_port",
    "mcp_kernel_gateway_host",
    "mcp_kernel_gateway_port",
)


async def _decide(request: object, approve: str) -> bool:
    from ipybox.approval.request import ApprovalRequest
    from ipybox.utils import arun

    assert isinstance(request, ApprovalRequest)
    call = f"{request.server_name}.{request.tool_name}({request.tool_args})"
    if approve == "all":
        return True
    if approve == "ask":
        answer = await arun(input, f"ipybox: run tool call {call}? [y/N] ")
        return answer.strip().lower() in ("y", "yes")
    print(f"ipybox: rejected tool call {call} (pass --approve all or --approve ask)", file=sys.stderr)
    return False


async def _exec(
    code: str, workspace: Path, timeout: float, approve: str, sandbox: bool, sandbox_config: Path | None
) -> int:
    from ipybox.approval.request import ApprovalRequest
    from ipybox.executor.code_executor import CodeExecutor
    from ipybox.kernels.result import CodeExecutionChunk, CodeExecutionError, CodeExecutionResult

    # A policy file asks for the sandbox: `--sandbox-config F` alone sandboxes (never runs unsandboxed).
    sandbox = sandbox or sandbox_config is not None
    executor = CodeExecutor(
        working_dir=workspace, spare_kernel=False, sandbox=sandbox, sandbox_config=sandbox_config
    )
    await executor.start()  # an IpyboxError (e.g. the sandbox is unavailable) is shown by `main`
    try:
        async for item in executor.stream(code, timeout=timeout, chunks=True):
            if isinstance(item, ApprovalRequest):
                await (item.accept() if await _decide(item, approve) else item.reject())
            elif isinstance(item, CodeExecutionChunk):
                out = sys.stderr if item.stream == "stderr" else sys.stdout
                out.write(item.text)
                out.flush()
            elif isinstance(item, CodeExecutionResult):
                for image in item.images:
                    print(f"[image: {image}]")
                if item.output_file is not None:
                    print(f"[complete output: {item.output_file}]")
    except CodeExecutionError as e:
        print(str(e), file=sys.stderr)
        return EXIT_ERROR
    except TimeoutError as e:
        print(f"ipybox: {e}", file=sys.stderr)
        return EXIT_TIMEOUT
    finally:
        await executor.stop()
    return 0


def _doctor(as_json: bool) -> int:
    import json

    from ipybox.cli.doctor import limits_report
    from ipybox.sandbox.doctor import THREAT_MODEL, run_checks, sandbox_ready

    checks = run_checks()
    ready = sandbox_ready(checks)
    limits = limits_report()  # reported, but the exit status says whether sandbox=True works
    if as_json:
        threats = [{"what": what, "how": how} for what, how in THREAT_MODEL]
        report = {
            "sandbox": ready,
            "checks": [check.as_dict() for check in checks],
            "limits": limits.as_dict(),
            "threat_model": threats,
        }
        print(json.dumps(report, indent=2))
    else:
        print("\n".join(check.line() for check in checks))
        print(f"\nsandbox=True {'works' if ready else 'is not available'} on this machine\n")
        print("\n".join(check.line() for check in limits.checks))
        print("\nWhat a sandboxed kernel can do, and how what the host reads later is protected:")
        for what, how in THREAT_MODEL:
            print(f"  {what.replace('`', '')}: {how.replace('`', '')}")
    return 0 if ready else 1


def _sandbox_config_problem(path: Path | None) -> str | None:
    """What is wrong with the `--sandbox-config` file, if anything, checked before anything starts.

    `SandboxPolicy.from_file` reports a bad file as a plain `ValueError`: caught here, around that one
    call, so that it is shown as the user's mistake while a `ValueError` from anywhere else is a bug.
    """
    from ipybox.sandbox.policy import SandboxPolicy

    if path is None:
        return None
    try:
        SandboxPolicy.from_file(path)
    except ValueError as e:
        return str(e)
    return None


def _mcp(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from ipybox.supervisor.mcp_stdio import serve_stdio

    workspace: Path = args.mcp_workspace or Path(".")
    sandbox: bool = args.mcp_sandbox
    sandbox_config: Path | None = args.mcp_sandbox_config
    if workspace.exists() and not workspace.is_dir():
        parser.error(f"--workspace {workspace}: not a directory")
    if (problem := _sandbox_config_problem(sandbox_config)) is not None:
        return _fail(problem)
    if args.mcp_log_level is not None:
        configure_logging(args.mcp_log_level)
    # ipybox 0.9's options for its TCP endpoints: accepted, and said (on stderr: stdout carries MCP) unused.
    unused = unused_endpoint_options(
        args.mcp_tool_server_host,
        args.mcp_tool_server_port,
        args.mcp_kernel_gateway_host,
        args.mcp_kernel_gateway_port,
    )
    if unused is not None:
        print(unused, file=sys.stderr)
    if not workspace.exists():  # as ipybox 0.9 did
        workspace.mkdir(parents=True)
        print(f"ipybox: created the workspace directory {workspace.resolve()}", file=sys.stderr)
    try:
        signalled = asyncio.run(serve_stdio(workspace.resolve(), sandbox, sandbox_config))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    if signalled is not None:
        # Everything is stopped. A client that signals gives the process little time (Claude Code: SIGKILL
        # 500 ms after SIGINT) and the interpreter's teardown of a large heap took 170 ms more: exit now.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


def _workspace_command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from ipybox.cli import workspace

    directory: Path = args.dir.resolve()
    if not directory.is_dir():
        parser.error(f"{args.dir}: no such directory")
    if args.command == "validate":
        return workspace.validate(directory)
    # These need only the run state: a running workspace's file may be gone.
    only_running = ("status", "down", "approve", "console")
    keeps_running = args.command in only_running and workspace.is_running(directory)
    if not (directory / "ipybox.toml").is_file() and not keeps_running:
        parser.error(f"{args.dir} is not a workspace: it has no ipybox.toml (`ipybox init` writes one)")
    if args.command == "up":
        return workspace.up(directory, detach=args.detach)
    if args.command == "status":
        return workspace.status(directory, as_json=args.json)
    if args.command == "down":
        return workspace.down(directory)
    if args.command in ("approve", "console"):
        from ipybox.cli import approve

        if args.command == "console":
            return approve.console(directory, as_json=args.json)
        return approve.approve(directory)
    return workspace.logs(directory, follow=args.follow)


def _fail(message: str) -> int:
    print(f"ipybox: {message}", file=sys.stderr)
    return EXIT_ERROR


def _report_bug(error: BaseException) -> int:
    # The notice comes first and the traceback last, so that the last line of the output is the
    # exception itself (`ipybox up -d` shows the last line of a failed start).
    print(
        f"ipybox: internal error: this is a bug in ipybox; please report it with the traceback below at "
        f"{REPORT_BUGS}",
        file=sys.stderr,
    )
    traceback.print_exception(error, file=sys.stderr)
    return EXIT_ERROR


def user_errors(error: BaseException) -> list[IpyboxError] | None:
    """The `IpyboxError`s that `error` consists of (itself, or every exception of an exception group, as
    a task group raises them), or `None` when any part of it is something else, i.e. a bug."""
    if isinstance(error, IpyboxError):
        return [error]
    if isinstance(error, BaseExceptionGroup):
        found: list[IpyboxError] = []
        for part in error.exceptions:
            errors = user_errors(part)
            if errors is None:
                return None
            found.extend(errors)
        return found
    return None


def main(argv: list[str] | None = None) -> int:
    """Run the `ipybox` command; its exit status.

    An `IpyboxError` is printed as `ipybox: <message>` (exit `EXIT_ERROR`); any other exception, as a bug
    in ipybox with its traceback (exit `EXIT_ERROR` too).
    """
    try:
        return _main(argv)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as e:
        errors = user_errors(e)
        if errors is None:
            return _report_bug(e)
        for error in errors:
            print(f"ipybox: {error}", file=sys.stderr)
        return EXIT_ERROR


def _main(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(
        prog="ipybox", description="Sandboxed Python code execution with MCP tools."
    )
    parser.add_argument("--version", action="version", version=f"ipybox {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    run = commands.add_parser("exec", help="execute Python code in a fresh kernel and print its output")
    run.add_argument("code", nargs="?", help="the code (default: read from standard input)")
    run.add_argument("--workspace", type=Path, default=Path("."), help="working directory of the kernel")
    run.add_argument("--timeout", type=float, default=120, help="seconds the code may run (default: 120)")
    run.add_argument("--sandbox", action="store_true", help="run the kernel in the sandbox (Linux)")
    run.add_argument(
        "--sandbox-config",
        type=Path,
        help="sandbox policy file (JSON) extending the default (implies --sandbox)",
    )
    run.add_argument(
        "--approve",
        choices=("ask", "all", "none"),
        default=None,
        help="MCP tool calls from the code: ask on the terminal (default when the code is an argument and "
        "standard input is a terminal), approve all, or reject all (default otherwise)",
    )
    init_parser = commands.add_parser(
        "init", help="write a new workspace's ipybox.toml (and .gitignore) in DIR"
    )
    init_parser.add_argument(
        "dir", nargs="?", type=Path, help="the workspace, created if missing (default: .)"
    )
    init_parser.add_argument(
        "--server",
        dest="servers",
        action="append",
        default=[],
        metavar="NAME",
        help="write this example server active, not commented out (repeatable)",
    )
    init_parser.add_argument("--no-sandbox", action="store_true", help="run kernels unsandboxed")
    init_parser.add_argument("--force", action="store_true", help="replace an existing ipybox.toml")
    schema_parser = commands.add_parser(
        "schema", help="print the path of the installed JSON Schema, for editors"
    )
    schema_parser.add_argument(
        "--sandbox-policy", action="store_true", help="the schema of sandbox policy files instead"
    )
    doctor = commands.add_parser("doctor", help="report what this machine supports for sandboxing")
    doctor.add_argument("--json", action="store_true", help="machine-readable output")
    servers.add_commands(commands)
    workspace_commands = {
        "up": "run the workspace in DIR: kernels, tool server, reconciler, endpoints (Ctrl-C stops it)",
        "status": "show what runs in the workspace",
        "down": "stop the workspace",
        "logs": "print the workspace's log",
        "validate": "check the workspace's ipybox.toml",
        "approve": "answer the running workspace's asks in this terminal (y/s/a allow, n/d/D deny, ? help)",
        "console": "print a new one-time login link for the running workspace's web console",
    }
    verbs = {verb: commands.add_parser(verb, help=text) for verb, text in workspace_commands.items()}
    for verb in verbs.values():
        verb.add_argument("dir", nargs="?", type=Path, default=Path("."), help="the workspace (default: .)")
    verbs["up"].add_argument("-d", "--detach", action="store_true", help="run in the background")
    verbs["status"].add_argument("--json", action="store_true", help="machine-readable output")
    verbs["console"].add_argument("--json", action="store_true", help="machine-readable output")
    verbs["logs"].add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    serve = commands.add_parser("mcp", help="serve the workspace to an MCP client over stdio")
    for target in (serve, parser):  # `ipybox --workspace DIR` is ipybox 0.9's form of `ipybox mcp`
        # The subcommand's copies default to SUPPRESS: else their defaults would replace what was given
        # before the subcommand (`ipybox --workspace DIR mcp`).
        default = argparse.SUPPRESS if target is serve else None
        target.add_argument(
            "--workspace", dest="mcp_workspace", type=Path, default=default, help="the workspace (default: .)"
        )
        target.add_argument(
            "--sandbox",
            dest="mcp_sandbox",
            action="store_true",
            default=argparse.SUPPRESS if target is serve else False,
            help="sandbox the kernels",
        )
        target.add_argument(
            "--sandbox-config",
            dest="mcp_sandbox_config",
            type=Path,
            default=default,
            help="sandbox policy file",
        )
        target.add_argument(
            "--log-level",
            dest="mcp_log_level",
            type=str.upper,
            choices=LOG_LEVELS,
            default=default,
            help="log from this level up to stderr",
        )
        # ipybox 0.9's endpoints: accepted for its MCP client configurations, not used (see mcp_compat).
        for option, kind in _UNUSED_ENDPOINT_OPTIONS:
            target.add_argument(
                option,
                dest="mcp_" + option.removeprefix("--").replace("-", "_"),
                type=kind,
                default=default,
                metavar=kind.__name__.upper(),
                help="accepted for ipybox 0.9, not used: ipybox listens on private Unix sockets",
            )
    # `ipybox server add NAME ... -- COMMAND ARGS...`: the command is taken out before argparse sees it.
    argv, server_command = servers.split_command(sys.argv[1:] if argv is None else list(argv))
    args = parser.parse_args(argv)
    compat_given = any(getattr(args, name, None) not in (None, False) for name in _MCP_OPTION_DESTS)
    if args.command == "mcp" or (args.command is None and compat_given):
        return _mcp(parser, args)
    if args.command in workspace_commands:
        return _workspace_command(parser, args)
    if args.command in ("init", "schema"):
        from ipybox.cli import init

        if args.command == "schema":
            return init.schema(sandbox_policy=args.sandbox_policy)
        if unknown := init.unknown_servers(args.servers):
            init_parser.error(init.unknown_servers_message(unknown))
        shown_as = None if args.dir is None else str(args.dir)
        directory = args.dir if args.dir is not None else Path(".")
        return init.init(
            directory, args.servers, sandbox=not args.no_sandbox, force=args.force, shown_as=shown_as
        )
    if args.command == "doctor":
        return _doctor(as_json=args.json)
    if args.command == "server":
        return servers.run(parser, args, server_command)
    if args.command == "exec":
        if not args.workspace.is_dir():
            parser.error(f"--workspace {args.workspace}: no such directory")
        code = args.code if args.code is not None else sys.stdin.read()
        approve = args.approve or ("ask" if args.code is not None and sys.stdin.isatty() else "none")
        if approve == "ask" and (args.code is None or not sys.stdin.isatty()):
            parser.error("--approve ask needs the code as an argument and a terminal on standard input")
        if (problem := _sandbox_config_problem(args.sandbox_config)) is not None:
            return _fail(problem)
        try:
            return asyncio.run(
                _exec(
                    code, args.workspace.resolve(), args.timeout, approve, args.sandbox, args.sandbox_config
                )
            )
        except KeyboardInterrupt:
            return EXIT_INTERRUPTED
    parser.print_help()
    return 0
