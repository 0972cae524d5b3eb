"""What [DomainProxy][ipybox.sandbox.proxy.DomainProxy] asks, and is answered, about a host that is not in
`allowedDomains` when `[sandbox.network] unknown = "ask"`.

The proxy knows nobody who could answer: it is given a `HostAsker`, an async callable that returns a
`HostAnswer` (in a workspace, the supervisor's approver puts the question on its ask board and routes it
as the tool-call asks of the kernel that connected, when it can tell which one did: see
`HostQuestion.client_pid`; else to the people at the web console and in `ipybox approve`). The asker bounds the wait itself (`[approval] ask_timeout`)
and answers at once, with a refusal, when nobody can answer: the proxy holds the connection until it
returns.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

ASK_WITH_READ_ONLY = (
    "unknown = \"ask\" and readOnly = true don't go together: readOnly limits every host's requests, which "
    "the proxy reads through an interception CA made for the listed hosts, and an asked host is not listed; "
    "list the hosts, or drop readOnly"
)
"""Why a policy can't both ask about unknown hosts and be read-only."""

HostScope = Literal["once", "session", "always"]
"""How far an answer reaches: this connection (and the ones waiting on the same ask); every connection
to the host while the proxy runs (its session: the supervisor's run); or from now on, the host written
into `allowedDomains` (or `deniedDomains`) of `ipybox.toml` by the asker, which also counts as `session`
until the proxy's policy is next updated (`DomainProxy.update`, which the edit brings)."""


@dataclass(frozen=True, slots=True)
class HostQuestion:
    """A sandboxed client's connection to a host no entry allows.

    Attributes:
        host: The host name (normalized: lower case, no trailing dot or brackets).
        port: The port it connects to.
        method: `CONNECT`, or the plain-HTTP request's method.
        internal: When the host resolves to an address that is not globally reachable, which one and why
            (`"127.0.0.1: 127.0.0.0/8 (Loopback)"`): an answer that allows it lets the connection reach
            it, as an exact `allowedDomains` entry would; else `None`.
        client_pid: The id (in the proxy's pid namespace) of the process at the other end of the proxy's
            Unix socket, from the socket's peer credentials (`SO_PEERCRED`): in a sandbox, the kernel's
            bridge (`ipybox.sandbox.netbridge`), whose environment is the kernel's; `None` when it could
            not be read. A hint for choosing who is asked, never a credential: any process in the sandbox
            can connect to the socket, and a process can rewrite its own environment.
    """

    host: str
    port: int
    method: str
    internal: str | None = None
    client_pid: int | None = None

    @property
    def subject(self) -> str:
        """`connect to api.example.com:443`, with the internal address when there is one: what the people
        asked read."""
        text = f"connect to {self.host}:{self.port}"
        if self.internal is not None:
            text += f" (an internal address: {self.internal})"
        return text


@dataclass(frozen=True, slots=True)
class HostAnswer:
    """The answer to a `HostQuestion`.

    Attributes:
        allow: Let the connection through.
        scope: How far it reaches (`HostScope`).
        why: For the refusal sent to the client, what happened (`"denied once by console (root)"`,
            `"nobody answered within 60 s"`, `"nobody is connected to answer (...)"`); for an allow, who
            allowed it (logged).
    """

    allow: bool
    scope: HostScope = "once"
    why: str = ""


HostAsker = Callable[[HostQuestion], Awaitable[HostAnswer]]
"""Asks someone about a `HostQuestion`; returns when answered, timed out, or at once when nobody can
answer. It must not raise for any of these (an exception refuses the connection and is logged)."""
