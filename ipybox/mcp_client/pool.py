"""`MCPServers`: the MCP servers behind a tool server, by name.

A server starts on its first call, is shared by concurrent calls, is started again on the next call
after it crashed, and stops on `stop()`. Names are the only thing callers choose: parameters are set on
the host side, so a kernel cannot make the tool server start a command or reach a URL of its choosing.
Whether a name is known (`resolve`) and what its tools declare (`known_annotations`: from the server's
last listing in this process, else from annotations recorded on the host for its parameters) can be
asked without starting anything, so a call can be approved before its server starts.

A name is resolved in this order: the servers given (`servers`, `register`), then, for a call that says
which package root its generated module sits in, the server generated as that name into that root
(`package_lookup`, e.g. [ServerRegistry.package_server][ipybox.mcp_client.registry.ServerRegistry.package_server]),
then `lookup` (e.g. the registry under `mcptools_dir`). The root is a kernel's word, so it only selects
among the pool's own `package_roots`, which the host decides (`CodeExecutor`: its `mcptools_dir` and
`package_roots`): a call naming any other root is refused (`ForeignPackageRootError`) before anything is
looked up, asked or started, so a kernel can't get another project's server started (with that project's
secrets) by naming that project's directory. Within its own roots, a root without a server of that name
falls through to `lookup`, and an unknown name is refused without starting anything. The same name generated into two roots with different parameters is two servers: a root's
server whose parameters differ from those `lookup` has for the name is a separate entry, keyed
`"<name> (<root>)"`, with its own process, listing and users; with equal parameters it is the name's
entry. So a call never reaches a server other than the one its package was generated from, and code
generated into `mcptools_dir` (or by earlier versions, which send no root) shares one server per name.
The root is a kernel's word: keys found for it are cached per root and name as sent (at most
`MAX_PACKAGE_KEYS`, then the cache starts again), so a call costs one dict lookup after the first.

Servers are shared by callers (the kernels of a workspace, by the identity their call token stands for).
`reset_caller` is a kernel's reset: it stops the started servers that caller has used and no other caller
has used since they started or is calling now (a caller's reset takes it off the others), so one kernel's
reset never ends another kernel's in-flight call or the server state it relies on; shared servers keep
running. `stop()` is the workspace-wide reset, an operator's or the embedding application's action (and
a single-kernel tool server's reset, whose one caller uses every server).

A server that ended by itself (it crashed, or went over its memory limit: `ServerMemoryLimitError`) fails
the call that found it gone with that error, is dropped, and starts again on the next call; until then
`stopped(name)` says why it is not running, for a workspace's status.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ipybox.errors import IpyboxError
from ipybox.mcp_client.errors import MCPServerError, ServerConnectError, ToolChangedError
from ipybox.mcp_client.params import (
    DEFAULT_CALL_TIMEOUT,
    DEFAULT_MAX_RESULT_SIZE,
    ServerParams,
    parse_server_params,
)
from ipybox.mcp_client.placeholders import placeholder_names
from ipybox.mcp_client.registry import RegisteredServer

if TYPE_CHECKING:
    # The MCP SDK loads on the first server start (in `connection()`), not with this module: every executor
    # holds an `MCPServers`, most start no server.
    import mcp_types as types

    from ipybox.mcp_client.connection import MCPConnection

logger = logging.getLogger(__name__)


class UnknownServerError(IpyboxError, LookupError):
    """No MCP server is registered under the requested name."""


class ForeignPackageRootError(UnknownServerError):
    """A call named a package root that is not one of the pool's `package_roots`: nothing is looked up or
    started for it."""


AnnotationsLookup = Callable[[str, Mapping[str, Any]], Mapping[str, Mapping[str, Any]] | None]
"""`(server_name, server_params) -> {tool_name: annotations}`, or `None` when none are known for those
parameters; e.g. `ServerRegistry.recorded_annotations` for a package root (as `CodeExecutor` uses it)."""


ServerPrepare = Callable[[str, ServerParams, bool], Awaitable[ServerParams]]
"""`(server_name, params, secrets) -> params`: called with a server's parameters, placeholders filled in
(`secrets`: whether it had any), before it starts; returns the parameters to start it with, or raises an
`MCPServerError` to refuse it (e.g. `ipybox.config.executables.ServerCodeGuard`)."""


PackageLookup = Callable[[str, str], RegisteredServer | None]
"""`(package_root, server_name) -> RegisteredServer`: the server generated as `server_name` into the package
root a call came from (the path as the kernel sent it), or `None`; e.g. `ServerRegistry.package_server`."""

MAX_PACKAGE_KEYS = 1024
"""Entries of the cache of (root as sent, name) -> server (a root is at most 4096 characters: 4 MiB at
most); a kernel sending ever new roots empties it."""


def annotations_of(tool: types.Tool | None) -> dict[str, Any]:
    """A tool's MCP annotations as a dict (`{"readOnlyHint": True, ...}`), `{}` when it declares none."""
    if tool is None or tool.annotations is None:
        return {}
    return tool.annotations.model_dump(by_alias=True, exclude_none=True)


