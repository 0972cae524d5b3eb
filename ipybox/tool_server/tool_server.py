"""`ToolServer`: runs MCP tools for code in kernels, after approval.

Kernels send their calls to its [CallChannel][ipybox.tool_server.call_channel.CallChannel] (JSON lines, the
fast path). Applications use its HTTP endpoints (every one requires `Authorization: Bearer <token>`, else
401):

- `PUT /reset`: stop all started MCP servers (they start again on their next call): the workspace-wide
  reset, for the application or operator.
- `WS /approval`: where an [ApprovalClient][ipybox.approval.approval_client.ApprovalClient] connects.

Both listen on Unix sockets in a private directory by default (or on loopback TCP ports). Kernels on
other machines (a remote gateway's) reach the call channel on a TCP port with TLS, opened only when
`remote` ([RemoteCalls][ipybox.tool_server.remote_calls.RemoteCalls]) says where and with which
certificate: `remote_address` is what they dial, `remote_certificate_pem` what they pin. Nothing else
listens beyond loopback, and the call channel has no plain-TCP listener beyond it.

A kernel's `{"op": "reset"}` on the call channel resets that caller's session only
([MCPServers.reset_caller][ipybox.mcp_client.pool.MCPServers.reset_caller]): the servers it used that no
other caller uses stop, servers shared with other kernels keep running, and no other kernel's in-flight
call is interrupted. A tool server whose only caller is its own `call_token` (an embedded, single-kernel
`CodeExecutor`, no `add_caller`) stops all started servers, as before: that caller is the only user.
What one caller may hold of the call channel (connections, request size, idle time) is `call_limits`.

Kernels that do not share the host's files (a remote gateway's) import the generated packages from the
tool server: `module_roots` names the directories it serves (`mcptools`, `gentools`, `mcpparse`), and the
call channel's `source` and `generation` ops read them
([ModuleSources][ipybox.tool_server.module_sources.ModuleSources]); without roots, `source` is refused.
Any kernel with a valid call token may read them: local kernels read the same files from disk.

Two kinds of credentials, never interchangeable: the application's `token` opens the HTTP endpoints
only, and never reaches a kernel; call tokens (`call_token`, the one `kernel_env` hands to kernels, and
those `add_caller` issues, one caller each) authenticate tool calls on the call channel only. So code in
a kernel can't reset the servers over HTTP or connect as the approver of its own calls.

A call is decided before its MCP server starts: an unknown server name is refused at once (no approver
is asked, nothing starts; with `servers.package_lookup` set, a name is also looked up in the package root
the calling module names when that root is one of `servers.package_roots`, and a call naming another root
is refused the same way, see [MCPServers.resolve_key][ipybox.mcp_client.pool.MCPServers.resolve_key]), and the approver sees the annotations the tool server already knows: from the
server's last listing in this process, else those `annotations_lookup` has recorded for its parameters
(`CodeExecutor` reads the ones `generate_mcp_sources` recorded in the host's registry), else none (no
hint declared).

Each call is decided by exactly one [Approver][ipybox.approval.approver.Approver], `approver`, asked once;
only an `Approved` outcome runs the call. The others reach the calling code as errors of the kernel's
`ToolRunner`: `Rejected` and `NoOneToAsk` as `ApprovalRejectedError` ("... was rejected: why", "... was
not approved: who is missing"), `TimedOut` as `ApprovalTimeoutError`. An approver that raises is a bug,
reported to the kernel as an internal error, never taken for a decision.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.types import ASGIApp
from starlette.websockets import WebSocket

from ipybox.approval.approver import Approval, ApproveAll, Approved, Approver, NoOneToAsk, Rejected, TimedOut
from ipybox.approval.channel import ApprovalChannel
from ipybox.asgi_server import BearerAuth, EmbeddedServer
from ipybox.in_kernel.call_protocol import (
    OP_GENERATION,
    OP_RESET,
    OP_RUN,
    OP_SHELL,
    OP_SOURCE,
    SERVER_ENV,
    TOKEN_ENV,
    ErrorKind,
    error,
)
from ipybox.mcp_client import (
    CallTimeoutError,
    MCPServerError,
    ResultTooLargeError,
    ServerMemoryLimitError,
    ToolCallError,
)
from ipybox.mcp_client.params import DEFAULT_CALL_TIMEOUT, DEFAULT_MAX_RESULT_SIZE
from ipybox.mcp_client.pool import AnnotationsLookup, MCPServers, UnknownServerError
from ipybox.rules.calls import ToolCall
from ipybox.rules.provenance import ProvenanceTracker
from ipybox.safefs import DEFAULT_MAX_IMAGE_BYTES
from ipybox.tool_server.call_channel import CallChannel, ChannelLimits, run_call, run_package, shell_call
from ipybox.tool_server.module_sources import ModuleRefusedError, ModuleSource, ModuleSources
from ipybox.tool_server.remote_calls import RemoteCalls

logger = logging.getLogger(__name__)


def session_record(session: str) -> str:
    """The provenance record of a session (a lease): distinct from every caller's, which the host names."""
    return f"session {session}"


