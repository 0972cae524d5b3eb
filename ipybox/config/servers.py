"""`[servers.<name>]`: the MCP servers of a workspace, local (stdio) or remote (streamable HTTP or SSE).

```toml
[servers.filesystem]                  # a stdio server, started by ipybox
command = "npx"
args = ["-y", "@modelcontextprotocol/server-filesystem", "."]
sandbox = true                        # or a table: [servers.filesystem.sandbox] ...

[servers.github]                      # a remote server
url = "https://api.githubcopilot.com/mcp/"
headers = { Authorization = "Bearer ${GITHUB_TOKEN}" }
call_timeout = 600                    # seconds a tool call may wait for its answer (default 300)
max_result_size = "16MiB"             # the largest answer (default 64 MiB)

[servers.fetch]
command = "uvx"
args = ["mcp-server-fetch"]
limits = { memory = "512MiB", processes = 64 }   # keys of [kernel.limits]; none by default
```

A server's table is the server-parameters model of `ipybox.mcp_client.params` (the one `generate_mcp_sources`,
`register_mcp_server` and the host's registry use) plus `enabled`: same keys, same checks, same messages.
`ServerSection` is the discriminated union of `StdioServerSection` (with `command`) and
`RemoteServerSection` (with `url`).

A server's name becomes the name of its Python package under `mcptools/`, so it must be a Python
identifier (ASCII) that is not a keyword.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeAlias

from pydantic import AfterValidator, TypeAdapter, WithJsonSchema

from ipybox.mcp_client.params import (
    SERVER_NAME_PATTERN,
    HttpServerParams,
    StdioServerParams,
    check_server_name,
    dump_server_params,
    server_union,
    suggest_server_name,
)
from ipybox.rules.shell_commands import KERNEL_SHELL_SERVER, SHELL_SERVER

__all__ = [
    "SERVER_NAME_PATTERN",
    "RemoteServerSection",
    "ServerName",
    "ServerSection",
    "StdioServerSection",
    "TaggedServerSection",
    "check_server_name",
    "map_server_name",
    "parse_server_section",
    "suggest_server_name",
]

RESERVED_SERVER_NAMES = (KERNEL_SHELL_SERVER, SHELL_SERVER)
"""Names rules use for ipybox's own calls (`ipybox.*`: registrations, a kernel's shell questions) and for
shell commands (`shell.<program>`): a server of that name would be decided by the same rules."""


def _not_reserved(name: str) -> str:
    if name in RESERVED_SERVER_NAMES:
        decided = "shell commands" if name == SHELL_SERVER else "ipybox's own calls"
        raise ValueError(
            f"the server name {name!r} is reserved: [approval] rules with server = {name!r} decide "
            f"{decided}; name it e.g. {name + '_server'!r}"
        )
    return name


def map_server_name(name: str) -> str:
    """A server's name in ipybox for `name`, its name in another client's configuration: `name` itself
    when it is a valid server name, else the closest one (`my-server` and `my.server` -> `my_server`,
    `2fa` -> `server_2fa`, `class` -> `class_`, the reserved `shell` -> `shell_server`).

    ipybox keeps one name per server, this one: `[servers.<name>]`, the package `mcptools.<name>`,
    `server = "<name>"` in rules, and what `ipybox server list` shows.

    Example:
        ```python
        assert map_server_name("my-server") == "my_server" and map_server_name("time") == "time"
        ```
    """
    try:
        mapped = check_server_name(name)
    except ValueError:
        mapped = suggest_server_name(name)
    return mapped + "_server" if mapped in RESERVED_SERVER_NAMES else mapped


ServerName = Annotated[
    str,
    AfterValidator(check_server_name),
    AfterValidator(_not_reserved),
    WithJsonSchema(
        {"type": "string", "pattern": SERVER_NAME_PATTERN, "not": {"enum": list(RESERVED_SERVER_NAMES)}}
    ),
]
"""A server's name: the key of its `[servers.<name>]` table (not one of `RESERVED_SERVER_NAMES`)."""


