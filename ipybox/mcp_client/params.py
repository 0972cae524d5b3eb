"""MCP server parameters: the one model of "which server, and how to start or reach it".

Every place that takes server parameters validates them with the models here, so they accept and reject
the same things and spell them the same way:

- the published `server_params` dicts (`generate_mcp_sources`, `CodeExecutor(mcp_servers=...)`,
  `MCPConnection`): [parse_server_params][ipybox.mcp_client.params.parse_server_params];
- `[servers.<name>]` of `ipybox.toml` (`ipybox.config.servers` adds `enabled` and nothing else);
- `register_mcp_server` (`ipybox.mcp_server.registration` writes the dump of what it parsed);
- the host's server registry (`ipybox.mcp_client.registry` stores the dump, and loads it back here).

`ServerParams` is a discriminated union, decided by which key is given: `command` -> a stdio server
(`StdioServerParams`), `url` -> a remote one (`HttpServerParams`) over streamable HTTP or SSE. The remote
transport is a field (`type`, optional), not a third member: with `url = "${MCP_URL}"` the URL path that
picks the default transport is only known once placeholders are filled in, on the host, when the server
starts; so `HttpServerParams.transport` decides it then.

The contract:

- Unresolved parameters keep their `${VAR}` placeholders; they are validated as they are (a URL made of
  placeholders is checked once they are filled in). `parse_server_params` fills them in, from the
  environment, then the `.env` file, and validates the result: the only `${VAR}` resolver.
- `dump_server_params` is the dict form: only the keys given (so it is what the user wrote, normalised:
  a transport alias such as `"http"` becomes `"streamable_http"`, `sandbox` stays `true` when given as a
  flag). Validating a dump gives the same model back.
- A server's name becomes the Python package `mcptools/<name>`: `check_server_name` is the one check.
- `call_timeout` and `max_result_size` bound each tool call, for both kinds; left out, they are the tool
  server's (`DEFAULT_CALL_TIMEOUT`, `DEFAULT_MAX_RESULT_SIZE`). A change to them is a change of the
  server's parameters (the workspace restarts the server).
- `limits` (stdio servers only) bounds the server's process tree: the keys of `[kernel.limits]`
  (`ipybox.limits.ResourceLimits`), and none by default: a server is a third-party program whose needs
  ipybox can't guess, unlike a kernel. `tmp` sizes a sandboxed server's private `/tmp`, so it is an error
  on a server that is not sandboxed (it would share the host's `/tmp`, which can't be sized).

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

import keyword
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, TypeAlias
from urllib.parse import urlsplit

from dotenv import dotenv_values
from pydantic import (
    BaseModel,
    BeforeValidator,
    ByteSize,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_serializer,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails, PydanticCustomError

from ipybox.limits.spec import ResourceLimits
from ipybox.mcp_client.errors import ServerParamsError
from ipybox.sandbox.policy import SandboxPolicy

Transport = Literal["streamable_http", "sse"]

PLACEHOLDER = re.compile(r"\$\{([^}]*)\}")
"""A `${VAR}` placeholder; group 1 is the variable's name."""
_VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Spellings of the transports that other MCP clients use; stored as the canonical one. ipybox 0.9 took
# any `type` for a URL containing `/mcp` (streamable HTTP), so `"http"` there kept working.
_TRANSPORT_ALIASES: dict[str, Transport] = {
    "streamable_http": "streamable_http",
    "streamable-http": "streamable_http",
    "streamablehttp": "streamable_http",
    "http": "streamable_http",
    "sse": "sse",
}

STDIO_TRANSPORT = "stdio"
"""The `type` of a server with `command`, as `.mcp.json`, VS Code and Cursor spell it."""

# Union tags: not keys of a server's table, so a tag in an error's location never matches one.
STDIO_TAG = "stdio"
HTTP_TAG = "http"

_NOT_IDENTIFIER = re.compile(r"[^A-Za-z0-9_]")
_KEYWORDS = "|".join(keyword.kwlist)
SERVER_NAME_PATTERN = rf"^(?!(?:{_KEYWORDS})$)[A-Za-z_][A-Za-z0-9_]*$"
"""Valid server names, as a JSON Schema pattern: ASCII identifiers that are not Python keywords."""

