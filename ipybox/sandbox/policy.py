"""`SandboxPolicy`: what a sandboxed kernel may read, write and reach.

The default: read the whole filesystem except `.env` files (in the workspace and its parent directories)
and the usual credential stores in the home directory; write only inside the workspace (whose top level
stays fixed, and whose protected names, `DEFAULT_DENY_WRITE`, stay read-only: the host acts on them
later) and a private `/tmp`; no network. How that holds on Linux: [view][ipybox.sandbox.view].

A policy file in the format of Anthropic's sandbox-runtime (as used by ipybox 0.9) is accepted:

```json
{"filesystem": {"denyRead": ["~/.ssh"], "allowWrite": ["/data/out"], "denyWrite": ["secrets/"]},
 "network": {"allowedDomains": ["pypi.org"], "deniedDomains": []}}
```

ipybox's additions to its network keys: an `allowedDomains` entry may be a table that limits the requests
to its host (`DomainRule`: `{"host": "api.github.com", "methods": ["GET"], "paths": ["/repos/**"]}`), and
`readOnly` limits every allowed host to GET, HEAD and OPTIONS; what they mean and how they are matched:
[domains][ipybox.sandbox.domains]. A policy using them is no longer a sandbox-runtime file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from ipybox.errors import IpyboxError
from ipybox.paths import user_policy_path, user_state_dir
from ipybox.sandbox.domains import (
    DomainFilter,
    domain_entry_error,
    method_error,
    normalize_host,
    path_glob_error,
)
from ipybox.sandbox.host_asks import ASK_WITH_READ_ONLY
from ipybox.sandbox.view import PathRule, View, rules_beside

DEFAULT_DENY_READ = (
    "~/.ssh",
    "~/.aws",
    "~/.gnupg",
    "~/.netrc",
    "~/.git-credentials",
    "~/.docker/config.json",
    "~/.config/gh",
    "~/.config/gcloud",
    "~/.kube",
    "~/.pypirc",
    "~/.npmrc",
)
# Names in the workspace that the host, or a developer's tools, read and act on later: a sandboxed
# process can neither change nor create them (see `ipybox.sandbox.view` for how that holds).
DEFAULT_DENY_WRITE = (
    # ipybox's own: configuration, state and tokens, and the packages it generates.
    "ipybox.toml",
    "ipybox.lock",
    ".ipybox",
    "mcptools",
    # git runs hooks and honours `core.hooksPath`/`core.fsmonitor` from a repository's config; pre-commit
    # and husky run what their files name on the next commit.
    ".git",
    ".gitmodules",
    ".pre-commit-config.yaml",
    ".husky",
    # Agents, editors and shells that run what they find in a project (direnv, Claude Code's hooks and
    # MCP servers, VS Code tasks, vim's exrc).
    ".envrc",
    ".mcp.json",
    ".claude",
    ".cursor",
    ".vscode",
    ".idea",
    ".devcontainer",
    ".exrc",
    ".nvimrc",
    ".nvim.lua",
    # Environments the host runs programs from: ipybox or an MCP server started from the workspace's own
    # virtualenv or node_modules imports what is there (a `.pth` in site-packages runs at every start), and
    # tox, nox and PDM run from theirs. What else the host executes from a workspace (a server's script,
    # its directory, a venv under another name) is derived from its configuration: see
    # `ipybox.sandbox.executables`.
    ".venv",
    "venv",
    "node_modules",
    "__pypackages__",
    ".tox",
    ".nox",
    # A workspace that is a home directory: the tool caches and installs that npx, uvx, nvm, pyenv,
    # rustup, bun and deno run programs from.
    ".npm",
    ".nvm",
    ".pyenv",
    ".cargo",
    ".rustup",
    ".bun",
    ".deno",
    ".cache",
    # A workspace that is a home directory: shell start-up files and the directories programs run
    # things from (`~/.local/bin`, `~/.config/autostart`, IPython start-up scripts, ipybox's registry).
    ".bashrc",
    ".bash_profile",
    ".bash_login",
    ".bash_logout",
    ".profile",
    ".zshrc",
    ".zshenv",
    ".zprofile",
    ".zlogin",
    ".gitconfig",
    ".config",
    ".local",
    ".ipython",
    ".jupyter",
)
# Hidden in the workspace and in each of its parents.
DOTENV_PATTERN = ".env*"
STATE_DIR = ".ipybox"
"""A workspace's state directory (by default): hidden in the workspace and in each of its parents."""
OTHER_SECRETS = (DOTENV_PATTERN, STATE_DIR)
"""Hidden in each directory beside the workspace that holds one (other projects' and workspaces'); see
`View.hidden_beside`."""


