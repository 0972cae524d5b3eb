"""`load_config()`: reading a workspace's `ipybox.toml` into a `WorkspaceConfig`, with every problem
reported as `file:line:column: reason`.

`tomllib` parses the file (strict TOML 1.0; its syntax errors carry line and column). Validation errors
are placed by key: `positions.key_positions` finds where each key is written, and a value that came
from the environment or `.env` is blamed on its variable instead.

Any file content gives a `ConfigError`, never another exception: `validate`, `status` and `down` read the
file, and a traceback there (a `RecursionError` for `x = [[[...` 100,000 deep) left a running workspace
that could not be stopped until the file was fixed. So before `tomllib` sees it, the file must be a
regular file (a FIFO would block the reader) of at most `MAX_CONFIG_CHARS` characters that nests at most
`MAX_NESTING` levels (`positions.too_deep`; `tomllib` recurses per level, and its work on a dotted key
grows with the square of its parts).
"""

from __future__ import annotations

import os
import re
import stat
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails
from pydantic_settings import DotEnvSettingsSource, EnvSettingsSource
from pydantic_settings.exceptions import SettingsError

from ipybox.config.admin_policy import domain_allowed, read_admin_policy
from ipybox.config.diagnostics import ValueSource, in_file, problems_from_errors
from ipybox.config.errors import ConfigError, ConfigProblem
from ipybox.config.positions import KeyPath, key_positions, too_deep
from ipybox.config.secrets import command_problem
from ipybox.config.server_catalog import fill_workspace
from ipybox.config.workspace_config import ENV_NESTED_DELIMITER, ENV_PREFIX, OwnSettingsOnly, WorkspaceConfig
from ipybox.mcp_client.placeholders import placeholder_names
from ipybox.sandbox.domains import covers

CONFIG_FILE = "ipybox.toml"

MAX_CONFIG_CHARS = 1 << 20
"""The longest `ipybox.toml` read (an ipybox.toml is a few kilobytes)."""

MAX_NESTING = 32
"""The deepest nesting of arrays and inline tables, and the most parts of a dotted key or table name
(ipybox.toml needs a handful of either)."""

_TOML_ERROR_PLACE = re.compile(r"\s*\(at line (\d+), column (\d+)\)$")
_DOTENV_ASSIGNMENT = re.compile(r"\s*(?:export\s+)?([^\s=#]+)\s*=")


def load_config(path: str | Path) -> WorkspaceConfig:
    """Read a workspace's configuration: `ipybox.toml`, then `IPYBOX_*` variables from the workspace's
    `.env` and the environment over it (see the module's documentation for the precedence).

    Args:
        path: The `ipybox.toml` file, or the workspace directory containing it.

    Raises:
        ConfigError: The file is missing or unreadable, is not valid TOML, nests deeper than `MAX_NESTING`,
            or has unknown keys or values that don't fit; every problem is listed with its file, line and
            column. Loading raises nothing else, whatever the file holds.

    Example:
        ```python
        config = load_config("example-workspace")
        assert config.sandbox.enabled and "filesystem" in config.servers
        ```
    """
    path = Path(path)
    if path.is_dir():
        path = path / CONFIG_FILE
    return load_config_text(path, _read(path))


def load_config_text(path: Path, source: str) -> WorkspaceConfig:
    """Like `load_config`, with `source` as the text of the file `path` (which need not exist: what a
    file about to be written would load as, with the workspace's `.env` and the environment over it).

    Raises:
        ConfigError: As `load_config`.
    """
    deep = too_deep(source, MAX_NESTING)
    if deep is not None:
        (line, column), what = deep
        raise ConfigError(
            path, [ConfigProblem(str(path), line, column, f"{what}: an {CONFIG_FILE} needs a few")]
        )
    try:
        return _load(path, source)
    except RecursionError:  # a backstop: `too_deep` keeps every known recursion far from the limit
        reason = f"nested too deeply to read (more than {MAX_NESTING} levels is never needed)"
        raise ConfigError(path, [ConfigProblem(str(path), None, None, reason)]) from None