DEFAULT_CALL_TIMEOUT = 300.0
"""Seconds a tool call waits for its server's answer unless the server's `call_timeout` says otherwise.

Longer than a cell's default time limit (`[kernel] timeout = 120`), so in the common case the cell's
timeout speaks first, and equal to the read timeout the HTTP transports always had; what it bounds is the
host side: a server that never answers no longer holds the call (and the tool server's memory for it)
after the kernel gave up. Servers that legitimately work longer raise it in their parameters."""

DEFAULT_MAX_RESULT_SIZE = 64 * 1024 * 1024
"""Bytes of one message (a tool's answer, as the server sends it) unless the server's `max_result_size`
says otherwise: 64 MiB, far above what a tool result meant for code should be, and low enough that a few
concurrent ones can't exhaust the host's memory."""

MIN_RESULT_SIZE = 64 * 1024
"""The smallest `max_result_size` a server's parameters may set: the limit applies to every message the
server sends (its handshake and tool listing too), and those must fit."""

_BYTE_SIZE: TypeAdapter[ByteSize] = TypeAdapter(ByteSize)


def _byte_size(value: Any) -> Any:
    # pydantic's own message ("could not parse value and unit from byte string") does not say what to write.
    if isinstance(value, str):
        try:
            return _BYTE_SIZE.validate_python(value)
        except ValidationError:
            raise PydanticCustomError(
                "byte_size",
                'expected a size: bytes (an integer), or a number with a unit such as "64MiB" or "500KB"',
            ) from None
    return value


ResultSize = Annotated[
    ByteSize,
    BeforeValidator(_byte_size),
    Field(ge=MIN_RESULT_SIZE),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer", "minimum": MIN_RESULT_SIZE},
                {"type": "string", "pattern": r"^\s*\d*\.?\d+\s*[A-Za-z]*\s*$"},
            ]
        }
    ),
]
"""A size in bytes: an integer, or a number with a unit (`"64MiB"`, `"500KB"`, `"1GB"`)."""


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


def check_http_url(url: str) -> str:
    """Return `url` if it is an `http://` or `https://` URL, else raise `ValueError`. A URL with `${VAR}`
    placeholders passes: it can only be checked once they are filled in."""
    if PLACEHOLDER.search(url) is None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"{url!r} is not an http:// or https:// URL")
    return url


class ServerSandbox(SandboxPolicy):
    """A sandbox switch with a policy: a stdio server's `sandbox` (and, extended by its documentation,
    `[sandbox]` of `ipybox.toml`). Keys as in `SandboxPolicy` (camelCase; snake_case accepted too).

    Attributes:
        enabled: Whether to sandbox at all.
        filesystem: Paths (absolute, `~/...` or relative to the server's `cwd`) to hide (`denyRead`), to
            make writable (`allowWrite`) or to keep read-only (`denyWrite`), on top of the defaults.
        network: Hosts the server may reach through ipybox's filtering proxy (`allowedDomains`; none by
            default) and hosts it never may (`deniedDomains`, which wins).
    """

    enabled: bool = True

    def policy(self) -> SandboxPolicy:
        """The policy alone (without `enabled`), as the sandbox takes it."""
        return SandboxPolicy(filesystem=self.filesystem, network=self.network)


def _flag_means_default_policy(value: Any) -> Any:
    # `true` is shorthand for the default policy, `false` for a disabled one.
    return {"enabled": value} if isinstance(value, bool) else value


def _boolean_or_table(schema: dict[str, Any]) -> None:
    # The field validates as `ServerSandbox | None`; it may also be given as `true` or `false`.
    table = next(option for option in schema.pop("anyOf") if option.get("type") != "null")
    schema.pop("default", None)
    schema["anyOf"] = [{"type": "boolean"}, table]


def _normalise_transport(value: Any) -> Any:
    if isinstance(value, str) and value.lower() == STDIO_TRANSPORT:
        raise PydanticCustomError(
            "server_type",
            "'stdio' is the type of a server with 'command', and this one has 'url' (a remote server): "
            "remove type, or write 'streamable_http' or 'sse'",
        )
    return _TRANSPORT_ALIASES.get(value.lower(), value) if isinstance(value, str) else value


