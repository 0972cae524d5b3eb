"""Server parameters: validating the published `server_params` dicts into typed models, detecting the
HTTP transport, and resolving `${VAR}` placeholders from the environment and a `.env` file.

Example:
    ```python
    params = parse_server_params(
        "github",
        {"url": "https://api.githubcopilot.com/mcp/", "headers": {"Authorization": "Bearer ${GITHUB_TOKEN}"}},
        environ={"GITHUB_TOKEN": "secret"},
    )
    assert isinstance(params, HttpServerParams) and params.transport == "streamable_http"
    ```
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, TypeAlias
from urllib.parse import urlsplit

from dotenv import dotenv_values
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from ipybox.mcp_client.errors import ServerParamsError
from ipybox.sandbox.policy import SandboxPolicy

Transport = Literal["streamable_http", "sse"]

_PLACEHOLDER = re.compile(r"\$\{([^}]*)\}")
_VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TRANSPORT_ALIASES: dict[str, Transport] = {
    "streamable_http": "streamable_http",
    "streamable-http": "streamable_http",
    "streamablehttp": "streamable_http",
    "http": "streamable_http",
    "sse": "sse",
}


class StdioServerParams(BaseModel):
    """A local MCP server, started as a process that speaks MCP over its stdin and stdout.

    Attributes:
        command: Executable to run (looked up on `PATH`).
        args: Command-line arguments.
        env: Extra environment variables for the process, merged over a minimal safe environment
            (`HOME`, `PATH`, ...), as the `mcp` SDK does.
        cwd: Working directory of the process; defaults to the current one.
        sandbox: Run the process in its own bubblewrap sandbox (Linux): `True` for the default policy
            (read everything but secrets, write only `cwd`, no network), or a policy of its own in the
            sandbox policy format (e.g. `{"network": {"allowedDomains": ["api.github.com"]}}`).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    command: Annotated[str, Field(min_length=1)]
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] | None = None
    cwd: str | None = None
    sandbox: SandboxPolicy | None = None

    @field_validator("sandbox", mode="before")
    @classmethod
    def _sandbox_flag(cls, value: Any) -> Any:
        # `true`/`false` stand for the default policy/no sandbox; a policy is validated as one.
        if isinstance(value, bool):
            return SandboxPolicy() if value else None
        return value


class HttpServerParams(BaseModel):
    """A remote MCP server, reached over streamable HTTP or SSE.

    Attributes:
        url: Endpoint URL (`http` or `https`).
        headers: HTTP headers sent with every request (e.g. `Authorization`).
        type: Transport as given by the application, if any; see `transport`.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str
    headers: dict[str, str] | None = None
    type: str | None = None

    @field_validator("url")
    @classmethod
    def _check_url(cls, url: str) -> str:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"{url!r} is not an http:// or https:// URL")
        return url

    @field_validator("type")
    @classmethod
    def _check_type(cls, value: str | None) -> str | None:
        if value is not None and value.lower() not in _TRANSPORT_ALIASES:
            raise ValueError(f"unknown transport {value!r} (expected 'streamable_http' or 'sse')")
        return value

    @property
    def transport(self) -> Transport:
        """The transport: `type` if given, else `sse` for URLs whose path contains `/sse`, else
        streamable HTTP (the published rule: `/mcp` means streamable HTTP, `/sse` means SSE)."""
        if self.type is not None:
            return _TRANSPORT_ALIASES[self.type.lower()]
        return "sse" if "/sse" in urlsplit(self.url).path else "streamable_http"


ServerParams: TypeAlias = StdioServerParams | HttpServerParams

_STDIO = TypeAdapter(StdioServerParams)
_HTTP = TypeAdapter(HttpServerParams)


def parse_server_params(
    server_name: str,
    server_params: Mapping[str, Any],
    *,
    environ: Mapping[str, str] | None = None,
    dotenv_path: Path | None = None,
) -> ServerParams:
    """Validate `server_params` and replace its `${VAR}` placeholders.

    Placeholders may appear in any string value (command, args, env values, url, header values).
    A variable is looked up in `environ` (default: `os.environ`) first, then in the `.env` file.

    Args:
        server_name: Name of the server, used in error messages.
        server_params: `{"command", "args", "env", "cwd"}` for a stdio server, or
            `{"url", "headers", "type"}` for an HTTP server.
        environ: Environment to resolve placeholders from; defaults to `os.environ`.
        dotenv_path: A `.env` file consulted for variables missing from `environ`; ignored if it does
            not exist.

    Raises:
        ServerParamsError: The parameters are invalid, or a referenced variable is not set.
    """
    if not isinstance(server_params, Mapping):
        raise ServerParamsError(
            server_name, f"server_params must be a dict, got {type(server_params).__name__}"
        )
    has_command, has_url = "command" in server_params, "url" in server_params
    if has_command == has_url:
        raise ServerParamsError(
            server_name,
            "server_params must have either 'command' (stdio server) or 'url' (HTTP server)"
            + (", not both" if has_command else ""),
        )
    resolver = _Resolver(server_name, os.environ if environ is None else environ, dotenv_path)
    resolved = resolver.resolve(dict(server_params), "")
    adapter: TypeAdapter[StdioServerParams] | TypeAdapter[HttpServerParams] = _STDIO if has_command else _HTTP
    try:
        return adapter.validate_python(resolved)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'server_params'}: {err['msg']}" for err in e.errors()
        )
        raise ServerParamsError(server_name, f"invalid server_params: {problems}") from None


def resolve_placeholders(
    values: Mapping[str, str],
    *,
    environ: Mapping[str, str] | None = None,
    dotenv_path: Path | None = None,
) -> dict[str, str]:
    """Replace `${VAR}` placeholders in `values` (e.g. a kernel's environment) as in server parameters.

    Raises:
        ValueError: A referenced variable is not set (the message names it and where it is used).
    """
    try:
        resolved: dict[str, str] = _Resolver(
            "", os.environ if environ is None else environ, dotenv_path
        ).resolve(dict(values), "")
    except ServerParamsError as e:
        raise ValueError(e.detail) from None
    return resolved


class _Resolver:
    def __init__(self, server_name: str, environ: Mapping[str, str], dotenv_path: Path | None) -> None:
        self._server_name = server_name
        self._environ = environ
        self._dotenv_path = dotenv_path
        self._dotenv: dict[str, str] | None = None

    def resolve(self, value: Any, where: str) -> Any:
        if isinstance(value, str):
            return _PLACEHOLDER.sub(lambda m: self._lookup(m.group(1), where), value)
        if isinstance(value, Mapping):
            return {k: self.resolve(v, f"{where}.{k}" if where else str(k)) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.resolve(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return value

    def _lookup(self, name: str, where: str) -> str:
        if not _VAR_NAME.fullmatch(name):
            raise ServerParamsError(self._server_name, f"invalid placeholder ${{{name}}} in {where}")
        value = self._environ.get(name)
        if value is None:
            value = self._dotenv_values().get(name)
        if value is None:
            source = f" or in {self._dotenv_path}" if self._dotenv_path is not None else ""
            raise ServerParamsError(
                self._server_name,
                f"environment variable {name} is not set (referenced by ${{{name}}} in {where}): "
                f"set it in the environment{source}",
            )
        return value

    def _dotenv_values(self) -> dict[str, str]:
        if self._dotenv is None:
            path = self._dotenv_path
            values = dotenv_values(path) if path is not None and path.is_file() else {}
            self._dotenv = {k: v for k, v in values.items() if v is not None}
        return self._dotenv
