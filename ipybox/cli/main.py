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
import contextlib
import logging
import os
import sys
import traceback
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from ipybox import __version__
from ipybox.cli import servers
from ipybox.cli.mcp_compat import LOG_LEVELS, configure_logging, unused_endpoint_options
from ipybox.cli.options import (
    CommandParser,
    add_workspace_option,
    finish,
    usage_error,
    workspace_given,
    workspace_of,
)
from ipybox.display_text import printable
from ipybox.errors import IpyboxError

if TYPE_CHECKING:
    from ipybox.executor.code_executor import CodeExecutor

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
    # Names and arguments come from the kernel and its servers: shown escaped, on one line.
    call = printable(f"{request.server_name}.{request.tool_name}({request.tool_args})")
    if approve == "all":
        return True
    if approve == "ask":
        answer = await arun(input, f"ipybox: run tool call {call}? [y/N] ")
        return answer.strip().lower() in ("y", "yes")
    print(f"ipybox: rejected tool call {call} (pass --approve all or --approve ask)", file=sys.stderr)
    return False


async def _exec(
    code: str,
    timeout: float,
    approve: str,
    *,
    workspace: Path | None,
    working_dir: Path,
    sandbox: bool,
    sandbox_config: Path | None,
) -> int:
    from ipybox.executor.code_executor import CodeExecutor
    from ipybox.executor.options import Answers, WorkspaceOptions

    if workspace is None:
        # A policy file asks for the sandbox: `--sandbox-config F` alone sandboxes (never runs unsandboxed).
        sandbox = sandbox or sandbox_config is not None
        executor = CodeExecutor(
            working_dir=working_dir, spare_kernel=False, sandbox=sandbox, sandbox_config=sandbox_config
        )
        return await _run_code(executor, code, timeout, approve)
    async with _workspace_running(workspace, require_sandbox=sandbox):
        # The same attachment as any application's: the workspace's sandbox, environment, servers and
        # rules. An `ask` is answered here only as --approve says; with `none`, the workspace asks its people
        # (web console, `ipybox approve`) or denies it.
        answers: Answers = "none" if approve == "none" else "application"
        executor = CodeExecutor(options=WorkspaceOptions(workspace, answers=answers))
        return await _run_code(executor, code, timeout, approve)


@contextlib.asynccontextmanager
async def _workspace_running(workspace: Path, *, require_sandbox: bool) -> AsyncIterator[None]:
    """While open, the workspace in `workspace` runs: the `ipybox up` running there, else one started here
    (as `ipybox mcp` does) and stopped on exit. With `require_sandbox` (`--sandbox`), the configuration that
    runs must sandbox kernels (`ConfigError` otherwise, before any kernel runs)."""
    from ipybox.sandbox.container import unsandboxed_note
    from ipybox.supervisor import NotRunningError, Supervisor, read_state
    from ipybox.supervisor.supervisor import check_running_sandboxed

    try:
        state = read_state(workspace)
    except NotRunningError:
        supervisor = Supervisor(workspace, serve_mcp=False, require_sandbox=require_sandbox)
        print(
            f"ipybox: starting the workspace {workspace} for this command (`ipybox up -d` keeps it running)",
            file=sys.stderr,
        )
        if (note := unsandboxed_note(supervisor.config.sandbox.enabled)) is not None:
            print(note, file=sys.stderr)
        await supervisor.start()
        try:
            yield
        finally:
            await supervisor.stop()
        return
    if require_sandbox:
        await check_running_sandboxed(state)
    yield