def _load(path: Path, source: str) -> WorkspaceConfig:
    try:
        data = tomllib.loads(source)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(path, [_syntax_problem(path, e)]) from None
    data = _with_workspace(data, path.parent.resolve())
    dotenv_path = path.parent / ".env"
    dotenv = dotenv_path if dotenv_path.is_file() else None
    # Keys like `_env_file` would reach BaseSettings as its options, not as settings.
    reserved = [key for key in data if key.startswith("_")]
    try:
        if reserved:
            raise _unknown_keys(reserved, data)
        # mypy knows the fields as __init__'s arguments, not BaseSettings' own `_env_file`.
        config = WorkspaceConfig(_env_file=dotenv, **data)  # type: ignore[call-arg]
        _check_across_tables(config, path.parent.resolve())
        config = _under_admin_tiers(config, path.parent.resolve())
    except ValidationError as e:
        raise ConfigError(path, _problems(e.errors(), path, source, data, dotenv)) from None
    except SettingsError as e:
        raise ConfigError(path, [_unparsable_variable(e, dotenv)]) from None
    except UnicodeDecodeError as e:
        reason = f"not UTF-8 text ({e.reason} at byte {e.start}): save it as UTF-8"
        raise ConfigError(path, [ConfigProblem(str(dotenv), None, None, reason)]) from None
    config._path = path.resolve()
    return config


def _with_workspace(data: dict[str, Any], root: Path) -> dict[str, Any]:
    """`data` with the workspace placeholders of its approval rules (`{workspace}`, `{workspace_glob}`,
    `{workspace_regex}`: `ipybox.config.server_catalog`) filled in for `root`, so that rules written with
    them (by `ipybox init`, by the rule writer) hold in whichever directory the file is."""
    approval = data.get("approval")
    if not isinstance(approval, dict) or not isinstance(approval.get("rules"), list):
        return data
    rules = [fill_workspace(rule, root) for rule in approval["rules"]]
    return {**data, "approval": {**approval, "rules": rules}}


def _read(path: Path) -> str:
    try:
        # Non-blocking: opening a FIFO for reading would wait for a writer.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            mode = os.fstat(fd).st_mode
            if stat.S_ISDIR(mode):
                reason = "is a directory"
            elif not stat.S_ISREG(mode):
                reason = f"not a regular file: {CONFIG_FILE} must be a text file"
            else:
                with open(fd, encoding="utf-8", closefd=False) as file:
                    text = file.read(MAX_CONFIG_CHARS + 1)
                if len(text) <= MAX_CONFIG_CHARS:
                    return text
                reason = f"longer than {MAX_CONFIG_CHARS} characters (an {CONFIG_FILE} is a few kilobytes)"
        finally:
            os.close(fd)
    except FileNotFoundError:
        reason = f"no such file: create {CONFIG_FILE} (`ipybox init` writes one)"
    except IsADirectoryError:
        reason = "is a directory"
    except UnicodeDecodeError as e:
        reason = f"not UTF-8 text: {e.reason} at byte {e.start}"
    except OSError as e:
        reason = e.strerror or str(e)
    raise ConfigError(path, [ConfigProblem(str(path), None, None, reason)])


def _syntax_problem(path: Path, error: tomllib.TOMLDecodeError) -> ConfigProblem:
    message = str(error)
    place = _TOML_ERROR_PLACE.search(message)
    if place is None:
        return ConfigProblem(str(path), None, None, f"not valid TOML: {message}")
    reason = f"not valid TOML: {message[: place.start()]}"
    return ConfigProblem(str(path), int(place.group(1)), int(place.group(2)), reason)