class ToolServer:
    """Executes MCP tools on behalf of kernels, each call approved first.

    Args:
        host: Loopback host for TCP (`port` given); ignored for a Unix socket.
        port: TCP port to listen on; `None` (default) listens on a Unix socket instead.
        approval_required: Ask the approval channel before each call (else every call is approved).
        approval_timeout: Seconds a call waits for a decision before it fails (`None`: no limit).
        connect_timeout: Seconds an MCP server gets to start.
        call_timeout: Seconds a tool call waits for its server's answer, for servers whose parameters
            set no `call_timeout` (`None`: no limit); then the kernel gets a `call_timeout` error.
        max_result_size: The largest tool answer in bytes, for servers whose parameters set no
            `max_result_size`; a larger one is a `result_too_large` error for the kernel.
        log_to_stderr: Kept for ipybox 0.9 compatibility (ipybox logs through `logging`).
        log_level: Log level of the tool server's logger.
        servers: MCP server parameters by name (more can be added with `servers.register()`), or the
            [MCPServers][ipybox.mcp_client.pool.MCPServers] to run (made by the caller, with what it alone
            sets: `package_lookup`, `package_roots`, `prepare`); then `connect_timeout`, `call_timeout`,
            `max_result_size`, `environ`, `dotenv_path`, `lookup` and `annotations_lookup`, which configure
            the `MCPServers` the tool server makes, must be left out.
        unix_socket: Listen on this socket path (default: `tools.sock` in a private temporary directory);
            kernels' calls go to a second socket next to it, `<name>.calls.sock`.
        media_dir: Where images and binary resources returned by tools are saved.
        max_image_bytes: The largest of them saved; a larger one is not, and the result's text says so.
        environ: Environment for `${VAR}` placeholders in server parameters (default: the host's).
        dotenv_path: `.env` file for placeholders missing from `environ`.
        lookup: Consulted for a server name not in `servers` (e.g. a registry read on demand).
        annotations_lookup: Known tool annotations of a server that has not listed its tools in this
            process, by its name and parameters (e.g. those recorded in a registry): what the approver
            sees for a call decided before the server starts.
        call_limits: What one caller (one kernel's token) may hold of the call channel: open connections,
            request size, idle time (default `ChannelLimits()`: 64 connections, 16 MiB, 5 minutes).
        approval: The interactive approver behind `/approval` (an `ApprovalChannel` made by the caller,
            e.g. with an in-process `handler`); then `approval_required` and `approval_timeout`, which
            configure the channel the tool server makes, must be left out.
        approver: What decides every call (default: `approval` when it requires approval, else
            `ApproveAll()`); a workspace passes its rules.
        shell_approver: What decides the shell commands kernels ask about (default: `approver`).
        module_roots: The generated packages served to kernels without the host's files, by top-level
            package name (`{"mcptools": ws / "mcptools", "gentools": ..., "mcpparse": ...}`); default none.
        remote: Also listen for remote kernels' calls on TCP with TLS, where and with the certificate it
            says (default: no such listener).
        provenance: Where the results delivered to each caller are recorded, and its calls' arguments
            matched (`ipybox.rules.provenance`; default: a tracker of its own with default settings). A
            workspace passes one that outlives a restarted tool server, so a restart clears no taint.
        session_of: The session (an application's or MCP session's lease) a caller's kernel belongs to,
            `None` when none holds it. Provenance is kept per session when there is one, else per caller:
            the agent behind a lease remembers what it read when its kernel is reset or replaced, so a
            fresh kernel under the same lease inherits the taint and the recorded values (a kernel that
            could shed its session's taint by asking for a reset would make taint evadable).

    Everything is given to the constructor: nothing is set on a tool server afterwards.

    Attributes:
        token: The application's token, for the HTTP endpoints (`ApprovalClient(token=...)`, `PUT /reset`)
            only: it is not accepted on the call channel and must never reach a kernel.
        call_token: The call token `kernel_env` gives kernels: it authenticates tool calls on the call
            channel only (caller ""). `add_caller` issues one per caller instead.
        approval: The interactive approver behind `/approval`: an `ApprovalClient` connects to it, or an
            in-process `approval.handler` answers (its `pause` stops the calling execution's clock).
        approver: What decides every call (see Args).
        shell_approver: What decides the shell commands kernels ask about (`ipybox.shell` /
            `ipybox.shell_magic` calls, see `shell_call`); `None`: `approver`.

    Example:
        ```python
        async with ToolServer(servers={"time": {"command": "uvx", "args": ["mcp-server-time"]}}) as server:
            kernel_env = server.kernel_env  # lets ToolRunner in a kernel reach this server (call token)
            approvals = ApprovalClient(on_request, address=server.address, token=server.token)
        ```
    """

    def __init__(
        self,
        host: str = "localhost",
        port: int | None = None,
        approval_required: bool = False,
        approval_timeout: float | None = 60,
        connect_timeout: float = 30,
        log_to_stderr: bool = False,
        log_level: str = "INFO",
        *,
        servers: Mapping[str, Mapping[str, Any]] | MCPServers | None = None,
        unix_socket: Path | None = None,
        media_dir: Path | None = None,
        max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES,
        environ: Mapping[str, str] | None = None,
        dotenv_path: Path | None = None,
        lookup: Callable[[str], Mapping[str, Any] | None] | None = None,
        annotations_lookup: AnnotationsLookup | None = None,
        call_timeout: float | None = DEFAULT_CALL_TIMEOUT,
        max_result_size: int = DEFAULT_MAX_RESULT_SIZE,
        call_limits: ChannelLimits | None = None,
        approval: ApprovalChannel | None = None,
        approver: Approver | None = None,
        shell_approver: Approver | None = None,
        module_roots: Mapping[str, Path] | None = None,
        remote: RemoteCalls | None = None,
        provenance: ProvenanceTracker | None = None,
        session_of: Callable[[str], str | None] = lambda caller: None,
    ) -> None:
        if isinstance(servers, MCPServers):
            _left_out(
                "servers=MCPServers(...)",
                "MCPServers",
                connect_timeout=(connect_timeout, 30),
                call_timeout=(call_timeout, DEFAULT_CALL_TIMEOUT),
                max_result_size=(max_result_size, DEFAULT_MAX_RESULT_SIZE),
                environ=(environ, None),
                dotenv_path=(dotenv_path, None),
                lookup=(lookup, None),
                annotations_lookup=(annotations_lookup, None),
            )
        if approval is not None:
            _left_out(
                "approval=ApprovalChannel(...)",
                "ApprovalChannel",
                approval_required=(approval_required, False),
                approval_timeout=(approval_timeout, 60),
            )
        if remote is not None and not isinstance(remote, RemoteCalls):
            raise TypeError(f"remote must be a RemoteCalls, not {type(remote).__name__}")
        if host == "localhost":
            host = "127.0.0.1"
        if port is not None and host not in ("127.0.0.1", "::1"):
            raise ValueError(f"ToolServer binds to loopback only (127.0.0.1 or ::1), not {host!r}")
        self.host = host
        self.port = port
        self.unix_socket = unix_socket
        self.token = secrets.token_urlsafe(32)
        self.call_token = secrets.token_urlsafe(32)
        self.media_dir = media_dir or Path("images")
        self.max_image_bytes = max_image_bytes
        self.approval = approval or ApprovalChannel(approval_required, approval_timeout)
        self.servers = (
            servers
            if isinstance(servers, MCPServers)
            else MCPServers(
                servers,
                connect_timeout=connect_timeout,
                call_timeout=call_timeout,
                max_result_size=max_result_size,
                environ=environ,
                dotenv_path=dotenv_path,
                lookup=lookup,
                annotations_lookup=annotations_lookup,
            )
        )
        self.log_level = log_level.upper()
        # The one approver every call goes to: the channel, everything approved, or one given in its place
        # (a workspace's `WorkspaceApprover`), which leaves the channel's websocket unused.
        if approver is None:
            approver = self.approval if self.approval.approval_required else ApproveAll()
        self.approver: Approver = approver
        self.shell_approver: Approver | None = shell_approver
        self._callers: dict[str, str] = {}
        # The cell text each caller sent last (code SHA-256, first line, text): a kernel sends a cell's
        # text with its first call only, and its later calls are given it here (see `_with_cell_text`).
        self._cell_texts: dict[str, tuple[str, int, str]] = {}
        self._private_dir: Path | None = None
        self.remote = remote
        self.provenance = provenance if provenance is not None else ProvenanceTracker()
        self.session_of = session_of
        self.module_sources = ModuleSources(module_roots or {})
        self.calls = CallChannel(
            self._caller_of,
            {
                OP_RUN: self._run,
                OP_RESET: self._reset_op,
                OP_SHELL: self._shell,
                OP_SOURCE: self._source,
                OP_GENERATION: self._generation,
            },
            call_limits,
        )
        self._http = EmbeddedServer(self.app(), "ipybox-tool-server", debug=self.log_level == "DEBUG")

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    @property
    def address(self) -> str:
        """`unix:/path/to.sock` or `http://127.0.0.1:PORT`, as `ToolRunner` and `ApprovalClient` take it."""
        if self.port is not None:
            return f"http://{self.host}:{self.port}"
        if self.unix_socket is None:
            raise RuntimeError("the tool server is not running")
        return f"unix:{self.unix_socket}"

    @property
    def calls_address(self) -> str:
        """Where kernels send tool calls: `unix:/path/to.calls.sock` or `tcp://127.0.0.1:PORT`."""
        if self.calls.address is None:
            raise RuntimeError("the tool server is not running")
        return self.calls.address

    @property
    def remote_address(self) -> str:
        """Where remote kernels send tool calls: `tls://ADVERTISED_HOST:PORT`.

        Raises:
            RuntimeError: No `remote` was given, or the server is not running.
        """
        if self.remote is None:
            raise RuntimeError(
                "this tool server listens for remote kernels only with remote=RemoteCalls(...)"
            )
        if self.calls.tls_address is None:
            raise RuntimeError("the tool server is not running")
        return self.calls.tls_address

    @property
    def remote_certificate_pem(self) -> str:
        """The certificate remote kernels pin (PEM, for their `IPYBOX_TOOL_CERT`).

        Raises:
            RuntimeError: No `remote` was given.
        """
        if self.remote is None:
            raise RuntimeError(
                "this tool server listens for remote kernels only with remote=RemoteCalls(...)"
            )
        return self.remote.certificate.cert_pem

    @property
    def kernel_env(self) -> dict[str, str]:
        """Environment variables that point a kernel's `ToolRunner` at this server, with `call_token`
        (which works on the call channel only, never on the HTTP endpoints)."""
        return {SERVER_ENV: self.calls_address, TOKEN_ENV: self.call_token}

    def app(self) -> ASGIApp:
        """The ASGI application, authenticated with the application's `token` (call tokens are refused)."""
        routes = [
            Route("/reset", self._reset, methods=["PUT"]),
            WebSocketRoute("/approval", self._approval),
        ]
        return BearerAuth(Starlette(routes=routes), self.token)

    async def start(self) -> None:
        """Start listening.

        Raises:
            RuntimeError: The server is already running.
            ListenError: The remote kernels' TLS listener cannot listen where `remote` says (nothing else
                stays open then).
            CertificateError: Its certificate's files can no longer be loaded.
        """
        if self._http.running:
            raise RuntimeError("the tool server is already running")
        if self.port is None and self.unix_socket is None:
            self._private_dir = Path(tempfile.mkdtemp(prefix="ipybox-tools-"))
            self.unix_socket = self._private_dir / "tools.sock"
        if self.port is None:
            assert self.unix_socket is not None
            await self._http.start(unix_socket=self.unix_socket)
            await self.calls.start(unix_socket=self.unix_socket.with_suffix(".calls.sock"))
        else:
            await self._http.start(host=self.host, port=self.port)
            self.port = self._http.port
            await self.calls.start(host=self.host)
        if self.remote is not None:
            try:
                await self.calls.listen_tls(
                    self.remote.bind_host,
                    self.remote.bind_port,
                    self.remote.certificate,
                    advertise_host=self.remote.advertise_host,
                    advertise_port=self.remote.advertise_port,
                )
            except BaseException:
                await self.stop()
                raise

    async def join(self) -> None:
        """Wait for the server to stop."""
        await self._http.join()

    async def reset(self) -> None:
        """Stop all started MCP servers, whoever uses them (the workspace-wide reset); they start again on
        their next call."""
        await self.servers.stop()

    async def reset_caller(self, caller: str) -> list[str]:
        """A kernel's reset: stop the servers `caller` used that no other caller uses (see the module's
        description; with no `add_caller` callers, the one caller "" uses all: they all stop). Returns the
        names of the servers stopped."""
        if caller == "" and not self._callers:
            stopped = [name for name in self.servers.names if self.servers.started(name) is not None]
            await self.reset()
        else:
            stopped = await self.servers.reset_caller(caller)
        logger.info("reset of caller %r: stopped MCP servers %s", caller, stopped or "none")
        return stopped

    async def stop(self) -> None:
        """Stop listening and stop all MCP servers."""
        await self.approval.disconnect()
        await self.calls.stop()
        await self._http.stop()
        await self.servers.stop()
        if self._private_dir is not None:
            shutil.rmtree(self._private_dir, ignore_errors=True)
            self._private_dir = None
            self.unix_socket = None

    def add_caller(self, caller: str) -> str:
        """Issue a token of its own to a caller (e.g. one kernel): its calls reach the approver with
        `caller` set, so decisions can be routed to whoever answers for that kernel.

        The token authenticates tool calls on the call channel only, each call as `caller`.

        Returns:
            The token, for the caller's `IPYBOX_TOOL_TOKEN`.
        """
        token = secrets.token_urlsafe(32)
        self._callers[token] = caller
        return token

    def remove_caller(self, token: str) -> None:
        """Revoke a token issued by `add_caller`; the results recorded for its caller are dropped (its
        session's taint is kept)."""
        caller = self._callers.pop(token, None)
        if caller is not None:
            self._cell_texts.pop(caller, None)
        if caller is not None and caller not in self._callers.values():
            self.provenance.retire(caller)

    def _with_cell_text(self, call: ToolCall) -> ToolCall:
        """`call` with the text of its cell: as it came, which is kept for the caller's later calls of the
        same cell (its `code`), or as the caller sent it with an earlier call of that cell. One text per
        caller, at most `MAX_CELL_TEXT` characters: it is only shown to people asked about a call."""
        if call.code is None:
            return call
        if call.cell_text is not None:
            self._cell_texts[call.caller] = (call.code, call.cell_text_from, call.cell_text)
            return call
        kept = self._cell_texts.get(call.caller)
        if kept is None or kept[0] != call.code:
            return call
        return replace(call, cell_text=kept[2], cell_text_from=kept[1])

    def _caller_of(self, token: str) -> str | None:
        # Call tokens only: the application's `token` is not one (it never reaches a kernel).
        if secrets.compare_digest(token.encode(), self.call_token.encode()):
            return ""
        return self._callers.get(token)

    async def _run(self, request: dict[str, Any]) -> dict[str, Any]:
        try:
            call = run_call(request)
            package = run_package(request)
        except ValueError as e:
            return error(ErrorKind.BAD_REQUEST, str(e))
        name = f"{call.server}.{call.tool}"
        # Decided before anything starts: an unknown name is refused without asking anyone, and the
        # decision uses the annotations known without starting the server (a listing, or recorded ones).
        # The package root the calling module sits in selects among the servers generated there (only
        # with `servers.package_lookup` set, as `CodeExecutor` does; a workspace's come from ipybox.toml).
        try:
            key = self.servers.resolve_key(call.server, package)
        except UnknownServerError as e:
            return error(ErrorKind.UNKNOWN_SERVER, str(e))
        # Provenance is the host's record (`ipybox.rules.provenance`): whatever the request said, it is
        # replaced here, after the caller was authenticated, before anyone decides.
        call = replace(
            call,
            annotations=self.servers.known_annotations(key, call.tool),
            provenance=self.provenance.match(self.provenance_key(call.caller), call.args),
            session_read=self.provenance.session_read(self.provenance_key(call.caller)),
        )
        call = self._with_cell_text(call)
        listed = self.servers.listing(key)  # a restart before the call re-checks the tool's pin
        refused = _refusal(await self.approver.decide(call), name)
        return refused if refused is not None else await self._execute(call, key, listed)

    async def _shell(self, request: dict[str, Any]) -> dict[str, Any]:
        """May a shell command run in the calling kernel? Only asked, never run here."""
        try:
            call = shell_call(request)
        except ValueError as e:
            return error(ErrorKind.BAD_REQUEST, str(e))
        approver = self.shell_approver or self.approver
        refused = _refusal(await approver.decide(call), f"shell command {call.args['cmd']!r}")
        return refused if refused is not None else {"approved": True}

    async def _execute(self, call: ToolCall, key: str, listed: int | None = None) -> dict[str, Any]:
        """Run an approved call on the server `key` (`servers.resolve_key`): `{"result": value}`, or an
        error the kernel's `ToolRunner` raises: `tool_error`, `call_timeout` (no answer within the server's
        `call_timeout`), `result_too_large` (over its `max_result_size`), `server_memory_limit` (the server
        went over the memory of its `limits` and was stopped; it starts again on the next call),
        `server_error`, `unknown_server`. A timed-out or too-large call fails alone: the server keeps
        serving every other call."""
        # Here, not at the top: it loads the MCP SDK's types, which the server's start has loaded by now and
        # which an executor that calls no tool never needs (`from ipybox import CodeExecutor` stays fast).
        from ipybox.mcp_client.results import tool_result_value

        server_name, tool_name = call.server, call.tool
        try:
            result = await self.servers.call(
                key, tool_name, dict(call.args), caller=call.caller, listed=listed
            )  # starts it
            tool = self.servers.known_tool(key, tool_name)
            value = tool_result_value(
                result,
                server_name=server_name,
                tool_name=tool_name,
                has_output_schema=bool(tool and tool.output_schema),
                media_dir=self.media_dir,
                max_file_bytes=self.max_image_bytes,
            )
        except ToolCallError as e:  # its message is the tool's text, delivered as a result is
            self._record(call, key, str(e))
            return error(ErrorKind.TOOL_ERROR, str(e))
        except CallTimeoutError as e:  # cancelled on the server, which keeps serving other calls
            return error(ErrorKind.CALL_TIMEOUT, str(e))
        except ResultTooLargeError as e:  # dropped unread (stdio), the server keeps serving other calls
            return error(ErrorKind.RESULT_TOO_LARGE, str(e))
        except ServerMemoryLimitError as e:  # killed for its memory; the other servers never noticed
            return error(ErrorKind.SERVER_MEMORY_LIMIT, str(e))
        except MCPServerError as e:
            return error(ErrorKind.SERVER_ERROR, str(e))
        except UnknownServerError as e:  # unregistered while the call waited for its decision
            return error(ErrorKind.UNKNOWN_SERVER, str(e))
        self._record(call, key, value)
        return {"result": value}

    def _record(self, call: ToolCall, key: str, value: Any) -> None:
        """Record what goes back to the caller, labelled by the annotations its server lists now.

        Recorded just after the answer is written, not before: indexing a result (about 0.2 ms for a few
        hundred characters) would add to every call's latency. It still comes before anything the caller
        can do with the result: the callback is queued before the answer goes out, and the loop runs it
        before it reads the caller's next request. Should indexing fail, the session is still tainted
        with the result's label (recorded without its values): taint fails closed."""
        annotations = self.servers.known_annotations(key, call.tool)
        session = self.provenance_key(call.caller)

        def record() -> None:
            try:
                self.provenance.record(session, call.server, call.tool, value, annotations)
            except Exception:
                logger.exception(
                    "indexing a result of %s.%s failed: recorded without its values", call.server, call.tool
                )
                self.provenance.record(session, call.server, call.tool, None, annotations)

        asyncio.get_running_loop().call_soon(record)

    def provenance_key(self, caller: str) -> str:
        """Whose record a caller's results go into and its arguments are matched against: its session's
        (`session_of`), else its own."""
        session = self.session_of(caller) if caller else None
        return session_record(session) if session else caller

    async def _source(self, request: dict[str, Any]) -> dict[str, Any]:
        """A generated module's source, for a kernel's import hook; with the generation as of the read."""
        sources, module, staged = self.module_sources, request.get("module"), request.get("staged")

        def read() -> tuple[str, ModuleSource | None]:
            # The generation first: never newer than the code read after it (at worst the kernel reloads
            # once more, never keeps a stale module).
            return sources.generation(), sources.source(module, staged)

        try:
            # Off the event loop: a slow disk must not hold every other kernel's calls.
            generation, found = await asyncio.to_thread(read)
        except ModuleRefusedError as e:
            return error(ErrorKind.MODULE_REFUSED, str(e))
        if found is None:
            return {"source": None, "generation": generation}
        source = {"code": found.code, "package": found.package, "origin": found.origin}
        return {"source": source, "generation": generation}

    async def _generation(self, request: dict[str, Any]) -> dict[str, Any]:
        return {"generation": await asyncio.to_thread(self.module_sources.generation)}

    async def _reset_op(self, request: dict[str, Any]) -> dict[str, Any]:
        await self.reset_caller(request["caller"])
        return {"reset": True}

    async def _reset(self, request: Request) -> Response:
        await self.reset()
        return JSONResponse({"reset": True})

    async def _approval(self, websocket: WebSocket) -> None:
        await self.approval.connect(websocket)