async def _run_code(executor: CodeExecutor, code: str, timeout: float, approve: str) -> int:
    from ipybox.approval.request import ApprovalRequest
    from ipybox.kernels.result import CodeExecutionChunk, CodeExecutionError, CodeExecutionResult

    await executor.start()  # an IpyboxError (e.g. the sandbox is unavailable) is shown by `main`
    try:
        async for item in executor.stream(code, timeout=timeout, chunks=True):
            if isinstance(item, ApprovalRequest):
                if item.decision is None:  # else the workspace settled it (nobody could be asked)
                    await (item.accept() if await _decide(item, approve) else item.reject())
            elif isinstance(item, CodeExecutionChunk):
                out = sys.stderr if item.stream == "stderr" else sys.stdout
                out.write(_for(out, item.text))
                out.flush()
            elif isinstance(item, CodeExecutionResult):
                for image in item.images:
                    print(printable(f"[image: {image}]"))
                if item.output_file is not None:
                    print(printable(f"[complete output: {item.output_file}]"))
    except CodeExecutionError as e:
        print(printable(str(e), lines=True), file=sys.stderr)  # its message is the kernel's
        return EXIT_ERROR
    except TimeoutError as e:
        print(f"ipybox: {printable(str(e))}", file=sys.stderr)
        return EXIT_TIMEOUT
    finally:
        await executor.stop()
    return 0


def _for(stream: TextIO, text: str) -> str:
    """The kernel's output as written to `stream`: escaped on a terminal (a kernel's escape sequences
    could write the clipboard or retitle and redraw it: `ipybox.display_text`), as it is elsewhere (a file
    or a pipe gets the bytes the code printed)."""
    try:
        terminal = stream.isatty()
    except (AttributeError, ValueError):
        terminal = False
    return printable(text, lines=True) if terminal else text


def _doctor(as_json: bool, directory: Path | None = None) -> int:
    import json

    from ipybox.cli.doctor import executables_report, kernels_report, limits_report
    from ipybox.sandbox.doctor import THREAT_MODEL, run_checks, sandbox_ready

    checks = run_checks()
    ready = sandbox_ready(checks)
    limits = limits_report()  # reported, but the exit status says whether sandbox=True works
    workspace, warnings = executables_report(directory)  # warnings: they don't change the exit status
    remote = kernels_report(directory)
    if as_json:
        threats = [{"what": what, "how": how} for what, how in THREAT_MODEL]
        report = {
            "sandbox": ready,
            "checks": [check.as_dict() for check in checks],
            "limits": limits.as_dict(),
            "threat_model": threats,
            "workspace": str(workspace) if workspace is not None else None,
            "workspace_warnings": warnings,
            "remote_kernels": remote,
        }
        print(json.dumps(report, indent=2))
    else:
        print("\n".join(check.line() for check in checks))
        print(f"\nsandbox=True {'works' if ready else 'is not available'} on this machine\n")
        print("\n".join(check.line() for check in limits.checks))
        print("\nWhat a sandboxed kernel can do, and how what the host reads later is protected:")
        for what, how in THREAT_MODEL:
            print(f"  {what.replace('`', '')}: {how.replace('`', '')}")
        if workspace is not None:
            print(f"\nCode the host runs from {workspace} that kernels could still change:")
            # Paths in the workspace, which kernels may have named: escaped.
            print("\n".join(f"  warning: {printable(line)}" for line in warnings) or "  none found")
        if remote is not None:
            answers = "answers" if remote["answers"] else f"does NOT answer: {remote['problem']}"
            requested = ", ".join(f"{k}={v}" for k, v in remote["requested_limits"].items()) or "none"
            print(
                printable(
                    f"\nKernels run on the gateway at {remote['gateway']} (kernel spec {remote['kernelspec']}): "
                    f"it {answers}.\n  isolation: {remote['isolation']}\n  limits asked of its kernel "
                    f"template: {requested}",
                    lines=True,
                )
            )
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
    from ipybox.supervisor.mcp_stdio import ServeRefusedError, serve_stdio

    workspace: Path = args.mcp_workspace or Path(".")
    sandbox: bool = args.mcp_sandbox
    sandbox_config: Path | None = args.mcp_sandbox_config
    if workspace.exists() and not workspace.is_dir():
        usage_error(args, f"--workspace {workspace}: not a directory", parser)
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
    except ServeRefusedError:  # why was the answer to every request, and is on stderr
        return 1
    if signalled is not None:
        # Everything is stopped. A client that signals gives the process little time (Claude Code: SIGKILL
        # 500 ms after SIGINT) and the interpreter's teardown of a large heap took 170 ms more: exit now.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