class MCPServers:
    """Named MCP servers, started lazily.

    Args:
        servers: Server parameters by name (`{"command", "args", "env"}` or `{"url", "headers", "type"}`),
            with `${VAR}` placeholders resolved here, on the host, from `environ` and `dotenv_path`.
        connect_timeout: Seconds a server gets to start and complete the MCP handshake.
        call_timeout: Seconds a tool call waits for its answer, for servers whose parameters set no
            `call_timeout` (`None`: no limit).
        max_result_size: The largest tool answer in bytes, for servers whose parameters set no
            `max_result_size`.
        environ: Environment for placeholders (default: the host's).
        dotenv_path: A `.env` file for placeholders missing from `environ`.
        lookup: Consulted for a name not in `servers`, to find servers registered on the host later.
        package_lookup: Consulted for a name not in `servers` when the call names its package root (see
            the module); `None`: roots are ignored.
        package_roots: The package roots a call may name (with `package_lookup`); a call naming another
            is refused. Default: none, every root is refused.
        annotations_lookup: Consulted for the annotations of a server's tools while it has not listed
            them in this process, with its name and parameters (see `known_annotations`).
        prepare: Called before a server starts (see `ServerPrepare`); `None`: servers start as registered.

    Attributes:
        on_listed: Called with a server's name, its `serverInfo.version` and its tools each time it starts
            and lists them (a workspace pins them in `ipybox.lock`); `None`: nothing is.
        tool_gate: Why a tool must not be called now although its call was approved, asked only when the
            server restarted (listed its tools again) between the approval and the call (`call(listed=)`):
            a tool that changed since its pin is refused, not run on an approval given to the old one.
    """

    def __init__(
        self,
        servers: Mapping[str, Mapping[str, Any]] | None = None,
        *,
        connect_timeout: float = 30,
        call_timeout: float | None = DEFAULT_CALL_TIMEOUT,
        max_result_size: int = DEFAULT_MAX_RESULT_SIZE,
        environ: Mapping[str, str] | None = None,
        dotenv_path: Path | None = None,
        lookup: Callable[[str], Mapping[str, Any] | None] | None = None,
        annotations_lookup: AnnotationsLookup | None = None,
        package_lookup: PackageLookup | None = None,
        package_roots: Iterable[str | Path] = (),
        prepare: ServerPrepare | None = None,
    ) -> None:
        self.prepare = prepare
        self.connect_timeout = connect_timeout
        self.call_timeout = call_timeout
        self.max_result_size = max_result_size
        self.lookup = lookup
        self.annotations_lookup = annotations_lookup
        self.package_lookup = package_lookup
        self.environ = environ
        self.dotenv_path = dotenv_path
        self.on_listed: Callable[[str, str | None, list[types.Tool]], None] | None = None
        self.tool_gate: Callable[[str, str], str | None] | None = None
        self._listings: Counter[str] = Counter()  # how often each server listed its tools, for `tool_gate`
        self._params: dict[str, Mapping[str, Any]] = dict(servers or {})
        # The names given (`servers`, `register`): they come before any package root.
        self._given: set[str] = set(self._params)
        # Package roots' own servers, by key: the annotations recorded with their parameters.
        self._package_entries: dict[str, Mapping[str, Mapping[str, Any]]] = {}
        self._package_keys: dict[tuple[str, str], str] = {}
        self.package_roots = package_roots
        self._connections: dict[str, MCPConnection] = {}
        self._tools: dict[str, dict[str, types.Tool]] = {}
        # The last listing of each server, kept after it stops (until its parameters change).
        self._listed: dict[str, dict[str, types.Tool]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        # Who used each started server since it started, and whose calls are in flight, by server name:
        # what `reset_caller` may stop. Calls count from before their server starts (a reset must not
        # stop a server another caller's call is about to use) until they return.
        self._users: dict[str, set[str]] = {}
        self._in_flight: dict[str, Counter[str]] = {}
        # Why a server that ended by itself is not running (until it starts again or is stopped).
        self._stopped: dict[str, str] = {}

    @property
    def package_roots(self) -> frozenset[str]:
        """The package roots a call may name, resolved (see the module)."""
        return self._package_roots

    @package_roots.setter
    def package_roots(self, roots: Iterable[str | Path]) -> None:
        self._package_roots = frozenset(str(Path(root).resolve()) for root in roots)
        self._package_keys.clear()

    @property
    def names(self) -> list[str]:
        """The keys of all servers known so far: names, and `"<name> (<root>)"` for package roots' own."""
        return sorted(self._params)

    def register(self, server_name: str, server_params: Mapping[str, Any]) -> None:
        """Add or replace a server. A replaced server that is running keeps running until `stop(name)`."""
        if self._params.get(server_name) != server_params:
            self._listed.pop(server_name, None)  # another server may stand behind the name now
        self._params[server_name] = dict(server_params)
        self._given.add(server_name)
        self._package_keys.clear()  # a given name now comes before the roots

    async def unregister(self, server_name: str) -> None:
        """Remove a server and stop it if it runs."""
        self._params.pop(server_name, None)
        self._listed.pop(server_name, None)
        self._given.discard(server_name)
        self._package_keys.clear()
        await self.stop(server_name)

    def started(self, server_name: str) -> MCPConnection | None:
        """The running connection of a server, if it was started."""
        return self._connections.get(server_name)

    async def connection(self, server_name: str) -> MCPConnection:
        """The running connection to a server, starting it if needed.

        Raises:
            UnknownServerError: No server has that name.
            MCPServerError: It could not be started.
        """
        connection = self._connections.get(server_name)
        if connection is not None and connection.running:
            return connection
        self.resolve(server_name)
        async with self._locks.setdefault(server_name, asyncio.Lock()):
            connection = self._connections.get(server_name)
            if connection is not None and connection.running:
                return connection
            if connection is not None:
                logger.warning("MCP server %r stopped unexpectedly: starting it again", server_name)
                await self._close(server_name)
            given = self._params[server_name]
            params: ServerParams = parse_server_params(
                server_name, given, environ=self.environ, dotenv_path=self.dotenv_path
            )
            if self.prepare is not None:
                secrets = bool(placeholder_names(dict(given)))
                params = await self.prepare(server_name, params, secrets)
            from ipybox.mcp_client.connection import MCPConnection

            connection = MCPConnection(
                server_name,
                params,
                connect_timeout=self.connect_timeout,
                call_timeout=self.call_timeout,
                max_result_size=self.max_result_size,
            )
            await connection.start()
            try:
                tools = await connection.list_tools()
            except BaseException:
                await connection.stop()
                raise
            self._connections[server_name] = connection
            self._tools[server_name] = self._listed[server_name] = {tool.name: tool for tool in tools}
            self._listings[server_name] += 1
            if self.on_listed is not None:
                self.on_listed(server_name, connection.server_version, tools)
            self._stopped.pop(server_name, None)
            return connection

    def resolve_key(self, server_name: str, package_root: str | None = None) -> str:
        """The key of the server a call of `server_name` from a module in `package_root` reaches (see the
        module for the order), without starting anything: `server_name`, or `"<name> (<root>)"` for a
        root's server whose parameters differ from the name's own.

        Raises:
            UnknownServerError: No server has that name, for that root or otherwise.
        """
        if package_root is None or self.package_lookup is None or server_name in self._given:
            self.resolve(server_name)
            return server_name
        key = self._package_keys.get((package_root, server_name))
        if key is None or key not in self._params:  # unregistered meanwhile: looked up again
            key = self._package_key(server_name, package_root)
            if len(self._package_keys) >= MAX_PACKAGE_KEYS:
                self._package_keys.clear()
            self._package_keys[package_root, server_name] = key
        return key

    def _package_key(self, server_name: str, package_root: str) -> str:
        assert self.package_lookup is not None
        # Resolved once, here: the lookup gets the root that was checked, not the kernel's path again (a
        # symlink it swaps in between would otherwise point the lookup elsewhere).
        try:
            root = str(Path(package_root).resolve())
        except (OSError, RuntimeError, ValueError):  # a symlink loop, a NUL byte
            root = ""
        if root not in self._package_roots:
            roots = ", ".join(sorted(self._package_roots)) or "none"
            raise ForeignPackageRootError(
                f"MCP server {server_name!r} was called from a tool package in {package_root}, which is not "
                f"one of this executor's package roots ({roots}): nothing was started. To run the servers "
                "generated into that directory, pass it in CodeExecutor(package_roots=[...])"
            )
        found = self.package_lookup(root, server_name)
        if found is None:
            try:
                self.resolve(server_name)
            except UnknownServerError:
                raise UnknownServerError(
                    f"no MCP server named {server_name!r} was generated into {package_root} or is registered "
                    f"with this ipybox (registered: {self._known()})"
                ) from None
            return server_name
        own = self._params.get(server_name)
        if own is None and self.lookup is not None:
            own = self.lookup(server_name)  # loaded now, so that a root with the same server shares it
            if own is not None:
                self._params[server_name] = dict(own)
        if own is not None and dict(own) == found.params:
            return server_name
        key = f"{server_name} ({found.root})"
        if self._params.get(key) != found.params:
            self._listed.pop(key, None)  # regenerated with other parameters
        self._params[key] = found.params
        self._package_entries[key] = found.annotations or {}
        return key

    def _known(self) -> str:
        return ", ".join(name for name in self.names if name not in self._package_entries) or "none"

    def resolve(self, server_name: str) -> Mapping[str, Any]:
        """The parameters of a server (from `servers`, else `lookup`), without starting anything.

        Raises:
            UnknownServerError: No server has that name.
        """
        if server_name not in self._params and self.lookup is not None:
            found = self.lookup(server_name)
            if found is not None:
                self._params[server_name] = dict(found)
        if server_name not in self._params:
            raise UnknownServerError(
                f"no MCP server named {server_name!r} is registered with this ipybox "
                f"(registered: {self._known()})"
            )
        return self._params[server_name]

    def known_tool(self, server_name: str, tool_name: str) -> types.Tool | None:
        """A tool's definition as the server listed it when it last started in this process (it need not
        run now), without starting it; `None` when it has not been listed (or lists no such tool)."""
        return self._listed.get(server_name, {}).get(tool_name)

    def known_annotations(self, server_name: str, tool_name: str) -> dict[str, Any]:
        """A tool's annotations as far as they are known without starting its server: from the server's
        last listing in this process, else from `annotations_lookup` for the server's current parameters
        (e.g. recorded when its package was generated), else `{}` (no hint declared, as far as known)."""
        listed = self._listed.get(server_name)
        if listed is not None:
            return annotations_of(listed.get(tool_name))
        recorded_for_root = self._package_entries.get(server_name)
        if recorded_for_root is not None:  # recorded with the parameters its root has
            return dict(recorded_for_root.get(tool_name) or {})
        params = self._params.get(server_name)
        if params is None or self.annotations_lookup is None:
            return {}
        try:
            recorded = self.annotations_lookup(server_name, params)
        except Exception:  # unknown annotations are "none declared": the call is still decided
            logger.exception("looking up the recorded tool annotations of MCP server %r failed", server_name)
            return {}
        return dict(recorded.get(tool_name) or {}) if recorded else {}

    def tools(self, server_name: str) -> list[types.Tool]:
        """The tools a started server listed when it started, in its order; empty when it is not running.

        Example:
            ```python
            await servers.connection("time")
            names = [tool.name for tool in servers.tools("time")]
            ```
        """
        return list(self._tools.get(server_name, {}).values())

    async def tool(self, server_name: str, tool_name: str) -> types.Tool | None:
        """A tool's definition (annotations, output schema), starting the server if needed."""
        await self.connection(server_name)
        return self._tools.get(server_name, {}).get(tool_name)

    def listing(self, server_name: str) -> int:
        """How many times the server has listed its tools in this process: pass it to `call(listed=)`."""
        return self._listings[server_name]

    async def call(
        self,
        server_name: str,
        tool_name: str,
        arguments: Mapping[str, Any],
        *,
        caller: str = "",
        listed: int | None = None,
    ) -> types.CallToolResult:
        """Call a tool for `caller` (who it is matters to `reset_caller`). A server whose connection broke
        is dropped, to be started again on the next call.

        A call that times out or answers too much fails alone: the server keeps running for the others
        (a timed-out call is cancelled on the server).

        Args:
            listed: `listing(server_name)` when the call was approved: if the server lists its tools again
                before the call, `tool_gate` is asked whether the tool may still be called.

        Raises:
            UnknownServerError: No server has that name.
            CallTimeoutError: No answer within the server's `call_timeout`.
            ResultTooLargeError: The answer was larger than the server's `max_result_size`.
            ToolChangedError: The server restarted since `listed`, and `tool_gate` refuses the tool now.
            MCPServerError: The server could not be started or the call failed.
        """
        in_flight = self._in_flight.setdefault(server_name, Counter())
        in_flight[caller] += 1
        try:
            connection = await self.connection(server_name)
            gate = self.tool_gate
            if listed is not None and gate is not None and self._listings[server_name] != listed:
                refused = gate(server_name, tool_name)
                if refused is not None:
                    raise ToolChangedError(server_name, refused)
            self._users.setdefault(server_name, set()).add(caller)
            try:
                return await connection.call_tool(tool_name, arguments)
            except ServerConnectError as e:
                if self._connections.get(server_name) is connection:  # not restarted meanwhile
                    self._stopped[server_name] = str(e)
                await self._close(server_name)
                raise
        finally:
            in_flight[caller] -= 1
            if not in_flight[caller]:
                del in_flight[caller]
            if not in_flight:
                self._in_flight.pop(server_name, None)

    def stopped(self, server_name: str) -> str | None:
        """Why a server that was started is not running now, when it ended by itself (the error of the
        call that found it gone, e.g. "MCP server 'x' went over its memory limit ..."); `None` while it
        runs, once it started again, and after it was stopped on purpose."""
        return self._stopped.get(server_name)

    def calls_in_flight(self, server_name: str) -> dict[str, int]:
        """The calls to a server that have not returned yet, by caller."""
        return dict(self._in_flight.get(server_name, {}))

    def users(self, server_name: str) -> set[str]:
        """The callers a started server serves: those that called it since it started (and have not
        reset since), and those calling it now."""
        return self._users.get(server_name, set()) | set(self._in_flight.get(server_name, ()))

    async def reset_caller(self, caller: str) -> list[str]:
        """A caller's reset: stop the started servers `caller` has used that no other caller has used
        since they started or is calling now; take `caller` off the users of the others, which keep
        running. Returns the names of the servers stopped (they start again on their next call).
        """
        stopped = []
        for name in list(self._connections):
            involved = self.users(name)
            if caller not in involved:
                continue
            if involved == {caller}:
                stopped.append(name)
            else:
                self._users.get(name, set()).discard(caller)
        await asyncio.gather(*(self._close(name) for name in stopped))
        return stopped

    async def stop(self, server_name: str | None = None) -> None:
        """Stop one server, or all of them (they start again on their next call)."""
        names = [server_name] if server_name is not None else list(self._connections)
        if server_name is None:
            self._stopped.clear()
        else:
            self._stopped.pop(server_name, None)
        await asyncio.gather(*(self._close(name) for name in names))

    async def _close(self, server_name: str) -> None:
        # All before the first await: a call arriving meanwhile starts a new server with no users yet.
        connection = self._connections.pop(server_name, None)
        self._tools.pop(server_name, None)
        self._users.pop(server_name, None)
        if connection is not None:
            with contextlib.suppress(MCPServerError, OSError):
                await connection.stop()
