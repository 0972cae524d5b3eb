"""Code as tool in the workspace MCP server: `search_tools`, `save_code_action`, and every saved code action
(`gentools/<category>/<name>/`) as an MCP tool of its own, named `<category>__<name>`.

Contracts:

- `WorkspaceMCPServer` is mcp 2.x's `MCPServer` with a dynamic part in its tool list. `MCPServer` derives
  a tool's schema from a Python signature when the tool is registered; saved actions come and go while
  it runs and carry their schemas in their manifests, so the subclass overrides the two public methods
  its `tools/list` and `tools/call` handlers call (`list_tools`, `call_tool`). A name of a built-in tool
  always means the built-in tool (action names contain `__`, built-in names never do; checked anyway).
- `tools/list` is in a fixed order, the same for every caller and request while the tools don't change
  (the spec's SHOULD: clients cache it, models' prompt caches hit): the built-in tools in `TOOL_ORDER`
  (one not named there after them, by name), then the saved actions by tool name. Its caching hints
  and `server/discover`'s are in `CACHE_HINTS`, with the reasons.
- Capabilities, in `initialize` and `server/discover` alike: `tools` with `listChanged` (on 2026-07-28
  delivered on `subscriptions/listen`); `prompts` only when the server has some (mcp serves its list
  method regardless); `resources` (neither subscribed nor changing) for the MCP App view's `ui://`
  resource, which hosts read and nobody lists (`ipybox.mcp_server.app_view`); no `logging` (deprecated in 2026-07-28, and ipybox sends no
  log messages, so a request's `io.modelcontextprotocol/logLevel` gets none: mcp refuses a level that
  is not one). `supportedVersions` is mcp's: the per-request revisions (2026-07-28); the handshake
  revisions are served through `initialize`, which a client on one of them sends first.
- Listing reads the actions from disk each time (`read_actions`: manifests and `ast` only, never an
  import) and answers from their manifests (the descriptions cached when they were saved or last
  described): `tools/list` never waits for an action's import, which is agent-written code that may
  never finish. A stale action (its `api.py` edited after it was saved, or no manifest) is left out and
  described again in the background, one description at a time, in ONE fresh kernel for all of them
  (bounded: each kernel's check times out), through an open MCP session's executor or, with none open, a
  short-lived executor of the workspace; once described it is listed from the next `tools/list` on. One
  that does not import (or whose import times out) is left out (logged) and not described again until
  the content of its `api.py` changes (touching it is no change).
- A call runs in the calling session's kernel through `execute_ipython_cell` itself (so `ask` rules become
  elicitations, a denied call says which rule denied it, progress and cancellation work). The generated
  cell gets the names and the arguments only inside one `repr`'d JSON string: argument text never becomes
  code. It drops the action's modules from `sys.modules` (the file on disk is what runs), validates the
  arguments with the action's `Params`, awaits `run()` if it is a coroutine, and prints the result after
  a marker unique to the call: the tool returns the result and, apart from it, what the action printed.
- `save_code_action` saves through the session's `CodeExecutor.save_code_action` (checked in a fresh
  kernel, atomic), syncs the search index and tells clients that the tool list changed
  (`notify_tools_changed`): every client listening on `subscriptions/listen` (2026-07-28; saved actions
  are the workspace's, so every caller's list changed, whichever revision the saver speaks) and, on a
  handshake-era request, its own client on the request's stream. A stale action described in the
  background is announced to listeners the same way once it is listed. The server declares
  `tools.listChanged`, without which clients ignore the notification.
- `search_tools` ranks with `ipybox.codeact.index.ToolIndex` (SQLite FTS5), one index per server instance
  in the workspace's state directory, synced before every search (only changed files are parsed again),
  so what the reconciler regenerates is found without a hook. SQLite connections belong to the thread that
  opened them, so every index call runs on one worker thread of its own.

Everything under `gentools/` is agent-written and kernel-writable: manifests are capped and checked before
they become tool schemas.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import mcp_types as types
from mcp.server.caching import CacheableMethod, CacheHint
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.helper_types import ReadResourceContents
from mcp.server.lowlevel.server import NotificationOptions
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ToolsListChanged
from mcp_types import Tool as MCPTool
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from ipybox.codeact.actions import CodeActionError, SavedAction, api_digest, describe_actions, read_actions
from ipybox.codeact.checks import RunCheck
from ipybox.codeact.index import ToolHit, ToolIndex
from ipybox.codeact.layout import (
    API_MODULE,
    GENTOOLS,
    TOOL_NAME_SEPARATOR,
    action_module,
    action_tool_name,
    gentools_dir,
    name_problem,
)
from ipybox.config import CONFIG_FILE
from ipybox.errors import IpyboxError
from ipybox.executor.code_executor import CodeExecutor
from ipybox.mcp_client.stdio_transport import without_lone_surrogates
from ipybox.mcp_server.app_view import APP_MIME_TYPE, APP_TOOLS, VIEW_URI, AppViews, supports_apps
from ipybox.mcp_server.kernels import ACTION_CALL
from ipybox.mcp_server.registration import load_workspace_config
from ipybox.mcp_server.rounds import Spawn
from ipybox.running.state import StatePaths

logger = logging.getLogger(__name__)

T = TypeVar("T")

ACTION_TIMEOUT = 600.0
"""Seconds a saved action called as an MCP tool may run (its tool calls' approvals not counted)."""
INDEX_FILE = "tool-index.sqlite"
"""The search index, in the workspace's state directory."""
MAX_LIMIT = 50
_MAX_ARGUMENTS = 1_000_000  # characters of JSON arguments an action call takes
_MAX_RESULT = 200_000  # characters of output an action call returns (execute_ipython_cell's cap)
_MAX_PENDING_MARKERS = 1000  # result markers of action calls asked in band, kept for their retries
_MAX_DESCRIPTION = 8_000  # characters of a manifest's description listed as a tool's description
_MAX_SCHEMA = 200_000  # characters of a manifest's schema (as JSON) listed as a tool's schema
_MAX_QUERY = 1_000
_CELL_TOOL = "execute_ipython_cell"  # the built-in tool an action call runs through

TOOL_ORDER = (
    "execute_ipython_cell",
    "install_package",
    "reset",
    "close_kernel",
    "upload_file",
    "download_file",
    "register_mcp_server",
    "search_tools",
    "save_code_action",
)
"""The built-in tools in the order `tools/list` gives them: running code first (what an agent does most),
then the kernel's upkeep, files in and out, adding servers, and code as tool. A built-in tool not named here follows them,
by name; the saved actions come last, by name."""

CACHE_HINTS: dict[CacheableMethod, CacheHint] = {
    # The tool list changes without a request of the caller: another client saves a code action, a stale
    # one is described in the background, a kernel writes an action into gentools/ (no notification covers
    # that). So it is stale at once (0): a client fetches it when it needs it, and the `listChanged`
    # notification is an early hint, not the only one. Private, although every caller of a workspace gets
    # the same list: it holds the workspace's own data (saved actions' names, descriptions, what they may
    # call), which a "public" answer lets a shared cache hand to a caller who never showed the workspace's
    # token. With a TTL of 0 private costs nothing.
    "tools/list": CacheHint(ttl_ms=0, scope="private"),
    # Name, version, capabilities and instructions: fixed for the life of the server process and free of
    # the workspace's data, so the same for anyone (public); an hour, as ipybox changes them only when it
    # is upgraded, and that restarts the server. If instructions ever name the workspace's servers or
    # actions, make this private and short.
    "server/discover": CacheHint(ttl_ms=3_600_000, scope="public"),
}

ExecutorOf = Callable[[Context], AbstractAsyncContextManager[CodeExecutor]]
"""The executor of the caller's kernel while entered: its session's (opened on first use), or for a
caller without one, a kernel for this call."""
OpenExecutors = Callable[[], Sequence[CodeExecutor]]
"""The executors of the kernels open now."""


class WorkspaceMCPServer(MCPServer[Any]):
    """`MCPServer` whose tool list also holds the workspace's saved code actions (`code_actions`, set by
    `add_code_action_tools`), in a fixed order, with the capabilities it has (see the module)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Where `subscriptions/listen` streams get their events: kept, so that what happens outside a
        # request (a background description) can announce a change too.
        self.subscriptions = InMemorySubscriptionBus()
        super().__init__(*args, subscriptions=self.subscriptions, cache_hints=CACHE_HINTS, **kwargs)
        self.code_actions: CodeActions | None = None
        # The MCP App view of runs (`ipybox.mcp_server.app_view`), for clients that declare MCP Apps.
        self.app_views: AppViews | None = None
        # Awaited before every tool call (`ipybox mcp` starts its workspace there, on first use).
        self.before_call: Callable[[], Awaitable[None]] | None = None
        # mcp 2.x derives the capabilities of `initialize` (every transport: stdio, streamable HTTP,
        # ipybox's own stdio wire) and `server/discover` from its low-level server's `get_capabilities`,
        # which declares what MCPServer registers handlers for (prompts, resources: always) and, for the
        # handshake revisions, `tools.listChanged` only when a caller passes NotificationOptions (none
        # does); MCPServer has no parameter for either.
        lowlevel = self._lowlevel_server
        original = lowlevel.get_capabilities

        def capabilities(
            notification_options: NotificationOptions | None = None, *args: Any, **kwargs: Any
        ) -> types.ServerCapabilities:
            declared = original(NotificationOptions(tools_changed=True), *args, **kwargs)
            return declared.model_copy(
                update={
                    "prompts": declared.prompts if self._prompt_manager.list_prompts() else None,
                    "resources": (
                        declared.resources
                        if self._resource_manager.list_resources() or self._resource_manager.list_templates()
                        # Only the MCP App view's `ui://` resource: read by hosts, never listed or changed.
                        else types.ResourcesCapability()
                        if self.app_views is not None
                        else None
                    ),
                }
            )

        lowlevel.get_capabilities = capabilities  # type: ignore[method-assign]

    async def _handle_list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        """The tool list; to a client that does not declare MCP Apps exactly the list before the view
        existed: no app-only tools, no `_meta.ui`."""
        tools = await self.list_tools()
        if self.app_views is None or not supports_apps(Context(request_context=ctx, mcp_server=self)):
            tools = [_without_ui(tool) for tool in tools if tool.name not in APP_TOOLS]
        return types.ListToolsResult(tools=tools)

    async def read_resource(self, uri: Any, context: Context[Any, Any] | None = None) -> Any:
        """`VIEW_URI`: the run view, with a key for the session reading it (`AppViews.html`); others as
        mcp serves them."""
        if self.app_views is not None and str(uri) == VIEW_URI and context is not None:
            html = self.app_views.html(context)
            meta = {"ui": {"csp": {}, "prefersBorder": True}}
            return [ReadResourceContents(content=html, mime_type=APP_MIME_TYPE, meta=meta)]
        return await super().read_resource(uri, context)

    async def list_tools(self) -> list[MCPTool]:
        rank = {name: i for i, name in enumerate(TOOL_ORDER)}
        tools = sorted(await super().list_tools(), key=lambda t: (rank.get(t.name, len(rank)), t.name))
        if self.code_actions is None:
            return tools
        builtin = {tool.name for tool in tools}
        return tools + [tool for tool in await self.code_actions.tools() if tool.name not in builtin]

    async def announce_tools_changed(self) -> None:
        """Tell the clients listening on `subscriptions/listen` (2026-07-28) that the tool list changed
        (never fails: logged). For a change a request made, `notify_tools_changed(ctx)` also tells a
        handshake-era client."""
        try:
            await self.subscriptions.publish(ToolsListChanged())
        except Exception as e:  # listeners re-list later anyway
            logger.warning("the listening clients could not be told that the tool list changed: %s", e)

    def end_subscriptions(self) -> None:
        """End every `subscriptions/listen` stream gracefully (the server stops): each answers its listen
        request, so that its client knows the end was meant (the spec's SHOULD), then closes."""
        entry = self._lowlevel_server.get_request_handler("subscriptions/listen")
        if entry is not None and isinstance(entry.handler, ListenHandler):
            entry.handler.close()

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> types.CallToolResult | types.InputRequiredResult:
        if self.before_call is not None:
            await self.before_call()
        if self.code_actions is not None and TOOL_NAME_SEPARATOR in name:
            builtin = {tool.name for tool in await super().list_tools()}
            if name not in builtin:
                if context is None:
                    raise ToolError(f"{name} runs in an MCP session's kernel; it was called outside one")
                return await self.code_actions.call(name, arguments, context)
        return await super().call_tool(name, arguments, context)


def _without_ui(tool: MCPTool) -> MCPTool:
    """`tool` without the MCP Apps keys of its `_meta` (and no `_meta` when that was all)."""
    meta = tool.meta
    if not meta or "ui" not in meta:
        return tool
    rest = {key: value for key, value in meta.items() if key != "ui"}
    return tool.model_copy(update={"meta": rest or None})


@dataclass(frozen=True)
class _Paths:
    mcptools: Path
    gentools: Path
    index: Path


class CodeActions:
    """The code-as-tool side of one workspace MCP server (see the module docstring)."""

    def __init__(
        self,
        server: WorkspaceMCPServer,
        workspace: Path,
        executor_of: ExecutorOf,
        open_executors: OpenExecutors,
    ) -> None:
        self.server = server
        self.workspace = workspace
        self._executor_of = executor_of
        self._open_executors = open_executors
        self._paths: _Paths | None = None
        self._index: ToolIndex | None = None
        # SQLite objects may only be used in the thread that created them: one thread for the index.
        self._index_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ipybox-tool-index")
        self._describing: asyncio.Task[None] | None = None  # the background description of stale actions
        # Runs the description in the task group of the server that holds this (set while it runs).
        self.spawn: Spawn | None = None
        # Stale actions whose description failed, by the sha256 of the `api.py` it failed for.
        self._undescribable: dict[tuple[str, str], str | None] = {}
        # The result marker of each action call asked in band (2026-07-28), by its operation's id.
        self._markers: dict[str, str] = {}

    # -- paths and index -----------------------------------------------------------------------------

    async def paths(self) -> _Paths:
        """Where the workspace keeps its tools: fixed at first use, as the reconciler fixes its
        `mcptools_dir` once (a later edit of `[workspace]` takes effect when the workspace restarts)."""
        if self._paths is None:
            try:
                config = await asyncio.to_thread(load_workspace_config, self.workspace)
                mcptools = config.resolve(config.workspace.mcptools_dir)
                state_dir = StatePaths(config.resolve(config.workspace.state_dir)).dir
            except ValueError as e:
                raise ToolError(str(e)) from None
            self._paths = _Paths(mcptools, gentools_dir(mcptools), state_dir / INDEX_FILE)
        return self._paths

    async def _in_index_thread(self, fn: Callable[[ToolIndex], T]) -> T:
        paths = await self.paths()

        def run() -> T:
            if self._index is None:
                paths.index.parent.mkdir(parents=True, exist_ok=True)
                self._index = ToolIndex(paths.mcptools, paths.index)
            return fn(self._index)

        return await asyncio.get_running_loop().run_in_executor(self._index_thread, run)

    async def sync_index(self) -> None:
        """Bring the search index up to date (logged, never raised: the index is an aid)."""
        try:
            changed = await self._in_index_thread(lambda index: index.sync())
        except Exception as e:  # searching later reports what is wrong
            logger.warning("the tool index could not be synced: %s", e)
            return
        logger.debug("tool index synced: %d entries changed", changed)

    def stop_describing(self) -> None:
        """Cancel the description of stale actions running in the background, if one is."""
        if self._describing is not None:
            self._describing.cancel()

    def close(self) -> None:
        """Close the index and its thread, and stop describing (idempotent)."""
        self.stop_describing()
        index, self._index = self._index, None
        if index is not None:
            self._index_thread.submit(index.close)
        self._index_thread.shutdown(wait=False)

    # -- search_tools --------------------------------------------------------------------------------

    async def search(self, query: str, limit: int) -> str:
        if not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
            raise ToolError(f"limit must be a number from 1 to {MAX_LIMIT}, not {limit!r}")
        if not query.strip():
            raise ToolError("query must say what you look for, e.g. 'list commits of a repository'")
        if len(query) > _MAX_QUERY:
            raise ToolError(f"query is {len(query)} characters long; use a few words (at most {_MAX_QUERY})")

        def search(index: ToolIndex) -> list[ToolHit]:
            index.sync()
            return index.search(query, limit)

        try:
            hits = await self._in_index_thread(search)
        except ToolError:
            raise
        except Exception as e:  # one clear error instead of a traceback
            raise ToolError(f"the tool index could not be searched: {e}") from None
        if not hits:
            return (
                f"no generated tool or saved code action matches {query!r}. Try other words, or read the "
                "indexes: mcptools/<server>/__init__.py and gentools/<category>/__init__.py"
            )
        lines = [f"{len(hits)} best match{'es' if len(hits) > 1 else ''} (read the file for the interface):"]
        lines += [format_hit(hit) for hit in hits]
        return "\n".join(lines)

    # -- save_code_action ----------------------------------------------------------------------------

    async def save(self, ctx: Context, category: str, name: str, api: str, impl: str, overwrite: bool) -> str:
        try:
            async with self._executor_of(ctx) as executor:
                saved = await executor.save_code_action(
                    category, name, api=api, impl=impl, overwrite=overwrite
                )
        except CodeActionError as e:
            raise ToolError(str(e)) from None
        except IpyboxError as e:  # a symlink where it would be written, no kernel to check it in, ...
            raise ToolError(f"the code action was not saved: {e}") from None
        await self.sync_index()
        await notify_tools_changed(ctx)
        return describe_saved(saved, self.workspace)

    # -- saved actions as MCP tools ------------------------------------------------------------------

    async def tools(self) -> list[MCPTool]:
        """The saved actions as MCP tools, from their manifests; stale ones are left out and described
        again in the background (never waited for: see the module)."""
        if not (self.workspace / CONFIG_FILE).exists():
            return []  # not a workspace (yet): nothing saved, and nothing to complain about
        try:
            paths = await self.paths()
            listing = await asyncio.to_thread(read_actions, paths.gentools)
        except Exception as e:  # a broken gentools/ must not break the built-in tools
            logger.warning("saved code actions could not be listed: %s", e)
            return []
        if listing.stale:
            await self._describe_later(paths, listing.stale)
        tools: list[MCPTool] = []
        for action in sorted(listing.actions, key=lambda a: a.tool_name):
            tool = action_tool(action)
            if tool is None:
                logger.warning("saved code action %s has a manifest that can't be listed", action.tool_name)
            else:
                tools.append(tool)
        return tools

    async def describe_failed_again(self) -> None:
        """After an MCP server was registered: describe again the stale actions that did not import (one
        may import the server's new `mcptools` package), in the background; those that import now are
        listed and announced (`announce_tools_changed`). The built-in tools do not change: a registration
        adds modules, not MCP tools, so it is no change of the list by itself."""
        self._undescribable.clear()
        await self.tools()

    async def _describe_later(self, paths: _Paths, stale: list[tuple[str, str]]) -> None:
        """Describe the `stale` actions in the background, unless a description runs already (the next
        listing starts another) or each failed for its `api.py` as it is now."""
        if self._describing is not None and not self._describing.done():
            return
        todo = []
        for key in stale:
            digest = await asyncio.to_thread(api_digest, paths.gentools, *key)
            if key not in self._undescribable or self._undescribable[key] != digest:
                todo.append((key, digest))
        if todo:
            if self.spawn is None:  # the server is not running (listed without being served)
                logger.info("stale code actions are described once the MCP server runs")
                return
            self._describing = self.spawn(self._describe(paths, todo), "ipybox-describe-code-actions")

    async def _describe(self, paths: _Paths, todo: list[tuple[tuple[str, str], str | None]]) -> None:
        keys = [key for key, _ in todo]
        try:
            async with self._fresh_kernel() as run:
                fresh = await describe_actions(run, paths.mcptools, keys, root=self.workspace)
        except Exception as e:  # no kernel to describe them in: the next listing tries again
            logger.warning("stale code actions could not be described (%s): they are not listed", e)
            return
        found = {(a.category, a.name) for a in fresh}
        if found:
            await self.server.announce_tools_changed()
        for key, digest in todo:
            if key in found:
                self._undescribable.pop(key, None)
                logger.info(
                    "saved code action %s described again: listed from now on", action_tool_name(*key)
                )
            else:
                logger.warning(
                    "saved code action %s does not import: it is not listed until its api.py changes",
                    action_tool_name(*key),
                )
                self._undescribable[key] = digest

    @asynccontextmanager
    async def _fresh_kernel(self) -> AsyncIterator[RunCheck]:
        """Something that runs a check in a fresh kernel: an open session's executor, else one of the
        workspace started for it (listing happens before a client's first call opens its session)."""
        open_now = list(self._open_executors())
        if open_now:
            logger.info("describing stale code actions in a fresh kernel, through an MCP session's executor")
            yield open_now[0].check_in_fresh_kernel
            return
        logger.info("describing stale code actions in a fresh kernel, through an executor started for it")
        async with CodeExecutor(workspace=self.workspace) as executor:
            yield executor.check_in_fresh_kernel

    async def call(
        self, tool_name: str, arguments: dict[str, Any], ctx: Context
    ) -> types.CallToolResult | types.InputRequiredResult:
        """Run the saved action `tool_name` in the session's kernel (see the module docstring)."""
        category, _, name = tool_name.partition(TOOL_NAME_SEPARATOR)
        paths = await self.paths()
        if (
            name_problem(category, "category") is not None
            or name_problem(name, "name") is not None
            or not await asyncio.to_thread((paths.gentools / category / name / f"{API_MODULE}.py").is_file)
        ):
            raise ToolError(f"unknown tool {tool_name!r}: no saved code action has that name")
        try:
            payload = json.dumps(arguments)
        except (TypeError, ValueError) as e:
            raise ToolError(f"the arguments of {tool_name} are not JSON: {e}") from None
        if len(payload) > _MAX_ARGUMENTS:
            raise ToolError(
                f"the arguments of {tool_name} are {len(payload)} characters of JSON; at most "
                f"{_MAX_ARGUMENTS} are taken (pass large data as a file path)"
            )
        # A 2026-07-28 retry resumes the cell of its first round, which prints that round's marker.
        resumed = ctx.request_state.partition(".")[0] if ctx.request_state is not None else None
        marker = self._markers.pop(resumed, None) if resumed is not None else None
        marker = marker or f"<<ipybox-action-result {secrets.token_hex(12)}>>"
        code = action_call_code(action_module(category, name), payload, marker)
        cell = {"code": code, "timeout": ACTION_TIMEOUT, "max_output_chars": _MAX_RESULT}
        token = ACTION_CALL.set(True)
        try:
            ran = await self.server.call_tool(_CELL_TOOL, cell, ctx)
        except ToolError as e:
            # mcp prefixes what a tool raises with "Error executing tool <name>: ", here not the action's.
            error = str(e).removeprefix(f"Error executing tool {_CELL_TOOL}: ")
            raise ToolError(f"{tool_name} failed:\n{error}") from None
        finally:
            ACTION_CALL.reset(token)
        if isinstance(ran, types.InputRequiredResult):  # asked in band: the retry comes back here
            if ran.request_state is not None:
                if len(self._markers) >= _MAX_PENDING_MARKERS:  # rounds never retried: forget the oldest
                    self._markers.pop(next(iter(self._markers)))
                self._markers[ran.request_state.partition(".")[0]] = marker
            return ran
        return action_result(tool_name, ran, marker)


def add_code_action_tools(
    server: WorkspaceMCPServer, workspace: Path, executor_of: ExecutorOf, open_executors: OpenExecutors
) -> CodeActions:
    """Register `search_tools` and `save_code_action` on `server` and list its saved actions as tools."""
    actions = CodeActions(server, workspace, executor_of, open_executors)
    server.code_actions = actions

    @server.tool()
    async def search_tools(query: str, limit: int = 10) -> str:
        """Search the generated MCP tool modules (mcptools/) and the saved code actions (gentools/) of this
        workspace, ranked by relevance (BM25 over names, descriptions and parameter names). Returns one
        line per match: the module to import, its signature, its description and the file to read for
        its interface. Read only the interfaces you need, then compose them in one execute_ipython_cell.

        Args:
            query: Words describing what the tool should do, e.g. "list commits of a repository".
            limit: How many matches to return (1 to 50).
        """
        return await actions.search(query, limit)

    @server.tool()
    async def save_code_action(
        category: str, name: str, api: str, impl: str, ctx: Context, overwrite: bool = False
    ) -> str:
        """Save code that worked as a reusable code action: the package gentools/<category>/<name>/,
        importable in later code (`from gentools.<category>.<name> import run, Params`) and listed as the
        MCP tool <category>__<name>. It is imported in a fresh kernel before it is accepted; its tool
        calls stay subject to the workspace's approval rules.

        Args:
            category: Lowercase identifier grouping actions, e.g. "github".
            name: Lowercase identifier of the action, e.g. "commits_of_top_repos".
            api: Source of api.py, the interface: a pydantic result model, `class Params(BaseModel)` if
                it takes arguments, and `run(params: Params) -> Result` (or `async def run`) with a
                docstring (the tool's description). It calls into impl.py (`from . import impl`).
            impl: Source of impl.py: the composition of `mcptools` and other `gentools` modules.
            overwrite: Replace an action saved under the same name.
        """
        return await actions.save(ctx, category, name, api, impl, overwrite)

    return actions


async def notify_tools_changed(ctx: Context) -> None:
    """Tell clients that a request (`ctx`, of either revision) changed the tool list: every client
    listening on `subscriptions/listen` (2026-07-28), and, on a handshake-era request, its own client on
    the request's stream (never fails the request)."""
    request = ctx.request_context
    if request.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        try:
            # On this request's own stream: a client reads it with the response, whether or not it
            # keeps a standalone stream open (streamable HTTP).
            await request.session.send_notification(
                types.ToolListChangedNotification(), related_request_id=request.request_id
            )
        except Exception as e:  # the change is made; the client lists tools again later
            logger.warning("the client could not be told that the tool list changed: %s", e)
    # Whatever revision the request speaks: the list is the workspace's, and it changed for the clients
    # listening too.
    try:
        await ctx.notify_tools_changed()
    except Exception as e:
        logger.warning("the listening clients could not be told that the tool list changed: %s", e)


def action_tool(action: SavedAction) -> MCPTool | None:
    """The MCP tool of a saved action; `None` if its manifest's schemas can't be listed (kernel-writable
    files: checked, capped)."""
    input_schema = _object_schema(action.input_schema)
    if input_schema is None:
        return None
    output_schema = _object_schema(action.output_schema) if action.output_schema is not None else None
    description = (action.description or "").strip()
    if len(description) > _MAX_DESCRIPTION:
        description = description[:_MAX_DESCRIPTION] + " [...]"
    description += (
        f"\n\nMay call: {action.calls.summary()}; tool calls are approved by the workspace's rules. "
        f"Its code: {action.module} ({GENTOOLS}/{action.category}/{action.name}/{API_MODULE}.py)."
    )
    return MCPTool(
        name=action.tool_name,
        description=description,
        input_schema=input_schema,
        output_schema=output_schema,
    )


def _object_schema(schema: object) -> dict[str, Any] | None:
    """`schema` if it is a JSON object schema of a sane size (tool schemas must have `type: object`)."""
    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        return None
    try:
        size = len(json.dumps(schema))
    except (TypeError, ValueError):
        return None
    if size > _MAX_SCHEMA:
        return None
    return {"type": "object", **schema}


def format_hit(hit: ToolHit) -> str:
    """One line of `search_tools`: `module  signature  — description  (path)`, and the MCP tool of an
    action."""
    line = f"{hit.module}  {hit.signature}  — {hit.description}  ({hit.path})"
    parts = hit.module.split(".")
    if hit.kind == "code_action" and len(parts) == 3:
        line += f"  [MCP tool {action_tool_name(parts[1], parts[2])}]"
    return line


def describe_saved(saved: SavedAction, workspace: Path) -> str:
    """What `save_code_action` answers: where it is, what to import, its tool name, what it may call."""
    try:
        where = saved.path.relative_to(workspace)
    except ValueError:
        where = saved.path
    names = "run, Params" if saved.takes_params else "run"
    return "\n".join(
        [
            f"saved {where}/ as the MCP tool {saved.tool_name}",
            f"import: from {saved.module} import {names}",
            f"signature: {'async ' if saved.is_async else ''}{saved.signature}",
            f"may call: {saved.calls.summary()} (tool calls are approved by the workspace's rules)",
        ]
    )


# The cell that runs a saved action. Everything it gets from the caller is inside one JSON document in a
# str literal (`repr`), so neither names nor argument text can become code.
_CALL_CELL = """\
async def _ipybox_action(spec):
    import importlib, inspect, json, sys
    from pydantic import ValidationError
    spec = json.loads(spec)
    package, marker = spec["module"], spec["marker"]
    # The files on disk are what runs: an earlier call, or the agent's own imports, may have cached them.
    for loaded in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        del sys.modules[loaded]
    importlib.invalidate_caches()
    api = importlib.import_module(package + ".api")
    arguments = json.loads(spec["arguments"])
    Params = getattr(api, "Params", None)
    if Params is not None:
        try:
            params = Params.model_validate(arguments)
        except ValidationError as e:
            print(marker + " invalid-arguments")
            print(e)
            print(marker + " end")
            return
        result = api.run(params)
    elif arguments:
        print(marker + " invalid-arguments")
        print("it takes no arguments, but got " + ", ".join(sorted(arguments)))
        print(marker + " end")
        return
    else:
        result = api.run()
    if inspect.isawaitable(result):
        result = await result
    if hasattr(result, "model_dump_json"):
        kind, text = "model", result.model_dump_json(by_alias=True)
    elif isinstance(result, str):
        kind, text = "text", result
    else:
        try:
            kind, text = "json", json.dumps(result)
        except (TypeError, ValueError):
            kind, text = "text", str(result)
    print(marker + " " + kind)
    print(text)
    print(marker + " end")
try:
    await _ipybox_action({spec})
finally:
    del _ipybox_action
"""


def action_call_code(module: str, arguments_json: str, marker: str) -> str:
    """The cell that imports the action package `module` afresh, validates `arguments_json` with its
    `Params` and prints `marker`, the kind of result, and the result."""
    spec = json.dumps({"module": module, "arguments": arguments_json, "marker": marker})
    return _CALL_CELL.replace("{spec}", repr(spec))


def action_result(tool_name: str, ran: types.CallToolResult, marker: str) -> types.CallToolResult:
    """The action's result from its cell's output: between the marker lines the result; before them what
    the action printed and after them what ipybox noted about the cell (denied calls), each as a text
    block of its own; images as they came."""
    text = "\n".join(block.text for block in ran.content if isinstance(block, types.TextContent))
    images = [block for block in ran.content if not isinstance(block, types.TextContent)]
    start = text.rfind(marker + " ", 0, text.rfind(f"{marker} end"))
    end = text.rfind(f"\n{marker} end")
    if start < 0 or end < start:
        shown = text if len(text) <= 4000 else "[...]\n" + text[-4000:]
        raise ToolError(f"{tool_name} printed no result (its output was cut, or it exited early):\n{shown}")
    kind, _, result = text[start + len(marker) + 1 : end].partition("\n")
    printed = text[:start].removesuffix("\n")
    notes = text[end + len(marker) + 5 :].strip()
    if kind == "invalid-arguments":
        raise ToolError(f"invalid arguments for {tool_name}: {result}")
    content: list[types.ContentBlock] = [types.TextContent(type="text", text=result)]
    if printed.strip():
        content.append(types.TextContent(type="text", text=f"[printed by {tool_name}]\n{printed}"))
    if notes:
        content.append(types.TextContent(type="text", text=notes))
    content += images
    structured: dict[str, Any] | None = None
    if kind == "model":
        try:
            # JSON may escape a lone surrogate, which no MCP transport can send: U+FFFD, as elsewhere.
            value = without_lone_surrogates(json.loads(result))
        except ValueError:
            value = None
        structured = value if isinstance(value, dict) else None
    return types.CallToolResult(content=content, structured_content=structured)