def _stdio_type(value: Any) -> Any:
    # `.mcp.json`, VS Code and Cursor write `"type": "stdio"` next to `command`: the same server, said twice.
    if not isinstance(value, str):
        return value
    if value.lower() == STDIO_TRANSPORT:
        return STDIO_TRANSPORT
    if value.lower() in _TRANSPORT_ALIASES:
        raise PydanticCustomError(
            "server_type",
            "'{given}' is a remote transport, and this server has 'command' (a stdio server, which ipybox "
            "starts): give 'url' instead of 'command' for a remote server, or write type = 'stdio' (or no "
            "type)",
            {"given": value},
        )
    raise PydanticCustomError(
        "server_type",
        "'{given}' is not a transport: a server with 'command' is type = 'stdio' (or has no type)",
        {"given": value},
    )


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @property
    def is_stdio(self) -> bool:
        """Whether ipybox starts the server (`command`) rather than connecting to it (`url`)."""
        return isinstance(self, StdioServerParams)

    def sandbox_policy(self) -> SandboxPolicy | None:
        """The sandbox the server runs in, `None` when it runs unsandboxed (always, for a remote one)."""
        return None


def _wrong_kind(data: Any, keys: tuple[str, ...], message: str) -> None:
    if isinstance(data, Mapping):
        for key in keys:
            if key in data:
                raise PydanticCustomError("server_kind", message, {"key": key})