def _left_out(given: str, owner: str, **settings: tuple[object, object]) -> None:
    """Refuse settings of a part the caller made itself (`given`), passed to the tool server as well."""
    for name, (value, default) in settings.items():
        if value != default:
            raise ValueError(
                f"{name}= configures the {owner} a ToolServer makes; with {given}, pass it to {owner} "
                f"and drop {name}= here"
            )


def _refusal(outcome: Approval, name: str) -> dict[str, Any] | None:
    """The error answer for an outcome that is not `Approved` (`None` for `Approved`)."""
    match outcome:
        case Approved():
            return None
        case Rejected(reason, rule_id, tier, explanation):
            answer = error(
                ErrorKind.APPROVAL_REJECTED, f"{name} was rejected" + (f": {reason}" if reason else "")
            )
            # The deciding rule, for the kernel's `ApprovalRejectedError` (an agent reads why, and what is
            # allowed instead).
            answer["error"].update(
                {k: v for k, v in (("rule", rule_id), ("tier", tier), ("why", explanation)) if v is not None}
            )
            return answer
        case TimedOut(timeout):
            return error(ErrorKind.APPROVAL_TIMEOUT, f"no decision on {name} within {timeout:g} s")
        case NoOneToAsk(reason):
            return error(ErrorKind.APPROVAL_REJECTED, f"{name} was not approved: {reason}")
