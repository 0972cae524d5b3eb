"""`[servers.<name>]`: the MCP servers of a workspace, local (stdio) or remote (streamable HTTP or SSE).

```toml
[servers.filesystem]                  # a stdio server, started by ipybox
command = "npx"
args = ["-y", "@modelcontextprotocol/server-filesystem", "."]
sandbox = true                        # or a table: [servers.filesystem.sandbox] ...

[servers.github]                      # a remote server
url = "https://api.githubcopilot.com/mcp/"
headers = { Authorization = "Bearer ${GITHUB_TOKEN}" }
```

A server's name becomes the name of its Python package under `mcptools/`, so it must be a Python
identifier (ASCII) that is not a keyword.
"""

from __future__ import annotations

import keyword
import re
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from ipybox.config.sections import SandboxSection

_NOT_IDENTIFIER = re.compile(r"[^A-Za-z0-9_]")
_KEYWORDS = "|".join(keyword.kwlist)
SERVER_NAME_PATTERN = rf"^(?!(?:{_KEYWORDS})$)[A-Za-z_][A-Za-z0-9_]*$"
"""Valid server names, as a JSON Schema pattern: ASCII identifiers that are not Python keywords."""

_STDIO_ONLY = ("args", "env", "cwd", "sandbox")
_REMOTE_ONLY = ("headers", "type")


def suggest_server_name(name: str) -> str:
    """The closest valid server name: other characters become `_`, a leading digit gets a `server_`
    prefix, a keyword a trailing `_`.

    Example:
        ```python
        assert suggest_server_name("my-server") == "my_server"
        assert suggest_server_name("class") == "class_"
        ```
    """
    fixed = _NOT_IDENTIFIER.sub("_", name) or "server"
    if fixed[0].isdigit():
        fixed = f"server_{fixed}"
    if keyword.iskeyword(fixed):
        fixed += "_"
    return fixed


def check_server_name(name: str) -> str:
    """Return `name` if it can be a server's package name, else raise `ValueError` suggesting one."""
    if not (name.isascii() and name.isidentifier()) or keyword.iskeyword(name):
        raise ValueError(
            f"server name {name!r} is not a valid Python package name (it becomes mcptools/<name>): use "
            f"ASCII letters, digits and '_', not starting with a digit, and no Python keyword, e.g. "
            f"{suggest_server_name(name)!r}"
        )
    return name


ServerName = Annotated[
    str,
    AfterValidator(check_server_name),
    WithJsonSchema({"type": "string", "pattern": SERVER_NAME_PATTERN}),
]
"""A server's name: the key of its `[servers.<name>]` table."""


def _true_means_default_policy(value: Any) -> Any:
    # `sandbox = true` is shorthand for a table of defaults, `false` for a disabled one.
    if isinstance(value, bool):
        return {"enabled": value}
    return value


def _boolean_or_table(schema: dict[str, Any]) -> None:
    # The field validates as `SandboxSection | None`; the file may also say `true` or `false`.
    table = next(option for option in schema.pop("anyOf") if option.get("type") != "null")
    schema.pop("default", None)
    schema["anyOf"] = [{"type": "boolean"}, table]