class SandboxPolicyError(IpyboxError, ValueError):
    """A sandbox policy file is missing, not JSON, or has unknown or mistyped keys."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class FilesystemPolicy(_Strict):
    """Paths: absolute, `~/...`, or relative to the workspace."""

    deny_read: list[str] = Field(default_factory=list, alias="denyRead")
    allow_write: list[str] = Field(default_factory=list, alias="allowWrite")
    deny_write: list[str] = Field(default_factory=list, alias="denyWrite")


class DomainRule(_Strict):
    """An `allowedDomains` entry that limits the requests to its host (see [domains][ipybox.sandbox.domains]
    for how they are matched and enforced).

    Attributes:
        host: A host name (`api.github.com`), a wildcard for subdomains (`*.github.com`) or an IP address,
            as a plain entry.
        methods: The HTTP methods allowed (upper case, e.g. `["GET", "HEAD"]`). Default: any.
        paths: Globs over the request's path, each starting with `/` (`*` within a segment, `**` across
            segments; `/repos/**` is `/repos` and everything below it; the query string is not matched).
            Requests whose paths have `.`/`..` or empty segments, or an encoded `/`, `\\` or NUL, are
            refused. Default: any path.

    Example:
        ```python
        rule = DomainRule.model_validate({"host": "api.github.com", "methods": ["GET"], "paths": ["/r/**"]})
        ```
    """

    host: str
    methods: list[str] | None = None
    paths: list[str] | None = None

    @field_validator("host")
    @classmethod
    def _valid_host(cls, host: str) -> str:
        if (problem := domain_entry_error(host)) is not None:
            raise ValueError(problem)
        return host

    @field_validator("methods")
    @classmethod
    def _valid_methods(cls, methods: list[str] | None) -> list[str] | None:
        if methods is not None:
            if not methods:
                raise ValueError("methods is empty, which would allow nothing: leave it out to allow any")
            for method in methods:
                if (problem := method_error(method)) is not None:
                    raise ValueError(problem)
        return methods

    @field_validator("paths")
    @classmethod
    def _valid_paths(cls, paths: list[str] | None) -> list[str] | None:
        if paths is not None:
            if not paths:
                raise ValueError("paths is empty, which would allow nothing: leave it out to allow any")
            for glob in paths:
                if (problem := path_glob_error(glob)) is not None:
                    raise ValueError(problem)
        return paths


def _entry_kind(value: Any) -> str:
    # An object is a table, anything else a plain entry: errors then come from that form alone.
    return "table" if isinstance(value, dict | DomainRule) else "host"


AllowedDomain = Annotated[
    Annotated[str, Tag("host")] | Annotated[DomainRule, Tag("table")], Discriminator(_entry_kind)
]
"""An `allowedDomains` entry: a host string, or a `DomainRule` table."""


class NetworkPolicy(_Strict):
    """Host names (`pypi.org`), subdomain wildcards (`*.pythonhosted.org`) or IP addresses.

    Attributes:
        allowed_domains: Reachable through ipybox's filtering proxy (nothing by default). An entry may be
            a table that limits the requests to its host: `{ host = "api.github.com", methods = ["GET"],
            paths = ["/repos/**"] }` (`DomainRule`).
        denied_domains: Never reachable, even when an allowed entry covers them.
        read_only: Limit every allowed host to GET, HEAD and OPTIONS requests (a table's own `methods`
            narrow that further). HTTPS requests are checked by reading them, through the workspace's
            interception CA.
        unknown: What a connection to a host no allowed entry covers gets: `"deny"` (refused at once, the
            default) or `"ask"` (a person at the web console or `ipybox approve` is asked, and the
            connection waits for the answer: [DomainProxy][ipybox.sandbox.proxy.DomainProxy]). Denied
            hosts are never asked about. Not with `read_only`.
        allow_unix_sockets: Host Unix sockets the sandbox may connect to (e.g. an SSH agent).
        allow_all_unix_sockets: sandbox-runtime's switch for every socket: refused (name them instead).
        allow_local_binding: Accepted for sandbox-runtime files; a sandbox can always listen on its own
            loopback, which is its alone.
        http_proxy_port: Accepted for sandbox-runtime files and ignored (ipybox picks its own).
        socks_proxy_port: Likewise.
    """

    allowed_domains: list[AllowedDomain] = Field(default_factory=list, alias="allowedDomains")
    denied_domains: list[str] = Field(default_factory=list, alias="deniedDomains")
    read_only: bool = Field(default=False, alias="readOnly")
    unknown: Literal["deny", "ask"] = "deny"
    allow_unix_sockets: list[str] = Field(default_factory=list, alias="allowUnixSockets")
    allow_all_unix_sockets: bool = Field(default=False, alias="allowAllUnixSockets")
    allow_local_binding: bool = Field(default=True, alias="allowLocalBinding")
    http_proxy_port: int | None = Field(default=None, alias="httpProxyPort")
    socks_proxy_port: int | None = Field(default=None, alias="socksProxyPort")

    @field_validator("allow_all_unix_sockets")
    @classmethod
    def _named_sockets_only(cls, value: bool) -> bool:
        if value:
            raise ValueError(
                "ipybox does not open every Unix socket of the host to a sandbox: list the ones it needs "
                "in allowUnixSockets"
            )
        return value

    @field_validator("allowed_domains")
    @classmethod
    def _valid_allowed(cls, entries: list[str | DomainRule]) -> list[str | DomainRule]:
        for entry in entries:
            if isinstance(entry, str) and (problem := domain_entry_error(entry)) is not None:
                raise ValueError(problem)
        return entries

    @field_validator("denied_domains")
    @classmethod
    def _valid_denied(cls, entries: list[str]) -> list[str]:
        for entry in entries:
            if (problem := domain_entry_error(entry)) is not None:
                raise ValueError(problem)
        return entries

    @model_validator(mode="after")
    def _rules_agree(self) -> NetworkPolicy:
        # A host listed twice with different rules, or an entry readOnly leaves no method: the filter says.
        self.domain_filter()
        if self.unknown == "ask" and self.read_only:
            raise ValueError(ASK_WITH_READ_ONLY)
        return self

    @property
    def allowed_hosts(self) -> list[str]:
        """The host of each `allowedDomains` entry, tables' included (as written)."""
        return [entry if isinstance(entry, str) else entry.host for entry in self.allowed_domains]

    def domain_filter(self) -> DomainFilter:
        """The hosts, and the requests to them, this policy lets a sandbox reach.

        Raises:
            ValueError: A host is listed twice with different rules, or an entry's methods leave none
                with `read_only`.
        """
        return DomainFilter(self.allowed_domains, self.denied_domains, read_only=self.read_only)

    def restricted_hosts(self) -> list[str]:
        """The allowed entries whose requests are checked (methods or paths limited, or `read_only`),
        normalized: the proxy's interception CA must be made for these (and the secrets' hosts)."""
        return [normalize_host(entry) for entry in self.domain_filter().restricted_entries]


