"""`register_mcp_server` over MCP: a host command on the MCP client's say-so.

Registering a server makes the host start a command (or connect to a URL) that the client chose, so it is
checked, decided and written with care:

- `parse_registration` validates the parameters with the one server-parameters model
  (`ipybox.mcp_client.params`, which `[servers.<name>]` of `ipybox.toml` extends by `enabled` only), so
  a registration takes exactly the keys and values the published `server_params` take (a transport alias
  such as `"type": "http"` is normalised to `streamable_http`, as the file spells it); in a workspace
  whose kernels are sandboxed, a stdio server is registered sandboxed unless the client gives a sandbox
  policy of its own.
- `beyond_workspace` bounds a stdio server's sandbox by the workspace's, where kernels are sandboxed:
  writable only the workspace, a top-level entry of it that it doesn't protect, or one of its own
  `allowWrite` paths (as `cwd` and in `allowWrite`); `allowedDomains` covered by the workspace's (an exact
  host only by the same exact host: a wildcard never reaches private addresses, an exact host may),
  with the workspace's `deniedDomains` that concern them and no more than its request rules allow; its `allowUnixSockets` only; its `denyRead`
  and `denyWrite` kept. A registration beyond that is never allowed by a rule alone.
- `decide_registration` decides it with the workspace's approval rules as the pseudo tool call
  `ipybox.register_mcp_server(server_name, server_params)`; when no rule decides, it is asked where the
  kernels are confined (sandboxed, or on a remote gateway) and allowed where they are not (see
  `Registration.kernels_unconfined` for why), and an allow rule for a registration beyond the
  workspace's sandbox asks instead (`Registration.exceeds` says why, in the question and in the error
  when nobody answers).
- `add_server` writes exactly what was parsed (the model's dump, `sandbox` included) into `ipybox.toml`
  with `ipybox.config.server_writer` (as `ipybox server add` does: the rest of the file kept byte for
  byte, atomically), and only if the file still loads afterwards, to the same server.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Final

from pydantic import ValidationError

from ipybox.config import CONFIG_FILE, ConfigError, WorkspaceConfig, load_config
from ipybox.config.server_writer import write_server
from ipybox.mcp_client import MCPServerError
from ipybox.mcp_client.params import (
    HTTP_KEYS,
    STDIO_KEYS,
    ServerParams,
    StdioServerParams,
    check_server_name,
    dump_server_params,
    error_key,
    parse_server_params,
    server_params_adapter,
)
from ipybox.rules import ApprovalPolicy, Rule, ToolCall, Verdict
from ipybox.rules.engine import SEVERITY, RuleEngine, rule_id
from ipybox.sandbox.domains import DomainFilter, covers
from ipybox.sandbox.policy import DEFAULT_DENY_WRITE, DOTENV_PATTERN

REGISTRATION_SERVER: Final = "ipybox"
"""The server name approval rules see for a registration (`server = "ipybox"`)."""
REGISTRATION_TOOL: Final = "register_mcp_server"
"""The tool name approval rules see for a registration (`tool = "register_mcp_server"`)."""

ALLOW_RULE_EXAMPLE: Final = (
    f'[[approval.rules]]\nserver = "{REGISTRATION_SERVER}"\ntool = "{REGISTRATION_TOOL}"\ndecision = "allow"'
)

# Server parameters may say where the workspace is (as the supervisor fills them in).
_WORKSPACE_ENV: Final = "IPYBOX_WORKSPACE"


@dataclass(frozen=True)
class Registration:
    """A registration, parsed and ready to decide and write.

    Attributes:
        name: The server's name.
        server: The server's parameters as parsed.
        table: What is written as `[servers.<name>]`: the dump of `server` (loads back as `server`).
        replaces: Whether a server of that name is configured already (and is replaced).
        sandboxed_by_default: Whether `sandbox = true` was added because the client gave no policy.
        beyond: What the server's sandbox allows beyond the workspace's (`beyond_workspace`); empty
            when it stays within it.
        kernels_unconfined: The workspace's kernels run on this host without a sandbox
            (`[sandbox] enabled = false`, no `[kernel.gateway]`). Then a registration that no rule decides
            is allowed rather than asked: it gives the MCP client nothing it does not have already. The
            client runs code in those kernels (`execute_ipython_cell` is not asked about), and code there
            runs as the user who runs the workspace, on this host: it can start any program
            (`subprocess`; `require_shell_escape` is a guard against mistakes, not a boundary), read
            `.env` and the secrets' commands, and write `ipybox.toml`, whose servers the running
            workspace starts. Asking there only made 0.9.2's `register_mcp_server` fail for clients that
            can't answer. Rules still apply (a deny or ask rule decides). Where kernels are confined, a
            registration is a host command the client could not otherwise start (a sandboxed kernel sees
            neither the host's programs nor `ipybox.toml` writable; a remote gateway's kernel is on
            another machine): it stays asked.
    """

    name: str
    server: ServerParams
    table: dict[str, Any]
    replaces: bool
    sandboxed_by_default: bool
    beyond: tuple[str, ...] = ()
    kernels_unconfined: bool = False

    @property
    def exceeds(self) -> str | None:
        """Why this registration is always asked, for the person asked and for the error when nobody
        answers; `None` when its sandbox stays within the workspace's."""
        if not self.beyond:
            return None
        return (
            f"its sandbox goes beyond the workspace's ([sandbox] in {CONFIG_FILE}): {'; '.join(self.beyond)}. "
            "Such a registration is asked with its policy shown, also where a rule would allow it, and a "
            "person must approve it"
        )

    def call(self) -> ToolCall:
        """The registration as the pseudo tool call approval rules decide.

        Rules see `args = {server_name, server_params}` with the parameters as they will be written (the
        sandbox added by default included). Annotations are declared, not left to the MCP defaults: it
        writes the config (not read-only), runs what the client names (open world), and is destructive
        only when it replaces a configured server.
        """
        annotations = {
            "readOnlyHint": False,
            "destructiveHint": self.replaces,
            "idempotentHint": True,
            "openWorldHint": True,
        }
        args = {"server_name": self.name, "server_params": self.table}
        return ToolCall(REGISTRATION_SERVER, REGISTRATION_TOOL, args, annotations)

    def __str__(self) -> str:
        """How the registration is shown to the person asked about it."""
        where = "in a sandbox of its own" if self.server.sandbox_policy() is not None else "unsandboxed"
        server = self.server
        action = (
            f"starts `{server.command}` on the host {where}"
            if isinstance(server, StdioServerParams)
            else f"connects to {server.url} from the host"
        )
        replacing = f", replacing the configured server {self.name!r}" if self.replaces else ""
        exceeds = f". Note: {self.exceeds}" if self.exceeds else ""
        return (
            f"register the MCP server {self.name!r}: writes [servers.{self.name}] to {CONFIG_FILE} and "
            f"{action}{replacing}; parameters: {json.dumps(self.table)}{exceeds}"
        )