def _exec_place(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[Path | None, Path]:
    """Where `ipybox exec` runs the code: the workspace to attach to (`None`: a fresh kernel), and the
    working directory (absolute). A directory with ipybox.toml is a workspace however it is named, so its
    sandbox is never bypassed by a fresh, unsandboxed kernel in it."""
    given = workspace_given(args, parser)
    if given is not None and args.working_dir is not None:
        parser.error("--workspace and --working-dir: give one (a workspace's kernels run in the workspace)")
    if given is not None:
        if not given.is_dir():
            parser.error(f"--workspace {given}: no such directory")
        if not (given / "ipybox.toml").is_file():
            parser.error(
                f"--workspace {given} is not a workspace: it has no ipybox.toml (`ipybox init` writes "
                "one; --working-dir runs a fresh kernel in a plain directory)"
            )
        workspace: Path | None = given.resolve()
    else:
        directory: Path = args.working_dir if args.working_dir is not None else Path(".")
        if not directory.is_dir():
            parser.error(f"--working-dir {directory}: no such directory")
        workspace = directory.resolve() if (directory / "ipybox.toml").is_file() else None
    if workspace is not None and args.sandbox_config is not None:
        parser.error(
            f"--sandbox-config is for a fresh kernel; {workspace} is a workspace, whose sandbox policy is the "
            "[sandbox] table of its ipybox.toml (--sandbox checks that it sandboxes)"
        )
    return workspace, (workspace or (args.working_dir or Path("."))).resolve()


def _workspace_command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from ipybox.cli import workspace

    given = workspace_of(args, parser)
    directory: Path = given.resolve()
    if not directory.is_dir():
        usage_error(args, f"{given}: no such directory", parser)
    if args.command == "validate":
        if args.live or args.json:
            from ipybox.cli.validate_live import validate_live

            if not args.live:
                usage_error(args, "--json is for `ipybox validate --live`", parser)
            return validate_live(directory, as_json=args.json)
        return workspace.validate(directory)
    # These need only the run state: a running workspace's file may be gone.
    only_running = ("status", "down", "approve", "console")
    keeps_running = args.command in only_running and workspace.is_running(directory)
    if args.command == "down" and not keeps_running:
        return workspace.down(directory)  # nothing to stop: said so, whatever the directory holds
    if not (directory / "ipybox.toml").is_file() and not keeps_running:
        usage_error(args, _not_a_workspace(given), parser)
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


def _not_a_workspace(given: Path) -> str:
    where = "" if given == Path(".") else f" -w {given}"
    return f"{given} is not a workspace: it has no ipybox.toml (`ipybox init{where}` writes one)"


def _policy_commands(commands: Any) -> None:
    """`ipybox policy check|replay`, `ipybox lock accept`, `ipybox audit verify`."""
    policy = commands.add_parser(
        "policy", help="check a call against the approval policy, or replay the audit log"
    )
    policy_verbs = policy.add_subparsers(dest="verb", metavar="VERB", required=True)
    check = policy_verbs.add_parser(
        "check", help="the decision on one call ('server.tool {json args}', or 'shell {\"cmd\": ...}')"
    )
    add_workspace_option(check, legacy_positional=True)
    check.add_argument("call", metavar="CALL", help="the call: 'server.tool {json args}'")
    check.add_argument(
        "--annotations", help="the tool's MCP annotations as JSON (default: its pin in ipybox.lock)"
    )
    check.add_argument(
        "--session-read",
        action="append",
        default=[],
        choices=["untrusted", "private", "trusted"],
        metavar="LABEL",
        help="decide as if the calling session had read content with this label (untrusted, private, "
        "trusted; repeatable): `when = { session_read = ... }`",
    )
    check.add_argument(
        "--from",
        dest="origins",
        action="append",
        default=[],
        metavar="ARG=LABEL",
        help="decide as if argument ARG's value came from content with this label (repeatable), e.g. "
        "--from to=untrusted: `when = { argument_from = ... }`, `args = { to = { from = ... } }`",
    )
    replay = policy_verbs.add_parser(
        "replay",
        help="decide every call in the audit log again and show those that change (exit 1 if an allow "
        "becomes a deny or back)",
    )
    add_workspace_option(
        replay, legacy_positional=True, help_text="the workspace whose audit log is replayed (default: .)"
    )
    replay.add_argument(
        "--config", type=Path, help="replay under this ipybox.toml instead of the workspace's"
    )
    replay.add_argument("--since", help="only calls from this ISO 8601 date or time on (UTC unless it says)")
    lock = commands.add_parser("lock", help="the tools pinned in ipybox.lock")
    lock_verbs = lock.add_subparsers(dest="verb", metavar="VERB", required=True)
    accept = lock_verbs.add_parser("accept", help="pin what the servers (or SERVER) serve now in ipybox.lock")
    add_workspace_option(accept, legacy_positional=True)
    accept.add_argument(
        "server", nargs="?", metavar="SERVER", help="only this server (default: every one that differs)"
    )
    audit = commands.add_parser("audit", help="the audit log of approval decisions")
    audit_verbs = audit.add_subparsers(dest="verb", metavar="VERB", required=True)
    verify = audit_verbs.add_parser(
        "verify", help="check the audit log's hash chain; report the first broken link"
    )
    add_workspace_option(verify, legacy_positional=True)
    for verb in (check, replay, accept, verify):
        verb.add_argument("--json", action="store_true", help="machine-readable output")


def _lock_accept_arguments(args: argparse.Namespace) -> None:
    """`ipybox lock accept [SERVER]`: before `-w`, the form was `lock accept DIR [SERVER]`, so a lone
    positional is the workspace when it is a directory and `-w` was not given, else the server."""
    legacy: Path | None = args.legacy_dir
    w_given = args.workspace is not None or args.mcp_workspace is not None
    if legacy is not None and args.server is None and (w_given or not legacy.is_dir()):
        args.server, args.legacy_dir = str(legacy), None


def _policy_command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.command == "lock":
        _lock_accept_arguments(args)
    given = workspace_of(args, parser)
    directory: Path = given.resolve()
    if not (directory / "ipybox.toml").is_file():
        usage_error(args, _not_a_workspace(given), parser)
    if args.command == "policy":
        from ipybox.cli import policy

        if args.verb == "check":
            return policy.check(
                directory,
                args.call,
                annotations=args.annotations,
                as_json=args.json,
                session_read=args.session_read,
                origins=args.origins,
            )
        return policy.replay(directory, other=args.config, since=args.since, as_json=args.json)
    if args.command == "lock":
        from ipybox.cli import lock

        return lock.accept(directory, args.server, as_json=args.json)
    from ipybox.cli import audit

    return audit.verify(directory, as_json=args.json)


def _connect_commands(commands: Any) -> None:
    """`ipybox connect [CLIENT]`, `ipybox token rotate`."""
    from ipybox.cli.client_config import CLIENTS

    connect = commands.add_parser(
        "connect",
        help="print the entry that connects an MCP client to the workspace, or --write it into the "
        "client's configuration file",
        description="Print what CLIENT needs to use the workspace as an MCP server: for claude the `claude mcp "
        "add` command line, for the others the entry in their configuration file's format. Over stdio (the "
        "default) the client starts `ipybox mcp --workspace DIR`; with --http it connects to the running "
        "workspace's HTTP endpoint with its bearer token (kept across restarts; with [endpoints] port pinned "
        "the URL is too). What to type or paste goes to stdout, notes to stderr.",
    )
    connect.add_argument(
        "client",
        nargs="?",
        choices=CLIENTS,
        default="json",
        metavar="CLIENT",
        help="claude (Claude Code), codex, cursor, vscode, desktop (Claude Desktop, stdio only) or json "
        "(the common mcpServers form; default)",
    )
    add_workspace_option(connect)
    transport = connect.add_mutually_exclusive_group()
    transport.add_argument(
        "--stdio", action="store_true", help="the client starts `ipybox mcp --workspace DIR` (default)"
    )
    transport.add_argument(
        "--http",
        action="store_true",
        help="the client connects to the workspace's streamable HTTP endpoint with its bearer token: the "
        "workspace must be running, or pin its port with [endpoints] port in ipybox.toml",
    )
    connect.add_argument(
        "--write",
        action="store_true",
        help="merge the entry into the client's file (claude: ./.mcp.json, cursor: ./.cursor/mcp.json, "
        "vscode: ./.vscode/mcp.json, codex: ~/.codex/config.toml, desktop: claude_desktop_config.json); the "
        "file as it was is kept as <file>.bak, other entries are left as they are",
    )
    connect.add_argument(
        "--force", action="store_true", help="with --write: replace a different ipybox entry in the file"
    )
    token = commands.add_parser("token", help="the bearer token of the workspace's HTTP MCP endpoint")
    token_verbs = token.add_subparsers(dest="verb", metavar="VERB", required=True)
    rotate = token_verbs.add_parser(
        "rotate",
        help="replace the token with a new one (a running workspace refuses the old one at once)",
    )
    add_workspace_option(rotate)


def _connect_command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from ipybox.cli import connect

    directory = workspace_of(args, parser)
    if not directory.is_dir():
        usage_error(args, f"--workspace {directory}: no such directory", parser)
    if args.command == "token":
        if not (directory / "ipybox.toml").is_file():
            usage_error(
                args,
                f"{directory} is not a workspace: it has no ipybox.toml (`ipybox init` writes one)",
                parser,
            )
        return connect.rotate_token(directory.resolve())
    if args.force and not args.write:
        usage_error(
            args, "--force is for --write (it replaces a different ipybox entry in the client's file)", parser
        )
    return connect.connect(
        args.client, directory.resolve(), http=args.http, write=args.write, force=args.force
    )


def _fail(message: str) -> int:
    print(f"ipybox: {printable(message, lines=True)}", file=sys.stderr)
    return EXIT_ERROR


def _report_bug(error: BaseException) -> int:
    # The notice comes first and the traceback last, so that the last line of the output is the
    # exception itself (`ipybox up -d` shows the last line of a failed start).
    print(
        f"ipybox: internal error: this is a bug in ipybox; please report it with the traceback below at "
        f"{REPORT_BUGS}",
        file=sys.stderr,
    )
    # Escaped: the exception's message may quote a server or a kernel.
    print(printable("".join(traceback.format_exception(error)), lines=True), end="", file=sys.stderr)
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
        for error in errors:  # a message may quote a server, a kernel or the control endpoint: escaped
            print(f"ipybox: {printable(str(error), lines=True)}", file=sys.stderr)
        return EXIT_ERROR


def _main(argv: list[str] | None) -> int:
    # Typed as argparse's own, so that sub-command modules take `_SubParsersAction[ArgumentParser]`; each
    # sub-command's parser is a `CommandParser` too (argparse makes them of the top-level parser's class).
    parser: argparse.ArgumentParser = CommandParser(
        prog="ipybox",
        description="Sandboxed Python code execution with MCP tools.",
        epilog="`ipybox COMMAND -h` shows a command's options. Every command that acts on a workspace takes "
        "it as -w DIR (default: the current directory). `ipybox -w DIR` with no command serves the workspace "
        "to an MCP client over stdio, as `ipybox mcp -w DIR` does (ipybox 0.9's form).",
    )
    parser.add_argument("--version", action="version", version=f"ipybox {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    run = commands.add_parser(
        "exec",
        help="execute Python code in a kernel of the workspace (a directory with ipybox.toml), or in a fresh "
        "kernel elsewhere, and print its output",
    )
    run.add_argument("code", nargs="?", metavar="CODE", help="the code (default: read from standard input)")
    add_workspace_option(
        run,
        help_text="the workspace whose kernel runs the code: its sandbox, environment, servers and rules "
        "(default: the current directory, when it has ipybox.toml)",
    )
    run.add_argument(
        "--working-dir",
        type=Path,
        metavar="DIR",
        help="directory of a fresh kernel outside any workspace (default: .); a directory with ipybox.toml is "
        "a workspace, and its kernel runs the code",
    )
    run.add_argument("--timeout", type=float, default=120, help="seconds the code may run (default: 120)")
    run.add_argument(
        "--sandbox",
        action="store_true",
        help="run the kernel in the sandbox (Linux); in a workspace, refuse to run unless it sandboxes",
    )
    run.add_argument(
        "--sandbox-config",
        type=Path,
        metavar="FILE",
        help="sandbox policy file (JSON) extending the default (implies --sandbox; not in a workspace, whose "
        "ipybox.toml has the policy)",
    )
    run.add_argument(
        "--approve",
        choices=("ask", "all", "none"),
        default=None,
        help="MCP tool calls from the code (in a workspace: those its rules ask about): ask on the terminal "
        "(default when the code is an argument and standard input is a terminal), approve all, or none "
        "(default otherwise: rejected; in a workspace, left to its web console and `ipybox approve`)",
    )
    init_parser = commands.add_parser("init", help="write a new workspace's ipybox.toml (and .gitignore)")
    add_workspace_option(
        init_parser, legacy_positional=True, help_text="the workspace, created if missing (default: .)"
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
    add_workspace_option(
        doctor,
        legacy_positional=True,
        help_text="a workspace whose servers' code to check too (default: . when it has an ipybox.toml)",
    )
    servers.add_commands(commands)
    workspace_commands = {
        "up": "run the workspace: kernels, tool server, reconciler, endpoints (Ctrl-C stops it; -d runs it in the "
        "background and exits 1 if a declared server failed to start)",
        "status": "show what runs in the workspace",
        "down": "stop the workspace (exit 0 when it is not running: nothing to stop)",
        "logs": "print the workspace's log",
        "validate": "check the workspace's ipybox.toml",
        "approve": "answer the running workspace's asks in this terminal (y/s/a allow, n/d/D deny, ? help)",
        "console": "print a new one-time login link for the running workspace's web console",
    }
    verbs = {
        verb: commands.add_parser(verb, help=text, description=f"{text[0].upper()}{text[1:]}.")
        for verb, text in workspace_commands.items()
    }
    for verb in verbs.values():
        add_workspace_option(verb, legacy_positional=True)
    verbs["up"].add_argument(
        "-d",
        "--detach",
        action="store_true",
        help="run in the background: return once it is up, with exit status 1 when a declared server failed "
        "to start (the workspace keeps running without it)",
    )
    verbs["status"].add_argument(
        "--json", action="store_true", help="machine-readable output: the control endpoint's status as JSON"
    )
    verbs["validate"].add_argument(
        "--live",
        action="store_true",
        help="also start the servers, list their tools and check the approval rules against them",
    )
    verbs["validate"].add_argument(
        "--json", action="store_true", help="machine-readable output (with --live)"
    )
    _policy_commands(commands)
    _connect_commands(commands)
    verbs["console"].add_argument("--json", action="store_true", help="machine-readable output")
    verbs["logs"].add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    serve = commands.add_parser(
        "mcp",
        help="serve the workspace to an MCP client over stdio",
        description="Serve the workspace to an MCP client over stdio: the command an MCP client's "
        "configuration runs (`ipybox mcp -w DIR`). A missing workspace directory is created.",
    )
    for target in (serve, parser):  # `ipybox --workspace DIR` is ipybox 0.9's form of `ipybox mcp`
        top = target is parser
        # The subcommand's copies default to SUPPRESS: else their defaults would replace what was given
        # before the subcommand (`ipybox --workspace DIR mcp`).
        default = None if top else argparse.SUPPRESS
        target.add_argument(
            "-w",
            "--workspace",
            dest="mcp_workspace",
            type=Path,
            default=default,
            metavar="DIR",
            help="the workspace of the command that follows; with no command, serve it over MCP stdio "
            "(ipybox 0.9's form of `ipybox mcp`)"
            if top
            else "the workspace directory (default: .)",
        )
        # At the top level, these are ipybox 0.9's form of `ipybox mcp`'s options: accepted, not listed.
        target.add_argument(
            "--sandbox",
            dest="mcp_sandbox",
            action="store_true",
            default=False if top else argparse.SUPPRESS,
            help=argparse.SUPPRESS if top else "sandbox the kernels",
        )
        target.add_argument(
            "--sandbox-config",
            dest="mcp_sandbox_config",
            type=Path,
            default=default,
            metavar="FILE",
            help=argparse.SUPPRESS if top else "a sandbox policy file (JSON) extending the default",
        )
        target.add_argument(
            "--log-level",
            dest="mcp_log_level",
            type=str.upper,
            choices=LOG_LEVELS,
            default=default,
            help=argparse.SUPPRESS if top else "log from this level up to stderr",
        )
        # ipybox 0.9's endpoints: accepted for its MCP client configurations, not used and not listed (see
        # mcp_compat, which says so on stderr when one is given).
        for option, kind in _UNUSED_ENDPOINT_OPTIONS:
            target.add_argument(
                option,
                dest="mcp_" + option.removeprefix("--").replace("-", "_"),
                type=kind,
                default=default,
                help=argparse.SUPPRESS,
            )
    finish(parser)
    # `ipybox server add NAME ... -- COMMAND ARGS...`: the command is taken out before argparse sees it.
    argv, server_command = servers.split_command(sys.argv[1:] if argv is None else list(argv))
    args = parser.parse_args(argv)
    compat_given = any(getattr(args, name, None) not in (None, False) for name in _MCP_OPTION_DESTS)
    if args.command == "mcp" or (args.command is None and compat_given):
        return _mcp(parser, args)
    if args.command in workspace_commands:
        return _workspace_command(parser, args)
    if args.command in ("policy", "lock", "audit"):
        return _policy_command(parser, args)
    if args.command in ("connect", "token"):
        return _connect_command(parser, args)
    if args.command in ("init", "schema"):
        from ipybox.cli import init

        if args.command == "schema":
            return init.schema(sandbox_policy=args.sandbox_policy)
        if unknown := init.unknown_servers(args.servers):
            init_parser.error(init.unknown_servers_message(unknown))
        given = workspace_given(args, init_parser)
        shown_as = None if given is None else str(given)
        directory = given if given is not None else Path(".")
        return init.init(
            directory, args.servers, sandbox=not args.no_sandbox, force=args.force, shown_as=shown_as
        )
    if args.command == "doctor":
        return _doctor(as_json=args.json, directory=workspace_given(args, doctor))
    if args.command == "server":
        return servers.run(parser, args, server_command)
    if args.command == "exec":
        workspace, working_dir = _exec_place(run, args)
        code = args.code if args.code is not None else sys.stdin.read()
        approve = args.approve or ("ask" if args.code is not None and sys.stdin.isatty() else "none")
        if approve == "ask" and (args.code is None or not sys.stdin.isatty()):
            run.error("--approve ask needs the code as an argument and a terminal on standard input")
        if (problem := _sandbox_config_problem(args.sandbox_config)) is not None:
            return _fail(problem)
        try:
            return asyncio.run(
                _exec(
                    code,
                    args.timeout,
                    approve,
                    workspace=workspace,
                    working_dir=working_dir,
                    sandbox=args.sandbox,
                    sandbox_config=args.sandbox_config,
                )
            )
        except KeyboardInterrupt:
            return EXIT_INTERRUPTED
    parser.print_help()
    return 0