def _check_across_tables(config: WorkspaceConfig, root: Path) -> None:
    """What one table says about another, reported at the key that can't hold (as a `ValidationError`, so it
    is placed like the rest)."""
    limits = config.kernel.limits
    if config.kernel.gateway is not None:
        _check_remote_kernels(config)
    if config.secrets:
        _check_secrets(config, root)
    if limits.tmp is not None and "tmp" in limits.model_fields_set and not config.sandbox.enabled:
        _refuse(
            ("kernel", "limits", "tmp"),
            limits.tmp,
            "[kernel.limits] tmp sizes the private /tmp of sandboxed kernels, and [sandbox] enabled = false: "
            'unsandboxed kernels share the host\'s /tmp. Remove tmp, or set it to "unlimited"',
        )


def _under_admin_tiers(config: WorkspaceConfig, root: Path) -> WorkspaceConfig:
    """`config` with the admin tiers' rules (`ipybox.config.admin_policy`), once it meets their sandbox
    minimums (else a `ValidationError` at the workspace's key, naming the tier's file).

    Raises:
        ConfigError: A tier's file can't be trusted or does not load.
    """
    writable = [root / Path(p).expanduser() for p in config.sandbox.filesystem.allow_write if "*" not in p]
    tiers = read_admin_policy(root, writable)
    for tier in tiers:
        minimums = tier.policy.sandbox
        if minimums.enabled and (not config.sandbox.enabled or config.kernel.gateway is not None):
            where = "[kernel.gateway] runs kernels unsandboxed here" if config.sandbox.enabled else ""
            _refuse(
                ("sandbox", "enabled") if not where else ("kernel", "gateway"),
                False,
                f"the {tier.name} admin policy ({tier.path}) requires sandboxed kernels"
                + (f", and {where}" if where else ": remove enabled = false"),
            )
        allowed = minimums.allowed_domains
        if allowed is not None:
            beyond = [d for d in config.sandbox.network.allowed_hosts if not domain_allowed(d, allowed)]
            if beyond:
                _refuse(
                    ("sandbox", "network", "allowedDomains"),
                    beyond,
                    f"the {tier.name} admin policy ({tier.path}) lets kernels reach only "
                    f"{', '.join(allowed) or 'no domain'}; remove {', '.join(beyond)}",
                )
            if config.sandbox.enabled and config.sandbox.network.unknown == "ask":
                _refuse(
                    ("sandbox", "network", "unknown"),
                    "ask",
                    f"the {tier.name} admin policy ({tier.path}) lets kernels reach only "
                    f"{', '.join(allowed) or 'no domain'}, and a person answering an ask could allow any "
                    'host: set unknown = "deny"',
                )
    if not tiers:
        return config
    approval = config.approval.with_admin(tuple(tier.tier() for tier in tiers))
    return config.model_copy(update={"approval": approval})


# What a remote gateway can be asked to enforce (as `KERNEL_*_LIMIT`, which Enterprise Gateway's kernel
# templates turn into the pod's or container's limits); the other limits are this machine's mechanisms.
REMOTE_LIMITS = ("memory", "cpus")


def _check_remote_kernels(config: WorkspaceConfig) -> None:
    """Kernels of a `[kernel.gateway]` are not this machine's: what only applies to local kernels, written
    out, is refused rather than silently not applied."""
    if config.sandbox.enabled and "enabled" in config.sandbox.model_fields_set:
        _refuse(
            ("sandbox", "enabled"),
            True,
            "[sandbox] sandboxes kernels on this machine, and [kernel.gateway] runs them on the gateway's "
            "cluster, which isolates them (its pod security and network policies): remove enabled, or "
            "[kernel.gateway]",
        )
    limits = config.kernel.limits
    for name in sorted(limits.model_fields_set - {"enforce", *REMOTE_LIMITS}):
        value = getattr(limits, name)
        if value is not None:
            _refuse(
                ("kernel", "limits", name),
                value,
                f"[kernel.limits] {name} is enforced on this machine only; kernels of [kernel.gateway] can "
                f"be given {' and '.join(REMOTE_LIMITS)} (their gateway's kernel template applies them): "
                f"remove {name}",
            )


