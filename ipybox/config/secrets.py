"""`[secrets.<name>]`: credentials the host resolves and kernels never see.

```toml
[secrets.github]
value = "${GITHUB_TOKEN}"           # from the host's environment or the workspace's .env
# command = ["pass", "show", "api/github"]   # or: run on the host (argv, no shell); its stdout is the value
env = "GITHUB_TOKEN"                # the kernel's variable that holds the placeholder
hosts = ["api.github.com"]          # where the value may be sent: host names or "*.example.com"
headers = ["Authorization"]         # optional: only in these request headers (default: any header)
```

The contract:

- The value never reaches a kernel: not its environment, not a file it can read, not a log. The host
  resolves it (`resolve_secrets`), from a `${VAR}` of the host's environment or the workspace's `.env` (as
  server `${VAR}`s are), or from a command run on the host with the host's environment.
- A kernel gets a placeholder instead, in the variable `env` (`kernel_env`): `ipybox-secret-<name>-<random>`,
  made fresh at each resolve. The sandbox's filtering proxy puts the value in its place only in requests
  to `hosts` (and only in `headers`, when given); sent anywhere else the placeholder is a meaningless
  string. It is unguessable (192 random bits), so a kernel can't forge the placeholder of a secret it was
  not given, and it carries the name, so logs and errors that show it say which secret it stands for.
- The value is kept only in `ResolvedSecret.value`, which its `repr` leaves out; `secret_values` hands the
  values to the audit log, which redacts them wherever they occur.
- `ipybox.toml` holds no value: a literal `value` is refused (the file is read by kernels, editors and
  version control); write `value = "${NAME}"` and put `NAME` in `.env` or the environment.
- Errors (`SecretError`) name the secret, the problem and what to do, on one line, and never contain the
  value or a command's output, nor chain an exception that holds them; of a failing command's stderr only
  the first line is quoted (without what its stdout printed), since that is where programs like `pass` say
  what went wrong.

A command is run so that no kernel decides which process the host starts, nor what it reads: it runs in
the workspace's directory, its program and every file its arguments name must lie outside the
directories kernels can write (the workspace and `[sandbox] allowWrite`: `command_problem`; refused when
the workspace loads, placed at the entry, and again before it runs), and its `PATH` (where its program is
found, and the programs it runs by name) and `PYTHONPATH`, `NODE_PATH` and `LD_LIBRARY_PATH` keep only
the host's absolute entries outside those directories, so a kernel can't plant a program of the same name
in an earlier `PATH` entry (a virtual environment in the workspace, say). Refused rather than protected
(as MCP servers' code is, `ipybox.config.executables`): a secret is resolved while kernels may already
run (an edit), and those kernels were not started with the new command's files read-only. A command that
outlives its `timeout` is killed with its whole process group (it runs in a session of its own), and
its other descendants, so nothing it started is left running.

Which hosts a secret may reach, and how it fits the other tables (its `env` not also in `[kernel] env`, its
hosts in `[sandbox.network] allowedDomains`, the sandbox on), is checked when the workspace loads
(`ipybox.config.loading`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from secrets import token_urlsafe
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from ipybox.errors import IpyboxError
from ipybox.mcp_client.params import PLACEHOLDER, resolve_placeholders
from ipybox.mcp_client.placeholders import placeholder_digest
from ipybox.process import descendants, kill_all
from ipybox.sandbox.domains import domain_entry_error, normalize_host
from ipybox.sandbox.netbridge import proxy_env

__all__ = [
    "DEFAULT_COMMAND_TIMEOUT",
    "PLACEHOLDER_PATTERN",
    "PLACEHOLDER_PREFIX",
    "SECRET_NAME_PATTERN",
    "ResolvedSecret",
    "SecretError",
    "SecretName",
    "SecretSection",
    "check_secret_name",
    "command_problem",
    "kernel_env",
    "resolve_secrets",
    "secret_values",
    "secrets_digest",
]

SECRET_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
"""Valid secret names, as a JSON Schema pattern: ASCII identifiers. No `-`, so that in a placeholder
(`ipybox-secret-<name>-<random>`) the name ends at the first `-` after the prefix."""

PLACEHOLDER_PREFIX = "ipybox-secret-"

_TOKEN_BYTES = 24
"""Random bytes of a placeholder: 192 bits, 32 URL-safe base64 characters."""

PLACEHOLDER_PATTERN = re.compile(
    re.escape(PLACEHOLDER_PREFIX) + r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)-[A-Za-z0-9_-]{32}"
)
"""A placeholder as `ResolvedSecret.placeholder` makes them; group `name` is the secret's name. For whoever
looks for placeholders in text (the proxy, a log reader); the proxy replaces only placeholders it made."""

DEFAULT_COMMAND_TIMEOUT = 10.0
"""Seconds a secret's `command` may run: enough for `pass` asking gpg-agent, short enough that a command
waiting for a passphrase nobody will type (its stdin is empty) fails the start instead of hanging it."""

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# RFC 9110's `token`: the characters a header name may have.
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# What the host sets in every sandboxed kernel's environment after the configured variables: a secret's
# placeholder there would be overwritten (IPYBOX_*), or would break the kernel's network (the proxy's).
_HOST_SET_ENV = frozenset(name.upper() for name in proxy_env(0))
_HOST_SET_PREFIX = "IPYBOX_"
_STDERR_CHARS = 200
_UNSAFE_CHARS = re.compile(r"[\r\n\0]")


class SecretError(IpyboxError, ValueError):
    """A secret could not be resolved on the host: its variable is not set, its command failed, timed out
    or was not found (or is where kernels can write), or its value is empty or can't go in an HTTP header.
    The message names the secret and what to do, and never contains the value or the command's output.

    Attributes:
        secret: The secret's name (`[secrets.<secret>]`), for placing the error in `ipybox.toml`.
    """

    def __init__(self, message: str, *, secret: str | None = None) -> None:
        super().__init__(message)
        self.secret = secret


def check_secret_name(name: str) -> str:
    """Return `name` if it can name a secret, else raise `ValueError` suggesting one."""
    if not (name.isascii() and name.isidentifier()):
        suggestion = re.sub(r"[^A-Za-z0-9_]", "_", name) or "secret"
        if suggestion[0].isdigit():
            suggestion = f"secret_{suggestion}"
        raise ValueError(
            f"secret name {name!r} is not valid (it is part of the placeholder kernels see, "
            f"{PLACEHOLDER_PREFIX}<name>-...): use ASCII letters, digits and '_', not starting with a digit, "
            f"e.g. {suggestion!r}"
        )
    return name


SecretName = Annotated[
    str, AfterValidator(check_secret_name), WithJsonSchema({"type": "string", "pattern": SECRET_NAME_PATTERN})
]
"""A secret's name: the key of its `[secrets.<name>]` table."""