def parse_registration(
    workspace: Path, config: WorkspaceConfig, server_name: str, server_params: Mapping[str, Any]
) -> Registration:
    """Validate a registration for the workspace whose configuration is `config`.

    A key whose value is null counts as not given. In a workspace whose kernels are sandboxed
    (`[sandbox] enabled = true`), a stdio server without a `sandbox` key gets `sandbox = true`.

    Raises:
        ValueError: One clear message: an invalid name, a key that is not accepted (naming the keys that
            are), a value that doesn't fit (naming the key and what it accepts), a placeholder whose
            variable is not set, or a sandboxed workspace asked for an unsandboxed server.
    """
    check_server_name(server_name)
    if server_name == REGISTRATION_SERVER:
        raise ValueError(
            f"server name {REGISTRATION_SERVER!r} is reserved: approval rules with "
            f'server = "{REGISTRATION_SERVER}" decide registrations; choose another name'
        )
    if not isinstance(server_params, Mapping):
        raise ValueError(f"server_params must be an object, not {type(server_params).__name__}")
    params = {key: value for key, value in server_params.items() if value is not None}
    accepted = f"a stdio server takes {', '.join(STDIO_KEYS)}; a url server takes {', '.join(HTTP_KEYS)}"
    for key in params:
        if key not in STDIO_KEYS and key not in HTTP_KEYS:
            raise ValueError(f"server_params: key {key!r} is not accepted ({accepted})")
    sandboxed = config.sandbox.enabled
    by_default = sandboxed and "command" in params and "url" not in params and "sandbox" not in params
    if by_default:
        params["sandbox"] = True
    try:
        server = server_params_adapter().validate_python(params)
    except ValidationError as e:
        raise ValueError(_problems(e, accepted)) from None
    if sandboxed and server.is_stdio and server.sandbox_policy() is None:
        # Refused rather than left to a rule: an agent that may register servers (an allow rule, or a
        # person approving quickly) must not thereby gain an unsandboxed command on the host that the
        # kernels' sandbox exists to prevent. Unsandboxed servers are added to ipybox.toml by hand.
        raise ValueError(
            "server_params.sandbox: this workspace's kernels are sandboxed ([sandbox] enabled = true), so "
            "servers registered over MCP run sandboxed too: leave 'sandbox' out (or give true, or a "
            "policy table); to run a server unsandboxed, add it to ipybox.toml yourself"
        )
    table = dump_server_params(server)
    if _parsed(table) != server:  # never write something other than what was parsed
        raise RuntimeError(f"server_params of {server_name!r} would not be written as parsed: {table}")
    try:  # the placeholders' variables must be set, as they must when the server starts
        environ = {**os.environ, _WORKSPACE_ENV: str(workspace)}
        resolved = parse_server_params(server_name, server, environ=environ, dotenv_path=workspace / ".env")
    except MCPServerError as e:
        raise ValueError(str(e)) from None
    beyond = beyond_workspace(workspace, config, resolved)
    unconfined = not sandboxed and config.kernel.gateway is None
    return Registration(
        server_name, server, table, server_name in config.servers, by_default, beyond, unconfined
    )


