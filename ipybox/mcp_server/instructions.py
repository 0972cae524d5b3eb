"""What the MCP server tells the agent: its instructions and the notes of `execute_ipython_cell` and
`install_package`, rendered from the workspace's effective configuration (`ipybox.toml` with `.env` and the
environment over it), so that what the agent reads is what the workspace does.

The text comes from `templates/instructions.md.jinja`; `AgentFacts` is everything it may depend on, read
from a `WorkspaceConfig` by `facts_of` (pure: no file is read or written, so a server that has not started
its workspace yet can say the same as one that has). Never "sandboxed" when the sandbox is off; the network
sentence names the allowed hosts; the write sentence says where kernels may write; the ask sentence says
who answers a rule's `ask`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import jinja2

from ipybox.config import WorkspaceConfig

_TEMPLATES = Path(__file__).parent / "templates"

# The hosts pip needs for packages from PyPI (the index and the files it points at).
PACKAGE_INDEX_HOSTS = ("pypi.org", "files.pythonhosted.org")


@dataclass(frozen=True)
class AgentFacts:
    """What the agent is told about its workspace.

    Attributes:
        sandboxed: Kernels run in ipybox's sandbox (bubblewrap, Seatbelt).
        remote: Kernels run on a remote gateway (`[kernel.gateway]`), isolated by its cluster.
        hosts: The hosts sandboxed kernels may reach (`allowedDomains`); unused when not sandboxed.
        unknown_hosts_asked: A connection to another host is asked of the people present (`unknown = "ask"`).
        read_only_network: Allowed hosts take GET, HEAD and OPTIONS only.
        allow_write: Extra writable paths (`allowWrite`), as the file names them.
        console: A person can answer asks at the workspace's web console (`[endpoints] console`).
        default_decision: `[approval] default`: what a tool call no rule matches gets.
    """

    sandboxed: bool
    remote: bool = False
    hosts: tuple[str, ...] = ()
    unknown_hosts_asked: bool = False
    read_only_network: bool = False
    allow_write: tuple[str, ...] = ()
    console: bool = True
    default_decision: str = "ask"

    @property
    def package_index_reachable(self) -> bool:
        """Whether pip can reach PyPI from a kernel (always, unsandboxed; in the sandbox, when both of its
        hosts are allowed, or a wildcard covers them)."""
        if not self.sandboxed:
            return True
        return all(any(_covers(pattern, host) for pattern in self.hosts) for host in PACKAGE_INDEX_HOSTS)


def _covers(pattern: str, host: str) -> bool:
    if pattern.startswith("*."):
        return host.endswith(pattern[1:])
    return pattern == host


def facts_of(config: WorkspaceConfig) -> AgentFacts:
    """The facts of `config` that the agent is told."""
    network = config.sandbox.network
    hosts = tuple(entry if isinstance(entry, str) else entry.host for entry in network.allowed_domains)
    return AgentFacts(
        sandboxed=config.sandbox.enabled and config.kernel.gateway is None,
        remote=config.kernel.gateway is not None,
        hosts=hosts,
        unknown_hosts_asked=network.unknown == "ask",
        read_only_network=network.read_only,
        allow_write=tuple(config.sandbox.filesystem.allow_write),
        console=config.endpoints.console,
        default_decision=config.approval.default,
    )


@cache
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(_TEMPLATES),
        autoescape=False,  # plain text for an agent, not HTML
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
    )


def _render(block: str, facts: AgentFacts | None) -> str:
    template = _environment().get_template("instructions.md.jinja")
    context = template.new_context({"facts": facts, "index_hosts": PACKAGE_INDEX_HOSTS})
    text = "".join(template.blocks[block](context))
    # One paragraph per blank line; the template's own line breaks are only for reading it.
    return "\n\n".join(" ".join(part.split()) for part in text.strip().split("\n\n"))


def render_instructions(facts: AgentFacts | None) -> str:
    """The MCP server's `instructions` for a workspace with `facts` (`None`: its configuration does not
    load, so nothing is said about what its kernels may do)."""
    return _render("instructions", facts)


def cell_note(facts: AgentFacts | None) -> str:
    """What `execute_ipython_cell`'s description adds about where its code runs."""
    return _render("cell_note", facts)


def package_note(facts: AgentFacts | None) -> str:
    """What `install_package`'s description adds about whether it can work here."""
    return _render("package_note", facts)


def package_failure_hint(facts: AgentFacts) -> str | None:
    """Why a failed `install_package` most likely failed in this workspace, or `None` when nothing here
    explains it (pip's own output then does)."""
    if facts.package_index_reachable:
        return None
    return _render("package_failure", facts)