def _check_secrets(config: WorkspaceConfig, root: Path) -> None:
    """`[secrets]` against the tables it relies on: a secret reaches a request only through the sandbox's
    proxy, to hosts the kernels can reach, in a variable of its own, and with its value kept out of
    kernels."""
    name, first = next(iter(config.secrets.items()))
    # Only the proxy of this machine's sandbox puts values in place of placeholders: a kernel that reaches
    # the network another way would send the placeholder itself, and the secret would silently not work.
    if config.kernel.gateway is not None:
        _refuse(
            ("secrets", name),
            first.model_dump(),
            "[secrets] are put in requests by the sandbox's proxy on this machine, and kernels of "
            "[kernel.gateway] reach the network from their cluster: remove [secrets], and give remote "
            "kernels credentials through the cluster",
        )
    if not config.sandbox.enabled:
        _refuse(
            ("secrets", name),
            first.model_dump(),
            "[secrets] are put in requests by the sandbox's proxy, and [sandbox] enabled = false: "
            "unsandboxed kernels reach the network directly, bypassing it. Enable the sandbox, or remove "
            "[secrets] (and pass the credential some other way)",
        )
    kernel_env = config.kernel.env
    network = config.sandbox.network
    writable = config.sandbox.policy().allow_write_paths(root, Path.home())
    owners: dict[str, str] = {}
    variables: dict[str, str] = {}
    for name, secret in config.secrets.items():
        if secret.env in kernel_env:
            _refuse(
                ("secrets", name, "env"),
                secret.env,
                f"[kernel] env sets {secret.env} too, and a kernel's variable holds one value: remove it "
                "from [kernel] env (which would put the value in the kernel) or name another variable here",
            )
        if secret.env in owners:
            _refuse(
                ("secrets", name, "env"),
                secret.env,
                f"secret {owners[secret.env]!r} holds its placeholder in {secret.env} already: name another "
                "variable",
            )
        owners[secret.env] = name
        for variable in placeholder_names(secret.value or ""):
            variables.setdefault(variable, name)
        for index, host in enumerate(secret.hosts):
            denied = next((entry for entry in network.denied_domains if covers(entry, host)), None)
            if denied is not None:
                _refuse(
                    ("secrets", name, "hosts", index),
                    host,
                    f"[sandbox.network] deniedDomains has {denied!r}, so kernels can't reach {host!r}: "
                    "remove one of them",
                )
            if not any(covers(entry, host) for entry in network.allowed_hosts):
                _refuse(
                    ("secrets", name, "hosts", index),
                    host,
                    f"kernels can't reach {host!r}: add it to [sandbox.network] allowedDomains",
                )
        if secret.command is not None:
            # The host runs it with its whole environment, unsandboxed: a kernel that rewrote what it runs
            # would run its own code there (checked again before it runs: `resolve_secrets`).
            problem = command_problem(secret.command, environ=os.environ, cwd=root, kernel_writable=writable)
            if problem is not None:
                index, reason = problem
                _refuse(("secrets", name, "command", index), secret.command[index], reason)
    # A `${VAR}` of a secret's value in [kernel] env would put the value itself in the kernel.
    for key, value in kernel_env.items():
        both = sorted(placeholder_names(value) & variables.keys())
        if both:
            _refuse(
                ("kernel", "env", key),
                value,
                f"${{{both[0]}}} is the value of secret {variables[both[0]]!r}, which kernels must not see: "
                f"remove {key} from [kernel] env (kernels get the secret's placeholder in "
                f"{config.secrets[variables[both[0]]].env})",
            )


def _refuse(loc: tuple[str | int, ...], value: Any, reason: str) -> None:
    error: Any = {"type": "value_error", "loc": loc, "input": value, "ctx": {"error": ValueError(reason)}}
    raise ValidationError.from_exception_data(WorkspaceConfig.__name__, [error])