def beyond_workspace(workspace: Path, config: WorkspaceConfig, server: ServerParams) -> tuple[str, ...]:
    """What the sandbox of `server` (placeholders filled in) would let it do that the kernels of the
    workspace may not, one phrase each; empty when it stays within their bound, and always for a
    workspace whose kernels are not sandboxed (they can do anything then) and for a url server (which
    the host connects to, and which has no sandbox).

    The bound (see the module's docstring): written for a server that a client named and a rule may let
    through, so it only admits what is plainly within the workspace's own policy:

    - writable (its `cwd`, default the workspace, and each `allowWrite`): the workspace itself, an entry
      of its top level that is not a protected name (`.git`, `.ipybox`, `.env*`, ...), or a path the
      workspace's `allowWrite` names, also once symlinks are resolved. Not deeper in the workspace: a
      kernel can write there, so it could put a symlink in such a directory's place before the server
      starts, and the server's sandbox would then bind whatever the link names. Not a pattern unless the
      workspace's `allowWrite` has the same one. Its private `/tmp` is always its own.
    - `allowedDomains`: each covered by one of the workspace's (the same entry, or a wildcard over it;
      an exact host only by the same exact host, since only an exact entry may resolve to a private
      address); where one of the workspace's `deniedDomains` concerns it, the server's `deniedDomains`
      must cover that too; where the workspace limits the requests to a host it reaches (an entry's
      `methods`/`paths`, `readOnly`), the server's entry must allow no more (its methods and path globs
      among those, compared as written).
    - `allowUnixSockets`: only sockets the workspace's list has.
    - `denyRead` of the workspace, and its `denyWrite` inside what the server may write: kept.
    """
    if not (config.sandbox.enabled and isinstance(server, StdioServerParams)):
        return ()
    if (policy := server.sandbox_policy()) is None:
        return ()  # refused by `parse_registration`
    ours, home = config.sandbox.policy(), Path.home()
    root = os.path.realpath(workspace)
    # As the workspace starts it: relative to the workspace (`~` is not expanded), the workspace by default.
    cwd = os.path.normpath(os.path.join(root, server.cwd or "."))
    beyond: list[str] = []
    own_writable = {_absolute(entry, root, home) for entry in ours.filesystem.allow_write}
    writable = [(f"cwd {server.cwd!r}" if cwd != root else "cwd", cwd)]
    writable += [(f"allowWrite {e!r}", _absolute(e, cwd, home)) for e in policy.filesystem.allow_write]
    for key, path in writable:
        if (why := _not_writable(path, root, own_writable)) is not None:
            beyond.append(f"{key}: {why}")
    own_filter, server_filter = ours.network.domain_filter(), policy.network.domain_filter()
    for entry in policy.network.allowed_hosts:
        exact = not entry.startswith("*.")
        if not any(
            covers(own, entry) and (not exact or covers(entry, own)) for own in ours.network.allowed_hosts
        ):
            beyond.append(
                f"allowedDomains {entry!r}: not covered by the workspace's allowedDomains"
                + (" (an exact host needs the same exact host there)" if exact else "")
            )
            continue
        for denied in ours.network.denied_domains:
            overlap = entry if covers(denied, entry) else denied if covers(entry, denied) else None
            if overlap is not None and not any(covers(d, overlap) for d in policy.network.denied_domains):
                beyond.append(
                    f"allowedDomains {entry!r}: reaches {overlap!r}, which the workspace's deniedDomains has"
                )
        if (why := _rules_beyond(entry, server_filter, own_filter)) is not None:
            beyond.append(why)
    own_sockets = {_absolute(socket, root, home) for socket in ours.network.allow_unix_sockets}
    for socket in policy.network.allow_unix_sockets:
        if _absolute(socket, cwd, home) not in own_sockets:
            beyond.append(f"allowUnixSockets {socket!r}: not in the workspace's allowUnixSockets")
    hidden = {_absolute(entry, cwd, home) for entry in policy.filesystem.deny_read}
    for entry in ours.filesystem.deny_read:
        if _absolute(entry, root, home) not in hidden:
            beyond.append(f"denyRead: leaves out the workspace's {entry!r}, which kernels can't read")
    kept = {_absolute(entry, cwd, home) for entry in policy.filesystem.deny_write}
    for entry in ours.filesystem.deny_write:
        path = _absolute(entry, root, home)
        if path not in kept and any(_under(path, place) for _, place in writable):
            beyond.append(f"denyWrite: leaves out the workspace's {entry!r}, which kernels can't write")
    return tuple(beyond)