class SandboxPolicy(_Strict):
    """What a sandboxed kernel may do, on top of the defaults (which a policy can only extend).

    Attributes:
        filesystem: Extra paths to hide (`deny_read`), to make writable (`allow_write`) or read-only
            (`deny_write`).
        network: `allowed_domains` the kernel may reach through ipybox's filtering proxy (none by default).
    """

    filesystem: FilesystemPolicy = Field(default_factory=FilesystemPolicy)
    network: NetworkPolicy = Field(default_factory=NetworkPolicy)
    # sandbox-runtime options without a counterpart here, accepted so its files load unchanged: ipybox has
    # no weaker nested mode, and reports nothing that violations could be ignored from.
    enable_weaker_nested_sandbox: bool = Field(default=False, alias="enableWeakerNestedSandbox")
    ignore_violations: dict[str, list[str]] = Field(default_factory=dict, alias="ignoreViolations")

    @classmethod
    def from_file(cls, path: str | Path) -> SandboxPolicy:
        """Read a policy file (JSON, sandbox-runtime format).

        Raises:
            SandboxPolicyError: The file is missing, not JSON, or has unknown or mistyped keys (named in the
                message); a `ValueError`.
        """
        path = Path(path)
        try:
            data: Any = json.loads(path.read_text())
        except FileNotFoundError:
            raise SandboxPolicyError(f"sandbox policy {path}: no such file") from None
        except json.JSONDecodeError as e:
            raise SandboxPolicyError(
                f"sandbox policy {path}:{e.lineno}:{e.colno}: not valid JSON: {e.msg}"
            ) from None
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in error['loc']) or '(top level)'}: {error['msg']}"
                for error in e.errors()
            )
            raise SandboxPolicyError(f"sandbox policy {path}: {problems}") from None

    def view(
        self,
        workspace: Path,
        home: Path,
        *,
        writable: Sequence[Path] = (),
        readable: Sequence[Path] = (),
    ) -> View:
        """What a Linux sandbox confined by this policy sees (see [view][ipybox.sandbox.view]).

        Args:
            workspace: The working directory (resolved), writable but for the protected names.
            home: What `~` stands for.
            writable: More paths to bind read-write (a kernel's own directories).
            readable: More paths to keep visible read-only (under the private `/tmp`).
        """
        hidden = [PathRule(str(directory), DOTENV_PATTERN) for directory in (workspace, *workspace.parents)]
        # A workspace's state (tokens, audit log) is none of a kernel's business, nor are other workspaces'
        # (in a parent, or beside it) and other projects' `.env` files beside it (see `OTHER_SECRETS`).
        hidden += [PathRule(str(directory), STATE_DIR) for directory in (workspace, *workspace.parents)]
        # Nor the host's ipybox state: the server registry (which names other projects' servers and
        # secrets) and the gateways' tokens; nothing in a sandbox reads it.
        state = user_state_dir()
        if not workspace.is_relative_to(state):
            hidden.append(PathRule(str(state), ""))
        hidden += [
            _rule(entry, workspace, home) for entry in (*DEFAULT_DENY_READ, *self.filesystem.deny_read)
        ]
        protected = [PathRule(str(workspace), name) for name in DEFAULT_DENY_WRITE]
        protected += [_rule(entry, workspace, home) for entry in self.filesystem.deny_write]
        # The host's own ipybox state (the server registry) lives here, whatever the workspace; and the
        # admin policy's user tier, which a workspace's rules must not be able to loosen.
        protected.append(PathRule(str(user_state_dir()), ""))
        protected.append(PathRule(str(user_policy_path().parent), ""))
        allow_write = [_rule(entry, workspace, home) for entry in self.filesystem.allow_write]
        return View(
            workspace=str(workspace),
            writable=[*(str(p) for rule in allow_write for p in _expand(rule)), *map(str, writable)],
            readable=[str(path) for path in readable],
            sockets=[str(Path(sock).expanduser()) for sock in self.network.allow_unix_sockets],
            hidden=hidden,
            protected=protected,
            hidden_beside=list(OTHER_SECRETS),
        )

    def guarding(self, workspace: Path, state_dir: Path, *, cwd: Path) -> SandboxPolicy:
        """This policy for a process that works for `workspace` from `cwd` (its sandbox's working dir): a
        view guards the names of its own working dir only, so when `cwd` is not `workspace` (a server
        started in a subdirectory, or elsewhere) the workspace's `.env*` files and `.ipybox` are hidden
        and its protected names read-only here too, and the workspace's state (`state_dir`, wherever it
        is) is hidden and read-only unless it is `cwd`'s `.ipybox`, which the view hides already. Returns
        this policy itself when nothing is missing. All paths absolute."""
        cwd, workspace, state_dir = cwd.resolve(), workspace.resolve(), state_dir.resolve()
        hide: list[str] = []
        protect: list[str] = []
        if cwd != workspace:
            hide += [str(workspace / DOTENV_PATTERN), str(workspace / ".ipybox")]
            protect += [str(workspace / name) for name in DEFAULT_DENY_WRITE]
        if state_dir != cwd / ".ipybox":
            hide.append(str(state_dir))
            protect.append(str(state_dir))
        if not hide and not protect:
            return self
        files = self.filesystem.model_copy(
            update={
                "deny_read": [*self.filesystem.deny_read, *hide],
                "deny_write": [*self.filesystem.deny_write, *protect],
            }
        )
        return self.model_copy(update={"filesystem": files})

    def deny_read_paths(self, workspace: Path, home: Path) -> list[Path]:
        """Existing files and directories to hide: `.env` files in the workspace and its parents, the
        credential stores in `home`, and what the policy names."""
        found: list[Path] = []
        for directory in (workspace, *workspace.parents):
            found.extend(sorted(directory.glob(".env*")))
            found.append(directory / STATE_DIR)
        for rule in rules_beside(str(workspace), list(OTHER_SECRETS)):
            found.extend(sorted(Path(rule.base).glob(rule.pattern)))
        if not workspace.is_relative_to(user_state_dir()):
            found.append(user_state_dir())
        for entry in (*DEFAULT_DENY_READ, *self.filesystem.deny_read):
            found.extend(_matches(entry, workspace, home))
        return _existing_unique(found)

    def allow_write_paths(self, workspace: Path, home: Path) -> list[Path]:
        paths = [workspace]
        for entry in self.filesystem.allow_write:
            paths.extend(_matches(entry, workspace, home))
        return _existing_unique(paths)

    def deny_write_paths(self, workspace: Path, home: Path) -> list[Path]:
        paths: list[Path] = []
        for entry in (*DEFAULT_DENY_WRITE, *self.filesystem.deny_write):
            paths.extend(_matches(entry, workspace, home))
        return _existing_unique(paths)