def _unknown_keys(keys: list[str], data: Mapping[str, Any]) -> ValidationError:
    errors: list[Any] = [{"type": "extra_forbidden", "loc": (key,), "input": data[key]} for key in keys]
    return ValidationError.from_exception_data(WorkspaceConfig.__name__, errors)


def _problems(
    errors: list[ErrorDetails], path: Path, source: str, data: dict[str, Any], dotenv: Path | None
) -> list[ConfigProblem]:
    environ = {name.upper(): name for name in os.environ}
    sources = [ValueSource(EnvSettingsSource(WorkspaceConfig)(), lambda p: _in_environment(p, environ))]
    if dotenv is not None:
        lines = dotenv.read_text(encoding="utf-8", errors="replace").splitlines()
        dotenv_data = OwnSettingsOnly(DotEnvSettingsSource(WorkspaceConfig, env_file=dotenv))()
        sources.append(ValueSource(dotenv_data, lambda p: _in_dotenv(p, dotenv, lines)))
    sources.append(ValueSource(data, in_file(path, source)))
    problems = problems_from_errors(errors, sources, WorkspaceConfig)
    # File problems in file order, then the others.
    return sorted(problems, key=lambda p: (p.source != str(path), p.line or 0, p.column or 0))


def setting_source(config: WorkspaceConfig, key_path: KeyPath) -> tuple[str, int | None, int | None]:
    """Where the value `config` holds at `key_path` was set, ranked as loading ranks the sources: an
    `IPYBOX_*` variable of this process's environment (`environment variable NAME`, no place), a line of
    the workspace's `.env`, else `ipybox.toml` (with the key's line and column, or none when the file leaves
    it to the default). For a message that names what to change, e.g. an override of `[sandbox] enabled`.
    """
    environ = {name.upper(): name for name in os.environ}
    if any(name in environ for name in _variable_names(key_path)):
        return _in_environment(key_path, environ)
    dotenv = config.root / ".env"
    if dotenv.is_file():
        place = _in_dotenv(
            key_path, dotenv, dotenv.read_text(encoding="utf-8", errors="replace").splitlines()
        )
        if place[1] is not None:
            return place
    path = config.path if config.path is not None else config.root / CONFIG_FILE
    try:
        position = key_positions(_read(path)).get(key_path)
    except ConfigError:
        position = None
    return (str(path), *position) if position is not None else (str(path), None, None)


def _variable_names(key_path: KeyPath) -> list[str]:
    """The variables that could set the value at `key_path`, most specific first."""
    parts = [str(part).upper() for part in key_path]
    return [ENV_PREFIX + ENV_NESTED_DELIMITER.join(parts[:end]) for end in range(len(parts), 0, -1)]


def _in_environment(key_path: KeyPath, environ: Mapping[str, str]) -> tuple[str, None, None]:
    for name in _variable_names(key_path):
        if name in environ:
            return f"environment variable {environ[name]}", None, None
    return "environment", None, None


def _in_dotenv(key_path: KeyPath, dotenv: Path, lines: list[str]) -> tuple[str, int | None, int | None]:
    for name in _variable_names(key_path):
        for number, line in enumerate(lines, start=1):
            match = _DOTENV_ASSIGNMENT.match(line)
            if match is not None and match.group(1).upper() == name:
                return str(dotenv), number, match.start(1) + 1
    return str(dotenv), None, None


def _unparsable_variable(error: SettingsError, dotenv: Path | None) -> ConfigProblem:
    # pydantic-settings parses a variable for a list or table as JSON, and names only the field and source.
    message = " ".join(str(error).split())
    source = str(dotenv) if dotenv is not None and "DotEnvSettingsSource" in message else "environment"
    return ConfigProblem(
        source, None, None, f"{message}: lists and tables in {ENV_PREFIX}* variables are JSON"
    )