def _rules_beyond(entry: str, server: DomainFilter, own: DomainFilter) -> str | None:
    """Why the server's `entry` may ask more of a host than the workspace's request rules allow (methods,
    paths, readOnly), else None. Every restricted entry of the workspace that reaches a host `entry` does
    must allow at least what `entry` does: its methods and path globs (compared as written) among theirs."""
    mine = server.rule(entry)
    if mine is None:
        return None  # the server denies it itself
    for host in own.restricted_entries:
        theirs = own.rule(host)
        if theirs is None or not (covers(host, entry) or covers(entry, host)):
            continue
        if theirs.methods is not None and (mine.methods is None or not mine.methods <= theirs.methods):
            return (
                f"allowedDomains {entry!r}: may send methods that the workspace's entry {theirs.entry}"
                f"{' with readOnly = true' if theirs.read_only else ''} refuses (it allows "
                f"{', '.join(sorted(theirs.methods))}): give it those methods or fewer"
            )
        if theirs.paths is not None and (mine.paths is None or not set(mine.paths) <= set(theirs.paths)):
            return (
                f"allowedDomains {entry!r}: may ask for paths that the workspace's entry {theirs.entry} "
                f"refuses: give it paths among {', '.join(theirs.paths)}"
            )
    return None


def _absolute(entry: str, base: str, home: Path) -> str:
    """A policy path as the sandbox takes it (`~/...`, absolute, or relative to `base`), normalised."""
    if entry == "~" or entry.startswith("~/"):
        return os.path.normpath(os.path.join(home, entry[2:]))
    return os.path.normpath(os.path.join(base, entry))


def _under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


def _not_writable(path: str, root: str, own: set[str]) -> str | None:
    """Why a server may not write `path` (absolute, normalised) within the bound; `None` if it may."""
    if path in own:
        return None
    if any(char in path for char in "*?["):
        return "a pattern, and the workspace's allowWrite has no such pattern"
    for candidate in (path, os.path.realpath(path)):
        if candidate in own or candidate == root:
            continue
        through = " (through a symlink)" if candidate != path else ""
        if not _under(candidate, root):
            return f"{candidate} is outside the workspace{through}"
        name, *below = os.path.relpath(candidate, root).split(os.sep)
        if below:
            return (
                f"{candidate} is below the workspace's top level, where a kernel could put a symlink in its "
                "place before the server starts (give a top-level directory of the workspace)"
            )
        if name in DEFAULT_DENY_WRITE or fnmatchcase(name, DOTENV_PATTERN):
            return f"{candidate} is a name the workspace keeps from kernels{through}"
    return None


def _parsed(table: Mapping[str, Any]) -> ServerParams | None:
    """`table` (a written `[servers.<name>]`, `enabled` left out) as the model parses it; `None` if it
    does not parse."""
    try:
        return server_params_adapter().validate_python({k: v for k, v in table.items() if k != "enabled"})
    except ValidationError:
        return None