class StdioServerParams(_Params):
    """A local MCP server, started as a process that speaks MCP over its stdin and stdout.

    Attributes:
        command: Executable to run (looked up on `PATH`).
        args: Command-line arguments.
        env: Extra environment variables for the process, merged over a minimal safe environment
            (`HOME`, `PATH`, ...), as the `mcp` SDK does.
        cwd: Working directory of the process; defaults to the current one.
        sandbox: Run the process in a sandbox of its own: `True` for the default policy (read everything
            but secrets, write only `cwd`, no network), or a policy of its own in the sandbox policy
            format (e.g. `{"network": {"allowedDomains": ["api.github.com"]}}`), which may say
            `"enabled": False`.
        call_timeout: Seconds a tool call waits for the server's answer; then it fails with
            `CallTimeoutError` and the server is sent `notifications/cancelled` (the connection stays up).
            Default: the tool server's (`DEFAULT_CALL_TIMEOUT`, 300 s).
        max_result_size: The largest message the server may send (a tool's answer as it is sent), in
            bytes or with a unit (`"64MiB"`, `"500KB"`); a larger answer is read past, never held, and
            the call fails with `ResultTooLargeError`. At least 64 KiB. Default: the tool server's
            (`DEFAULT_MAX_RESULT_SIZE`, 64 MiB).
        limits: What the server's process and everything it starts may use, with the keys of
            `[kernel.limits]` (e.g. `{"memory": "512MiB", "processes": 32}`; `tmp` only with `sandbox`).
            Default: none. A server killed for going over its memory limit fails the call that was running
            with `ServerMemoryLimitError`, and starts again on the next call.
        type: `"stdio"`, as other MCP clients' configurations write it next to `command`; optional, and
            the only value a server with `command` takes (a remote transport there is an error).
    """

    command: str = Field(min_length=1)
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    sandbox: Annotated[ServerSandbox | None, BeforeValidator(_flag_means_default_policy)] = Field(
        default=None, json_schema_extra=_boolean_or_table
    )
    call_timeout: float | None = Field(default=None, gt=0)
    max_result_size: ResultSize | None = None
    limits: ResourceLimits | None = None
    type: Annotated[Literal["stdio"] | None, BeforeValidator(_stdio_type)] = None

    @field_validator("limits")
    @classmethod
    def _tmp_needs_the_sandbox(cls, limits: ResourceLimits | None, info: ValidationInfo) -> Any:
        # `sandbox` is validated before `limits` (field order); when it failed, that is the error to fix.
        if limits is None or limits.tmp is None or "sandbox" not in info.data:
            return limits
        sandbox = info.data["sandbox"]
        if sandbox is None or not sandbox.enabled:
            raise PydanticCustomError(
                "server_limits",
                "tmp sizes the private /tmp of a sandboxed server, and this server is not sandboxed (it "
                "shares the host's /tmp, which can't be sized): set sandbox = true, or remove tmp",
                {"key": "tmp"},
            )
        return limits

    @model_validator(mode="before")
    @classmethod
    def _stdio_keys_only(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "command" not in data and "url" not in data:
            # Neither kind (the union sends this member): a misspelt `command` is what to point out.
            unknown = [key for key in data if key not in cls.model_fields and key not in HTTP_KEYS]
            if unknown:
                raise PydanticCustomError(
                    "extra_forbidden", "Extra inputs are not permitted", {"key": unknown[0]}
                )
            raise PydanticCustomError("server_kind", _NEITHER)
        if isinstance(data, Mapping) and "url" in data:
            raise PydanticCustomError(
                "server_kind",
                "a server has either 'command' (a stdio server) or 'url' (a remote server), not both",
                {"key": "url"},
            )
        _wrong_kind(
            data,
            HTTP_ONLY_KEYS,
            "'{key}' is for url servers, and this is a stdio server (with 'command')",
        )
        return data

    @field_serializer("sandbox")
    def _sandbox_as_given(self, sandbox: ServerSandbox | None) -> Any:
        # `true`/`false` stay flags; a policy is written with only the keys it was given.
        if sandbox is None:
            return None
        if sandbox.model_fields_set <= {"enabled"}:
            return sandbox.enabled
        return sandbox.model_dump(by_alias=True, exclude_unset=True)

    @field_serializer("limits")
    def _limits_as_given(self, limits: ResourceLimits | None) -> Any:
        # The keys given, in bytes; "unlimited" (None) is what no key means for a server, and TOML has no null.
        if limits is None:
            return None
        return limits.model_dump(mode="json", exclude_unset=True, exclude_none=True)

    def sandbox_policy(self) -> SandboxPolicy | None:
        return self.sandbox.policy() if self.sandbox is not None and self.sandbox.enabled else None


class HttpServerParams(_Params):
    """A remote MCP server, reached over streamable HTTP or SSE.

    Attributes:
        url: Endpoint URL (`http` or `https`).
        headers: HTTP headers sent with every request (e.g. `Authorization`).
        type: Transport, `streamable_http` or `sse` (`http`, `streamable-http` and `streamablehttp` are
            taken for `streamable_http`); default: see `transport`. `stdio` is an error (that is a server
            with `command`).
        call_timeout: Seconds a tool call waits for the server's answer, as for a stdio server.
        max_result_size: The largest tool answer, as for a stdio server (checked once it is read: an
            HTTP response is not read past).
    """

    url: str

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        return check_http_url(url)

    headers: dict[str, str] = Field(default_factory=dict)
    type: Annotated[Transport | None, BeforeValidator(_normalise_transport)] = None
    call_timeout: float | None = Field(default=None, gt=0)
    max_result_size: ResultSize | None = None

    @model_validator(mode="before")
    @classmethod
    def _url_keys_only(cls, data: Any) -> Any:
        _wrong_kind(
            data,
            STDIO_ONLY_KEYS,
            "'{key}' is for stdio servers (with 'command'), and this is a url server, which ipybox does "
            "not start",
        )
        return data

    @property
    def transport(self) -> Transport:
        """The transport: `type` if given, else `sse` for URLs whose path contains `/sse`, else
        streamable HTTP (the published rule: `/mcp` means streamable HTTP, `/sse` means SSE)."""
        if self.type is not None:
            return self.type
        return "sse" if "/sse" in urlsplit(self.url).path else "streamable_http"


STDIO_ONLY_KEYS = ("args", "env", "cwd", "sandbox", "limits")
HTTP_ONLY_KEYS = ("headers",)
STDIO_KEYS = tuple(StdioServerParams.model_fields)
"""The keys of a stdio server's parameters, in documentation order."""
HTTP_KEYS = tuple(HttpServerParams.model_fields)
"""The keys of a remote server's parameters, in documentation order."""

_NEITHER = "a server needs 'command' (a stdio server) or 'url' (a remote server)"
_NOT_A_TABLE = "server parameters are a table (a dict): 'command' and its keys, or 'url' and its keys"


def server_kind(value: Any) -> str | None:
    """The union tag of server parameters: `http` with `url` and without `command`, else `stdio` (whose
    check says "not both", or names what is missing or misspelt); `None` for what is not a mapping."""
    if isinstance(value, BaseModel):
        return STDIO_TAG if isinstance(value, StdioServerParams) else HTTP_TAG
    if isinstance(value, Mapping):
        return HTTP_TAG if "url" in value and "command" not in value else STDIO_TAG
    return None


def server_union(stdio: type[StdioServerParams], http: type[HttpServerParams]) -> Any:
    """The discriminated union of a stdio and a remote server model (`ipybox.config` adds `enabled` to
    both): validation picks the member by `server_kind` and reports only that member's problems."""
    return Annotated[
        Annotated[stdio, Tag(STDIO_TAG)] | Annotated[http, Tag(HTTP_TAG)],
        Discriminator(server_kind, custom_error_type="server_kind", custom_error_message=_NOT_A_TABLE),
    ]


ServerParams: TypeAlias = StdioServerParams | HttpServerParams
"""Validated server parameters (validate with `validate_server_params` or `parse_server_params`)."""

_SERVER_PARAMS: TypeAdapter[ServerParams] = TypeAdapter(server_union(StdioServerParams, HttpServerParams))


def error_key(loc: tuple[int | str, ...]) -> str:
    """An error's location in server parameters as a dotted key (`env.API_KEY`), without the union tag."""
    parts = list(loc)
    if parts and parts[0] in (STDIO_TAG, HTTP_TAG):
        parts.pop(0)
    return ".".join(str(part) for part in parts)


def problem_items(errors: list[ErrorDetails]) -> list[tuple[str, str]]:
    """`(key, message)` of each of pydantic's `errors` of a server's parameters: the dotted key (`""` for
    the whole table), with the key a validator blamed (`ctx["key"]`) added, and the message without
    pydantic's "Value error, " prefix."""
    items = []
    for error in errors:
        key = error_key(tuple(error["loc"]))
        if (blamed := (error.get("ctx") or {}).get("key")) is not None:
            key = f"{key}.{blamed}" if key else str(blamed)
        items.append((key, error["msg"].removeprefix("Value error, ")))
    return items


def describe_problems(errors: list[ErrorDetails]) -> str:
    """`errors` as one line: `key: message; ...`."""
    return "; ".join(f"{key}: {message}" if key else message for key, message in problem_items(errors))


def validate_server_params(server_name: str, server_params: Any) -> ServerParams:
    """Validate server parameters as they are (`${VAR}` placeholders kept).

    Raises:
        ServerParamsError: They are not a dict, or not valid (every problem named by its key).
    """
    if not isinstance(server_params, Mapping | StdioServerParams | HttpServerParams):
        raise ServerParamsError(
            server_name, f"server_params must be a dict, got {type(server_params).__name__}"
        )
    try:
        return _SERVER_PARAMS.validate_python(server_params)
    except ValidationError as e:
        raise ServerParamsError(
            server_name, f"invalid server_params: {describe_problems(e.errors())}"
        ) from None


def server_params_adapter() -> TypeAdapter[ServerParams]:
    """The validator of the published dict form, for callers that report its errors their own way."""
    return _SERVER_PARAMS


def dump_server_params(params: ServerParams) -> dict[str, Any]:
    """The dict form of `params`: the keys that were given, normalised, JSON- and TOML-ready. It
    validates to `params` again."""
    dumped: dict[str, Any] = params.model_dump(mode="json", by_alias=True, exclude_unset=True)
    return dumped


def parse_server_params(
    server_name: str,
    server_params: Mapping[str, Any] | ServerParams,
    *,
    environ: Mapping[str, str] | None = None,
    dotenv_path: Path | None = None,
) -> ServerParams:
    """Validate `server_params` and replace its `${VAR}` placeholders.

    Placeholders may appear in any string value (command, args, env values, url, header values).
    A variable is looked up in `environ` (default: `os.environ`) first, then in the `.env` file.

    Args:
        server_name: Name of the server, used in error messages.
        server_params: `{"command", "args", "env", "cwd", "sandbox"}` for a stdio server, or
            `{"url", "headers", "type"}` for an HTTP server (or parameters validated already).
        environ: Environment to resolve placeholders from; defaults to `os.environ`.
        dotenv_path: A `.env` file consulted for variables missing from `environ`; ignored if it does
            not exist.

    Raises:
        ServerParamsError: The parameters are invalid, or a referenced variable is not set.
    """
    unresolved = validate_server_params(server_name, server_params)
    resolver = _Resolver(server_name, os.environ if environ is None else environ, dotenv_path)
    return validate_server_params(server_name, resolver.resolve(dump_server_params(unresolved), ""))


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
            return PLACEHOLDER.sub(lambda m: self._lookup(m.group(1), where), value)
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