class ServerSection(BaseModel):
    """One MCP server: `command` (a stdio server ipybox starts) or `url` (a remote server), not both.

    String values may contain `${VAR}` placeholders, filled from the host's environment or the
    workspace's `.env` when the server is started (never inside a kernel).

    Attributes:
        command: Executable of a stdio server (looked up on `PATH`; a relative path is relative to `cwd`).
        args: Its command-line arguments.
        env: Extra environment variables for it, over a minimal safe environment (`HOME`, `PATH`, ...).
        cwd: Its working directory, relative to the workspace (default: the workspace directory).
        url: Endpoint of a remote server (`http://` or `https://`).
        headers: HTTP headers sent with every request to it (e.g. `Authorization`).
        type: Its transport: `streamable_http` or `sse` (default: `sse` when the URL path contains
            `/sse`, else `streamable_http`).
        enabled: Whether the workspace uses the server; a disabled one is kept in the file only.
        sandbox: Run a stdio server in a sandbox: `true` for the default policy (read all but secrets,
            write only the workspace, no network), or a table shaped like `[sandbox]`. Default: not
            sandboxed.

    Example:
        ```python
        server = ServerSection.model_validate({"command": "npx", "args": ["-y", "pkg"]})
        assert server.server_params() == {"command": "npx", "args": ["-y", "pkg"]}
        ```
    """

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        json_schema_extra={
            "oneOf": [
                {"required": ["command"], "properties": dict.fromkeys(_REMOTE_ONLY, False)},
                {"required": ["url"], "properties": dict.fromkeys(_STDIO_ONLY, False)},
            ]
        },
    )

    command: str | None = Field(default=None, min_length=1)
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    type: Literal["streamable_http", "sse"] | None = None
    enabled: bool = True
    sandbox: Annotated[SandboxSection | None, BeforeValidator(_true_means_default_policy)] = Field(
        default=None, json_schema_extra=_boolean_or_table
    )

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str | None) -> str | None:
        # A URL built from placeholders (`${MCP_URL}`) can only be checked once they are filled in.
        if url is not None and "${" not in url:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ValueError(f"{url!r} is not an http:// or https:// URL")
        return url

    @model_validator(mode="after")
    def _stdio_or_remote(self) -> ServerSection:
        given = self.model_fields_set
        if self.command is None and self.url is None:
            raise PydanticCustomError(
                "server_kind", "a server needs 'command' (a stdio server) or 'url' (a remote server)"
            )
        if self.command is not None and self.url is not None:
            raise PydanticCustomError(
                "server_kind",
                "a server has either 'command' (a stdio server) or 'url' (a remote server), not both",
                {"key": "url"},
            )
        if self.url is not None:
            for key in _STDIO_ONLY:
                if key in given:
                    raise PydanticCustomError(
                        "server_kind",
                        "'{key}' is for stdio servers (with 'command'), and this is a url server, which "
                        "ipybox does not start",
                        {"key": key},
                    )
        else:
            for key in _REMOTE_ONLY:
                if key in given:
                    raise PydanticCustomError(
                        "server_kind",
                        "'{key}' is for url servers, and this is a stdio server (with 'command')",
                        {"key": key},
                    )
        return self

    @property
    def is_stdio(self) -> bool:
        """Whether ipybox starts the server (`command`) rather than connecting to it (`url`)."""
        return self.command is not None

    def sandbox_policy(self) -> SandboxSection | None:
        """The sandbox a stdio server runs in, or `None` when it runs unsandboxed."""
        return self.sandbox if self.sandbox is not None and self.sandbox.enabled else None

    def server_params(self, workspace_dir: Path | None = None) -> dict[str, Any]:
        """The server's parameters as `ipybox.mcp_client` and `generate_mcp_sources` take them, with
        `${VAR}` placeholders left in.

        Args:
            workspace_dir: The workspace directory: when given, a stdio server's `cwd` is resolved against
                it (and defaults to it).

        Returns:
            `{"command", "args"[, "env"][, "cwd"][, "sandbox"]}` for a stdio server (`sandbox`: the policy
            in the published format), `{"url"[, "headers"][, "type"]}` for a remote one.
        """
        params: dict[str, Any]
        if self.command is not None:
            params = {"command": self.command, "args": list(self.args)}
            if self.env:
                params["env"] = dict(self.env)
            cwd = self.cwd
            if workspace_dir is not None:
                cwd = str(workspace_dir / cwd) if cwd is not None else str(workspace_dir)
            if cwd is not None:
                params["cwd"] = cwd
            if (sandbox := self.sandbox_policy()) is not None:
                params["sandbox"] = sandbox.policy().model_dump(by_alias=True)
            return params
        params = {"url": self.url}
        if self.headers:
            params["headers"] = dict(self.headers)
        if self.type is not None:
            params["type"] = self.type
        return params