def _host(host: str) -> str:
    error = domain_entry_error(host)
    if error is not None:
        raise ValueError(error)
    return host


def _header_name(name: str) -> str:
    if not _HEADER_NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not an HTTP header name, e.g. 'Authorization' or 'X-Api-Key'")
    return name


# Checked one by one, so that a problem is placed at the entry.
_Host = Annotated[str, AfterValidator(_host)]
_HeaderName = Annotated[
    str,
    AfterValidator(_header_name),
    WithJsonSchema({"type": "string", "pattern": f"^{_HEADER_NAME.pattern}$"}),
]


class SecretSection(BaseModel):
    """`[secrets.<name>]`: one credential, resolved on the host, that kernels use through a placeholder.

    Attributes:
        value: The value, as `${VAR}` placeholders filled from the host's environment or the workspace's
            `.env` (e.g. `"${GITHUB_TOKEN}"`); a literal value is refused. Either this or `command`.
        command: A program and its arguments (argv, no shell) run on the host, in the workspace's
            directory, with the host's environment (its search paths confined: see the module) when kernels
            start and when `[secrets]` is edited; its standard output, surrounding whitespace stripped, is
            the value (e.g. `["pass", "show", "api/github"]`). The program is an absolute path or a name
            found on `PATH`, and it and the files its arguments name are outside the workspace and
            `allowWrite` (kernels can write there). Either this or `value`.
        env: The kernels' environment variable that holds the secret's placeholder (e.g. `GITHUB_TOKEN`).
            Not a variable of `[kernel] env`, nor one ipybox sets (`IPYBOX_*`, the proxy variables).
        hosts: Where the value may be sent: host names (`api.github.com`), wildcards for subdomains
            (`*.example.com`, not `example.com` itself) or IP addresses. Each must be reachable:
            covered by `[sandbox.network] allowedDomains`.
        headers: The request headers the value may be put in (case-insensitive, e.g.
            `["Authorization"]`). Default: any header.
        timeout: Seconds `command` may run before it is killed and the secret fails to resolve. Default 10.

    Example:
        ```python
        section = SecretSection.model_validate(
            {"value": "${GITHUB_TOKEN}", "env": "GITHUB_TOKEN", "hosts": ["api.github.com"]}
        )
        ```
    """

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        json_schema_extra={"oneOf": [{"required": ["value"]}, {"required": ["command"]}]},
    )

    value: str | None = Field(
        default=None, min_length=1, json_schema_extra={"pattern": r"\$\{[A-Za-z_][A-Za-z0-9_]*\}"}
    )
    command: list[str] | None = Field(default=None, json_schema_extra={"minItems": 1})
    env: str = Field(json_schema_extra={"pattern": f"^{_ENV_NAME.pattern}$"})
    # Checked by `_some_host` rather than `min_length`, for a message that says what to write.
    hosts: list[_Host] = Field(json_schema_extra={"minItems": 1})
    headers: list[_HeaderName] | None = None
    timeout: float = Field(default=DEFAULT_COMMAND_TIMEOUT, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _one_source(cls, data: Any) -> Any:
        # Before the fields, so the error blames the key to remove (at its line), not the whole table.
        if not isinstance(data, Mapping):
            return data
        if "value" in data and "command" in data:
            raise PydanticCustomError(
                "secret_source",
                "a secret has either 'value' (from a variable) or 'command' (a program's output), not both",
                {"key": "command"},
            )
        if "value" not in data and "command" not in data:
            raise PydanticCustomError(
                "secret_source",
                "a secret needs 'value' (e.g. value = \"${GITHUB_TOKEN}\", set in .env or the environment) "
                'or \'command\' (e.g. command = ["pass", "show", "api/github"])',
            )
        if "timeout" in data and "command" not in data:
            raise PydanticCustomError(
                "secret_source",
                "timeout is how long 'command' may run, and this secret has none",
                {"key": "timeout"},
            )
        return data

    @field_validator("value")
    @classmethod
    def _placeholders_only(cls, value: str | None) -> str | None:
        if value is None:
            return value
        # A value written in ipybox.toml would be read by every kernel (the file is readable in the
        # sandbox), by editors and by version control: the file names where the value is, never the value.
        if PLACEHOLDER.search(value) is None:
            raise ValueError(
                "a literal secret in ipybox.toml is refused: put it in .env or the environment and write "
                'value = "${NAME}"'
            )
        for match in PLACEHOLDER.finditer(value):
            if not _ENV_NAME.fullmatch(match.group(1)):
                raise ValueError(
                    f"invalid placeholder ${{{match.group(1)}}}: a variable name is letters, digits and '_', "
                    "not starting with a digit"
                )
        return value

    @field_validator("command")
    @classmethod
    def _program(cls, command: list[str] | None) -> list[str] | None:
        if command is None:
            return command
        if not command or not command[0]:
            raise ValueError('command is a program and its arguments, e.g. ["pass", "show", "api/github"]')
        if any("\0" in arg for arg in command):
            raise ValueError("command's arguments can't contain NUL characters")
        program = command[0]
        # A relative path would mean something else from each directory ipybox is started in.
        if "/" in program and not os.path.isabs(program):
            raise ValueError(
                f"command's program {program!r} is a relative path: write an absolute path, or a name found "
                "on PATH"
            )
        return command

    @field_validator("env")
    @classmethod
    def _variable_name(cls, env: str) -> str:
        if not _ENV_NAME.fullmatch(env):
            raise ValueError(
                f"env {env!r} is not an environment variable name: letters, digits and '_', not starting "
                "with a digit, e.g. 'GITHUB_TOKEN'"
            )
        if env.upper().startswith(_HOST_SET_PREFIX) or env.upper() in _HOST_SET_ENV:
            raise ValueError(
                f"env {env!r} is set by ipybox in every kernel (its own variables and the proxy's): name "
                "another variable"
            )
        return env

    @field_validator("hosts")
    @classmethod
    def _some_host(cls, hosts: list[str]) -> list[str]:
        if not hosts:
            raise ValueError(
                'hosts names where the secret may be sent, e.g. ["api.github.com"]; a secret sent nowhere '
                "is not needed"
            )
        return hosts

    @field_validator("headers")
    @classmethod
    def _some_header(cls, headers: list[str] | None) -> list[str] | None:
        if headers is not None and not headers:
            raise ValueError("headers = [] lets the secret go in no header: leave headers out for any header")
        return headers

    @field_validator("timeout", mode="before")
    @classmethod
    def _not_a_flag(cls, value: Any) -> Any:
        # TOML's `true` would pass as 1 second.
        if isinstance(value, bool):
            raise ValueError(f"timeout takes a number of seconds, not {str(value).lower()}")
        return value


@dataclass(frozen=True)
class ResolvedSecret:
    """A secret resolved on the host. Only the host holds one; kernels get `env` = `placeholder`.

    Attributes:
        name: The secret's name (`[secrets.<name>]`).
        value: The real value. Left out of `repr`, so a log line or traceback that shows the object does not
            show it.
        placeholder: What the kernel sees in `env` and puts in requests: `ipybox-secret-<name>-<random>`.
            Unguessable, so a kernel can't forge one for a secret it wasn't given; it carries the name, so
            logs and errors showing it are readable. New at each resolve (a restart makes new ones: outside
            the proxy that made them they are worth nothing).
        env: The kernel's environment variable that holds the placeholder.
        hosts: Where the proxy may put the value in place of the placeholder (normalized: lower case, no
            trailing dot).
        headers: The only request headers it may go in, lower-cased; `None`: any header.
    """

    name: str
    value: str = field(repr=False)
    placeholder: str
    env: str
    hosts: tuple[str, ...]
    headers: frozenset[str] | None


def resolve_secrets(
    sections: Mapping[str, SecretSection],
    *,
    environ: Mapping[str, str],
    dotenv_path: Path | None,
    cwd: Path | None = None,
    kernel_writable: Sequence[Path] = (),
) -> dict[str, ResolvedSecret]:
    """Resolve each secret on the host, with a fresh placeholder.

    Args:
        sections: `[secrets]`, by name.
        environ: The host's environment: `${VAR}`s are looked up there first, and commands run with it
            (and find their program on its `PATH`).
        dotenv_path: The workspace's `.env`, for variables missing from `environ` (ignored when there is no
            such file).
        cwd: Where commands run (the workspace's directory); default: this process's.
        kernel_writable: The directories kernels can write (the workspace and `allowWrite`: the policy's
            `allow_write_paths`): a command that would run or read a file there is refused, and its search
            paths leave them out (see the module).

    Returns:
        The resolved secrets, by name.

    Raises:
        SecretError: A secret could not be resolved; the message names it, the problem and what to do, and
            never its value or its command's output.

    Example:
        ```python
        resolved = resolve_secrets(config.secrets, environ=os.environ, dotenv_path=config.root / ".env")
        env = kernel_env(resolved)  # {"GITHUB_TOKEN": "ipybox-secret-github-..."}
        ```
    """
    resolved: dict[str, ResolvedSecret] = {}
    for name, section in sections.items():
        try:
            if section.command is not None:
                value = _run(name, section.command, section.timeout, environ, cwd, kernel_writable)
            else:
                value = _substitute(name, section.value or "", environ, dotenv_path)
            _check_value(name, value, section)
        except SecretError as e:
            e.secret = name
            raise
        resolved[name] = ResolvedSecret(
            name=name,
            value=value,
            placeholder=f"{PLACEHOLDER_PREFIX}{name}-{token_urlsafe(_TOKEN_BYTES)}",
            env=section.env,
            hosts=tuple(normalize_host(host) for host in section.hosts),
            headers=frozenset(h.lower() for h in section.headers) if section.headers is not None else None,
        )
    return resolved


def kernel_env(resolved: Mapping[str, ResolvedSecret] | Iterable[ResolvedSecret]) -> dict[str, str]:
    """The variables secrets add to a kernel's environment: each secret's `env` = its placeholder."""
    return {secret.env: secret.placeholder for secret in _secrets(resolved)}


def secret_values(resolved: Mapping[str, ResolvedSecret] | Iterable[ResolvedSecret]) -> list[str]:
    """The real values, for redaction (`AuditLog(path, secrets=secret_values(resolved))`)."""
    return [secret.value for secret in _secrets(resolved)]


def _secrets(resolved: Mapping[str, ResolvedSecret] | Iterable[ResolvedSecret]) -> Iterable[ResolvedSecret]:
    return resolved.values() if isinstance(resolved, Mapping) else resolved


def _substitute(name: str, template: str, environ: Mapping[str, str], dotenv_path: Path | None) -> str:
    # Each error is raised after its `except` block, so that it has no `__context__`: the exception caught
    # may hold what was read (a `UnicodeDecodeError` holds the whole .env, with other secrets in it).
    try:
        return resolve_placeholders({"value": template}, environ=environ, dotenv_path=dotenv_path)["value"]
    except UnicodeDecodeError:  # a ValueError too, so first
        problem = f"{dotenv_path} is not UTF-8 text, so its variables can't be read: save it as UTF-8"
    except ValueError as e:  # an unset variable: the message names it and where to set it, and no value
        problem = str(e)
    except OSError as e:
        problem = f"can't read {dotenv_path}: {e.strerror or type(e).__name__}"
    raise SecretError(f"secret {name!r}: {problem}")


def _run(
    name: str,
    command: list[str],
    timeout: float,
    environ: Mapping[str, str],
    cwd: Path | None,
    kernel_writable: Sequence[Path],
) -> str:
    program = command[0]
    where = cwd or Path.cwd()
    env = _confined_environ(environ, kernel_writable)
    problem_at = command_problem(command, environ=environ, cwd=where, kernel_writable=kernel_writable)
    if problem_at is not None:
        raise SecretError(f"secret {name!r}: {problem_at[1]}")
    # Found here rather than by `subprocess`, to say which PATH was searched when it is not there.
    found = _find_program(program, env)
    if found is None:
        where_not = (
            "does not exist or is not executable" if os.path.isabs(program) else "is not found on PATH"
        )
        raise SecretError(
            f"secret {name!r}: its command's program {program!r} {where_not}: install it, or write its "
            "absolute path in command"
        )
    # As in `_substitute`, errors are raised outside the `except` blocks: `TimeoutExpired` holds what the
    # command printed so far, and `UnicodeDecodeError` all of it.
    try:
        # No shell, an empty stdin (a prompt fails rather than waits), the host's environment (`pass` needs
        # GNUPGHOME, gpg-agent's socket, ...) with its search paths confined; a session of its own, so
        # that a timeout ends what it started too.
        process = subprocess.Popen(
            [found, *command[1:]],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=where,
            start_new_session=True,
        )
    except OSError as e:
        problem = f"could not be run: {e.strerror or type(e).__name__}"
    else:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_tree(process)
            problem = (
                f"did not finish within {timeout:g} s (waiting for a passphrase or a device?): unlock what it "
                "needs first, or raise the secret's timeout"
            )
        except BaseException:
            _kill_tree(process)
            raise
        else:
            if process.returncode != 0:
                status = (
                    f"was killed by signal {-process.returncode}"
                    if process.returncode < 0
                    else f"exited with status {process.returncode}"
                )
                said = _first_line(stderr, stdout)
                problem = (
                    status
                    + (f" ({said})" if said else "")
                    + ": run it yourself to see why, and fix it or the "
                    "secret's command"
                )
            else:
                try:
                    return stdout.decode("utf-8").strip()
                except UnicodeDecodeError:
                    problem = "printed something that is not UTF-8 text: make it print the secret alone"
    raise SecretError(f"secret {name!r}: its command {program!r} {problem}")


def _kill_tree(process: subprocess.Popen[bytes]) -> None:
    """Kill `process`, its process group and its other descendants (those that left the group), then reap
    it. Its pipes are closed unread: a descendant that escaped (a daemon that double-forked) may hold them."""
    found = descendants(process.pid)  # before the kill: then they are reparented, and lost
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    kill_all(found)
    process.kill()
    process.wait()
    for pipe in (process.stdout, process.stderr):
        if pipe is not None:
            pipe.close()


_SEARCH_PATHS = ("PATH", "PYTHONPATH", "NODE_PATH", "LD_LIBRARY_PATH")
"""The host's variables whose entries say where a command finds programs, modules and libraries."""


def _confined_environ(environ: Mapping[str, str], kernel_writable: Sequence[Path]) -> dict[str, str]:
    """`environ` with only absolute entries outside `kernel_writable` in its search paths: a relative entry
    means the workspace (commands run there), and in the others a kernel could plant what is run."""
    env = dict(environ)
    for variable in _SEARCH_PATHS:
        if variable not in env:
            continue
        kept = [
            entry
            for entry in env[variable].split(os.pathsep)
            if os.path.isabs(entry) and _writable_root(entry, kernel_writable) is None
        ]
        env[variable] = os.pathsep.join(kept)
    return env


def _find_program(program: str, env: Mapping[str, str]) -> str | None:
    found = program if os.path.isabs(program) else shutil.which(program, path=env.get("PATH", os.defpath))
    if found is None or not os.path.isfile(found) or not os.access(found, os.X_OK):
        return None
    return found


def _writable_root(path: str, kernel_writable: Sequence[Path]) -> Path | None:
    """The directory of `kernel_writable` that `path` (as written, or resolved) lies in, if any."""
    candidates = {Path(os.path.normpath(path)), Path(os.path.realpath(path))}
    for root in kernel_writable:
        real = Path(os.path.realpath(root))
        if any(c.is_relative_to(root) or c.is_relative_to(real) for c in candidates):
            return root
    return None


def command_problem(
    command: Sequence[str], *, environ: Mapping[str, str], cwd: Path, kernel_writable: Sequence[Path]
) -> tuple[int, str] | None:
    """Where a kernel could decide what a secret's `command` runs or reads: the index of the argument at
    fault and why (with what to do), else `None`.

    Refused: a program that is (or resolves to) a file in `kernel_writable`, or found on `PATH` only in
    such a directory, or a script whose interpreter (`#!`) is there; an argument naming an existing file
    (relative to `cwd`, as the command would see it, or `--option=file`) there. The host runs the command
    with its whole environment: such a file would be the kernel's code, or what it wants read.
    """
    if not kernel_writable:
        return None
    program = command[0]
    fix = "install it outside the workspace (kernels can write there, and the host runs the command)"
    found = _find_program(program, _confined_environ(environ, kernel_writable))
    if os.path.isabs(program):
        found = program  # where it is named, whether it exists yet or not (a kernel could make it)
    elif found is None:
        # Found only where kernels could have planted it?
        anywhere = shutil.which(program, path=environ.get("PATH", os.defpath))
        if anywhere is not None:
            root = _writable_root(os.path.join(cwd, anywhere), kernel_writable)
            if root is not None:
                return 0, (
                    f"the program {program!r} is found on PATH only in {os.path.dirname(anywhere)}, where "
                    f"kernels can write ({root}), and the host runs it with its environment: {fix}"
                )
    if found is not None:
        root = _writable_root(found, kernel_writable)
        if root is not None:
            return 0, (
                f"the program is in {root}, where kernels can write, and the host runs it with its "
                f"environment: {fix}"
            )
        interpreter = _interpreter(found)
        if interpreter is not None and (root := _writable_root(interpreter, kernel_writable)) is not None:
            return 0, (
                f"the program {found} is a script run by {interpreter}, in {root}, where kernels can write: "
                f"{fix}"
            )
    for index, arg in enumerate(command[1:], start=1):
        value = arg.split("=", 1)[1] if arg.startswith("-") and "=" in arg else arg
        if not value or value.startswith("-"):
            continue
        path = os.path.join(cwd, value)
        if not os.path.lexists(path):
            continue
        root = _writable_root(path, kernel_writable)
        if root is not None:
            return index, (
                f"{value!r} is a file in {root}, where kernels can write (and read), and the command runs or "
                "reads it on the host: keep what the command runs or reads outside the workspace"
            )
    return None


def _interpreter(program: str) -> str | None:
    """The interpreter a `#!` script names (its first word), if it is one."""
    try:
        with open(program, "rb") as file:
            head = file.readline(256)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    words = head[2:].decode("utf-8", errors="replace").split()
    return words[0] if words and os.path.isabs(words[0]) else None


def secrets_digest(
    sections: Mapping[str, SecretSection], *, environ: Mapping[str, str], dotenv_path: Path | None
) -> str:
    """A digest of what resolving `sections` depends on and can be watched: the sections themselves and
    what their `${VAR}`s resolve to (from `environ`, else `.env`). Equal digests: resolving again would
    give the same values (a command's output excepted, which nothing watches). Empty without sections.

    Example:
        ```python
        if secrets_digest(new.secrets, environ=os.environ, dotenv_path=env) != applied:
            resolved = resolve_secrets(new.secrets, environ=os.environ, dotenv_path=env)
        ```
    """
    if not sections:
        return ""
    digest = hashlib.sha256()
    for name in sorted(sections):
        section = sections[name]
        digest.update(json.dumps([name, section.model_dump(mode="json")], sort_keys=True).encode())
        digest.update(placeholder_digest(section.value or "", environ, dotenv_path).encode())
    return digest.hexdigest()


def _first_line(stderr: bytes, stdout: bytes) -> str:
    """The first non-blank line of `stderr`, at most `_STDERR_CHARS` characters, without anything that
    `stdout` printed (a command may echo part of what it read before it failed)."""
    text = stderr.decode("utf-8", errors="replace")
    line = next((line.strip() for line in text.splitlines() if line.strip()), "")
    printed = stdout.decode("utf-8", errors="replace").strip()
    pieces = {printed, *printed.split()}
    for piece in sorted((p for p in pieces if len(p) >= 4), key=len, reverse=True):
        line = line.replace(piece, "[redacted]")
    line = "".join(ch if ch.isprintable() else "?" for ch in line)
    return line if len(line) <= _STDERR_CHARS else line[: _STDERR_CHARS - 3] + "..."


def _check_value(name: str, value: str, section: SecretSection) -> None:
    source = f"its command {section.command[0]!r}" if section.command is not None else repr(section.value)
    if not value:
        fix = "make it print the secret" if section.command is not None else "set the variable to the secret"
        raise SecretError(f"secret {name!r}: {source} gave an empty value: {fix}")
    # The proxy puts the value in request headers, where these characters would end the header (or the
    # request) and let the value write headers of its own.
    if _UNSAFE_CHARS.search(value):
        raise SecretError(
            f"secret {name!r}: the value from {source} contains a line break or NUL character, which can't "
            "go in an HTTP header: make it a single line"
        )