def _rule(entry: str, workspace: Path, home: Path) -> PathRule:
    """A policy entry as a literal base directory and a pattern relative to it: only the entry is a
    pattern, a workspace or home whose own path holds `*?[` is taken literally."""
    if entry.startswith("~/") or entry == "~":
        return PathRule(str(home), entry[2:])
    if Path(entry).is_absolute():
        parent = Path(entry).parent
        if not any(char in str(parent) for char in "*?["):
            # Only the last name is a pattern: it covers names made later too (see `PathRule`).
            return PathRule(str(parent), Path(entry).name)
        anchor = Path(entry).anchor
        return PathRule(anchor, str(Path(entry).relative_to(anchor)))
    return PathRule(str(workspace), entry)


def _expand(rule: PathRule) -> list[Path]:
    base = Path(rule.base)
    if any(char in rule.pattern for char in "*?["):
        return sorted(base.glob(rule.pattern))
    return [base / rule.pattern if rule.pattern else base]


def _matches(entry: str, workspace: Path, home: Path) -> list[Path]:
    return _expand(_rule(entry, workspace, home))


def _existing_unique(paths: list[Path]) -> list[Path]:
    seen: dict[Path, None] = {}
    for path in paths:
        if os.path.lexists(path):  # False, not PermissionError, behind a directory this user can't enter
            seen.setdefault(path.resolve() if path.is_symlink() else path, None)
    return list(seen)