class StdioServerSection(StdioServerParams):
    """A stdio server: a command ipybox starts on the host.

    String values may contain `${VAR}` placeholders, filled from the host's environment or the
    workspace's `.env` when the server is started (never inside a kernel).

    Attributes:
        command: Executable of a stdio server (looked up on `PATH`; a relative path is relative to `cwd`).
        args: Its command-line arguments.
        env: Extra environment variables for it, over a minimal safe environment (`HOME`, `PATH`, ...).
        cwd: Its working directory, relative to the workspace (default: the workspace directory).
        sandbox: Run it in a sandbox: `true` for the default policy (read all but secrets, write only the
            workspace, no network), or a table shaped like `[sandbox]`. Default: not sandboxed.
        call_timeout: Seconds a tool call may wait for the server's answer; then the call fails with a
            `call_timeout` error and the server is told to cancel it (it keeps serving other calls).
            Default: 300.
        max_result_size: The largest answer the server may send, in bytes or with a unit ("64MiB",
            "500KB"); a larger one is read past, never held, and the call fails with a `result_too_large`
            error. At least 64 KiB. Default: "64MiB".
        limits: What the server and every process it starts may use: the keys of `[kernel.limits]`
            (`memory`, `cpus`, `processes`, `open_files`, `tmp` (only with `sandbox`), `enforce`), e.g.
            `limits = { memory = "512MiB", processes = 64 }`. Default: none (a server is a third-party
            program with its own needs). A server killed for going over its memory limit fails the call
            that was running with an error saying so, and starts again on the next call.
        type: `"stdio"`, optional: accepted because `.mcp.json`, VS Code and Cursor write it next to
            `command`. A remote transport here (`"http"`, `"sse"`, ...) is an error: a remote server has
            `url` instead of `command`.
        enabled: Whether the workspace uses the server; a disabled one is kept in the file only.

    Example:
        ```python
        server = parse_server_section({"command": "npx", "args": ["-y", "pkg"]})
        assert server.server_params() == {"command": "npx", "args": ["-y", "pkg"]}
        ```
    """

    enabled: bool = True

    def server_params(self, workspace_dir: Path | None = None) -> dict[str, Any]:
        """The server's parameters as `ipybox.mcp_client` and `generate_mcp_sources` take them, with
        `${VAR}` placeholders left in.

        Args:
            workspace_dir: The workspace directory: when given, `cwd` is resolved against it (and
                defaults to it).

        Returns:
            `{"command", "args"[, "env"][, "cwd"][, "sandbox"][, "call_timeout"][, "max_result_size"][,
            "limits"]}`, `sandbox` being the policy in the published format (left out when the server runs
            unsandboxed), the limits in seconds and bytes (left out when not set).
        """
        params: dict[str, Any] = {"command": self.command, "args": list(self.args)}
        if self.env:
            params["env"] = dict(self.env)
        cwd = self.cwd
        if workspace_dir is not None:
            cwd = str(workspace_dir / cwd) if cwd is not None else str(workspace_dir)
        if cwd is not None:
            params["cwd"] = cwd
        if (policy := self.sandbox_policy()) is not None:
            params["sandbox"] = policy.model_dump(by_alias=True)
        if self.call_timeout is not None:
            params["call_timeout"] = self.call_timeout
        if self.max_result_size is not None:
            params["max_result_size"] = int(self.max_result_size)
        if self.limits is not None and (limits := dump_server_params(self).get("limits")):
            params["limits"] = limits
        return params


class RemoteServerSection(HttpServerParams):
    """A remote server, which ipybox connects to.

    String values may contain `${VAR}` placeholders, filled from the host's environment or the
    workspace's `.env` when the server is reached (never inside a kernel).

    Attributes:
        url: Endpoint of a remote server (`http://` or `https://`).
        headers: HTTP headers sent with every request to it (e.g. `Authorization`).
        type: Its transport: `streamable_http` or `sse` (default: `sse` when the URL path contains
            `/sse`, else `streamable_http`); `http` and `streamable-http`, as other MCP clients spell it,
            are taken for `streamable_http`. `stdio` is an error: that is a server with `command`.
        call_timeout: Seconds a tool call may wait for the server's answer; then the call fails with a
            `call_timeout` error and the server is told to cancel it. Default: 300.
        max_result_size: The largest answer the server may send, in bytes or with a unit ("64MiB",
            "500KB"); a larger one fails the call with a `result_too_large` error. At least 64 KiB.
            Default: "64MiB".
        enabled: Whether the workspace uses the server; a disabled one is kept in the file only.
    """

    enabled: bool = True

    def server_params(self, workspace_dir: Path | None = None) -> dict[str, Any]:
        """The server's parameters as `ipybox.mcp_client` and `generate_mcp_sources` take them, with
        `${VAR}` placeholders left in: `{"url"[, "headers"][, "type"][, "call_timeout"][,
        "max_result_size"]}`."""
        params = dump_server_params(self)
        params.pop("enabled", None)
        params.pop("headers", None)
        if self.headers:
            params["headers"] = dict(self.headers)
        return params


ServerSection: TypeAlias = StdioServerSection | RemoteServerSection
"""One MCP server: `command` (a stdio server ipybox starts) or `url` (a remote server), not both."""

if TYPE_CHECKING:
    TaggedServerSection: TypeAlias = ServerSection
else:
    # `ServerSection` as a field's type: validation picks the member by `command` or `url`.
    TaggedServerSection = server_union(StdioServerSection, RemoteServerSection)
_SECTION_ADAPTER: TypeAdapter[ServerSection] = TypeAdapter(TaggedServerSection)


def parse_server_section(table: Any) -> ServerSection:
    """Validate one `[servers.<name>]` table.

    Raises:
        pydantic.ValidationError: It is not a valid server (locations carry the union tag, `stdio` or
            `http`, after the table's own path).
    """
    return _SECTION_ADAPTER.validate_python(table)