def _problems(error: ValidationError, accepted: str) -> str:
    problems = []
    for problem in error.errors():
        path = error_key(tuple(problem["loc"]))
        blamed = (problem.get("ctx") or {}).get("key")
        key = ".".join(str(part) for part in ["server_params", path, blamed] if part)
        got = problem.get("input")
        shown = "" if isinstance(got, Mapping) or not path else f" (got {got!r})"
        problems.append(f"{key}: {problem['msg']}{shown}")
    if any(p["type"] == "server_kind" and not error_key(tuple(p["loc"])) for p in error.errors()):
        problems.append(accepted)
    return "; ".join(problems)


def decide_own_call(policy: ApprovalPolicy, call: ToolCall, default: str) -> Verdict:
    """Decide a call of ipybox's own server (`ipybox.register_mcp_server`, `ipybox.upload_file`, ...) with
    the workspace's rules; when none decides, it is asked.

    The rules are tried as for a tool call (highest priority first; at equal priority deny, ask, allow;
    then file order), with two differences, because these calls act on the host (run what the client
    names, move files in and out of the workspace), which rules and defaults written for the tool calls of
    code did not have in mind:

    - `[approval] default` does not apply: without a rule, the call is asked (`default` says why).
    - An allow rule decides it only if its `server` names `ipybox` itself (not through a glob such as
      `*`), so a catch-all allow rule doesn't let clients do it. Deny and ask rules apply as to any call.
    """
    engine = RuleEngine(policy.rules, "ask")
    rules = policy.rules
    order = sorted(range(len(rules)), key=lambda i: (-rules[i].priority, -SEVERITY[rules[i].decision]))
    for index in order:
        rule, matcher = rules[index], engine.matchers[index]
        if rule.decision == "allow" and not _names_registrations(rule):
            continue
        if matcher.applies(call):
            return Verdict(rule.decision, rule_id(rule, index), f"{matcher.label} applies")
    return Verdict("ask", None, default)


def decide_registration(policy: ApprovalPolicy, registration: Registration) -> Verdict:
    """Decide a registration with the workspace's rules (`decide_own_call`); when none decides, it is
    asked, except in a workspace whose kernels are unconfined (`Registration.kernels_unconfined`), where
    it is allowed, as in ipybox 0.9.2. A registration whose sandbox goes beyond the workspace's
    (`Registration.exceeds`) is never allowed by a rule: the allow rule that applies asks instead, and the
    reason says why."""
    verdict = decide_own_call(
        policy, registration.call(), "no rule applies; registering an MCP server is asked by default"
    )
    if verdict.rule_id is None and registration.kernels_unconfined:
        # No widening: the kernels can start any host process and edit ipybox.toml themselves (see
        # `Registration.kernels_unconfined`). Never reached for a sandboxed workspace, where it is asked.
        return Verdict(
            "allow",
            None,
            "no rule applies; the workspace's kernels are not sandboxed, so they could start this server "
            "themselves: registering it is allowed",
        )
    if registration.exceeds is None or verdict.decision == "deny":
        return verdict
    if verdict.decision == "allow":
        return Verdict(
            "ask",
            verdict.rule_id,
            f"{verdict.reason.removesuffix(' applies')} would allow it, but {registration.exceeds}",
        )
    return Verdict("ask", verdict.rule_id, f"{verdict.reason}; {registration.exceeds}")


def _names_registrations(rule: Rule) -> bool:
    servers = [rule.server] if isinstance(rule.server, str) else rule.server
    return REGISTRATION_SERVER in servers


def load_workspace_config(workspace: Path) -> WorkspaceConfig:
    """The workspace's configuration, as the supervisor loads it.

    Raises:
        ValueError: `ipybox.toml` does not load (then nothing can be registered until it is fixed).
    """
    try:
        return load_config(workspace / CONFIG_FILE)
    except ConfigError as e:
        raise ValueError(
            f"{CONFIG_FILE} does not load, so nothing is registered until it is fixed:\n{e}"
        ) from None


def add_server(workspace: Path, registration: Registration) -> None:
    """Write `[servers.<name>]` into the workspace's `ipybox.toml`, replacing a server of that name;
    everything else in the file stays as it was (`ipybox.config.server_writer`).

    Raises:
        ValueError: The file would not load with the server in it, or would not hold exactly what was
            parsed (`ServerWriteError`); it is left unchanged.
    """
    write_server(workspace / CONFIG_FILE, registration.name, registration.table, replace=True)
