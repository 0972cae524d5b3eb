"""The values the rule engine works on: a tool call, and the verdict on it.

`ToolCall` is the one model of a tool call in ipybox: the tool server builds it from a kernel's request on
the call channel, approvers decide on it, the approval wire format carries it to an application, and the
audit log records it. Nothing else models a call.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Label = Literal["untrusted", "private", "trusted"]
"""How far content a tool returned is trusted (`ipybox.rules.provenance`): `untrusted` (anyone may have
written it: a web page, an email, an issue comment), `private` (the user's own data, which must not leak),
`trusted`."""

Decision = Literal["allow", "deny", "ask"]
"""What happens to a tool call: run it, refuse it, or ask the connected application."""

AskRoute = Literal["application", "elicitation", "console", "terminal"]
"""Where an `ask` can be answered: the application attached to the calling kernel, the MCP client's
elicitation, the web console, `ipybox approve` (see `ipybox.approval.asks`)."""


@dataclass(frozen=True, slots=True)
class Origin:
    """A tool result delivered to a session, as provenance names it: "`web.fetch` result 3, untrusted".

    Attributes:
        server: The server that returned it.
        tool: The tool that returned it.
        serial: The result's number in its session (1 for the session's first result), counted on the host.
        label: Its trust label (`untrusted`, `private`, `trusted`).
        time: When it was delivered (Unix time, seconds).
    """

    server: str
    tool: str
    serial: int
    label: Label
    time: float = 0.0

    def describe(self) -> str:
        """How people read it: `web.fetch result 3, untrusted`."""
        return f"{self.server}.{self.tool} result {self.serial}, {self.label}"

    def to_json(self) -> dict[str, Any]:
        """The origin as the audit log and the approval wire carry it."""
        return {
            "server": self.server,
            "tool": self.tool,
            "serial": self.serial,
            "label": self.label,
            "time": round(self.time, 3),
        }


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A call of an MCP tool, from the kernel that made it to the audit log.

    Attributes:
        server: Name of the MCP server (as configured in the workspace).
        tool: Name of the tool on that server.
        args: The call's arguments (JSON values).
        annotations: The tool's MCP annotations (`readOnlyHint`, `destructiveHint`, `idempotentHint`,
            `openWorldHint`, `title`) as the server declares them; rules read only the boolean hints, and
            an undeclared (or non-boolean) hint takes the MCP default. The tool server passes those known
            before the server starts (a call is decided first), which may be none. With the MCP SDK:
            `tool.annotations.model_dump(exclude_none=True)` if `tool.annotations` else `{}`.
        caller: Who made the call: the name the tool server issued its token under
            (`ToolServer.add_caller`, e.g. one kernel of a workspace), or "" for the shared call token.
            It routes an `ask` to whoever answers for that caller; it is never recorded or shown.
        cell: The number of the kernel's cell that made the call, as the kernel reports it (`None` when
            it does not). Counts a rule's `max_calls.cell`; it comes from the kernel, so code in it can
            claim a new cell (`max_calls.session`, counted on the host, is the bound it cannot reset).
        code: The hex SHA-256 of that cell's text, as the kernel reports it (`None` when it does not):
            the audit log records it, so a call can be traced to the code that made it.
        provenance: Where argument values came from, by argument path (`to`, `options.mode`,
            `recipients.0`): the recorded results of the same session each value matched
            (`ipybox.rules.provenance`), newest first. Filled in by the tool server on the host; a signal,
            not a proof (code in the kernel can transform a value until it no longer matches).
        session_read: The labels of content the calling session has been delivered, each with the first
            result that brought it (one `Origin` per label, oldest first). Recorded on the host by the
            tool server, so code in the kernel cannot clear it.
    """

    server: str
    tool: str
    args: Mapping[str, Any] = field(default_factory=dict)
    annotations: Mapping[str, Any] = field(default_factory=dict)
    caller: str = ""
    cell: int | None = None
    code: str | None = None
    provenance: Mapping[str, tuple[Origin, ...]] = field(default_factory=dict)
    session_read: tuple[Origin, ...] = ()

    def read_labels(self) -> frozenset[str]:
        """The labels the calling session has read (`session_read`)."""
        return frozenset(origin.label for origin in self.session_read)

    def argument_labels(self, path: str | None = None) -> frozenset[str]:
        """The labels of the results argument values matched: of every argument, or of the one at `path`
        (a dotted path; values nested under it count)."""
        prefix = None if path is None else path + "."
        return frozenset(
            origin.label
            for key, origins in self.provenance.items()
            if path is None or key == path or (prefix is not None and key.startswith(prefix))
            for origin in origins
        )


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the approval policy decided for a tool call.

    Attributes:
        decision: `allow`, `deny` or `ask`.
        rule_id: The rule that decided: its `id`, or `rules[<index>]` (0-based, in file order) for a rule
            without one. `None` when no rule applied and the policy's `default` decided.
        reason: A short explanation for humans (logs, prompts).
        tier: The policy the deciding rule belongs to: `None` for the workspace's `ipybox.toml`, else the
            admin tier's name (`system`, `user`; see `ipybox.config.admin_policy`).
        explanation: The deciding rule's `reason`, written for the calling code ("writes go under out/"),
            when it has one.
    """

    decision: Decision
    rule_id: str | None
    reason: str
    tier: str | None = None
    explanation: str | None = None


def provenance_json(provenance: Mapping[str, tuple[Origin, ...]]) -> dict[str, list[dict[str, Any]]]:
    """`ToolCall.provenance` as JSON (the approval wire, `AskView`)."""
    return {path: [origin.to_json() for origin in origins] for path, origins in provenance.items()}


def origin_text(path: str, origins: Iterable[Mapping[str, Any]]) -> str:
    """One argument's provenance as people read it, from its JSON origins:
    `` `to` = a value from web.fetch result 3, untrusted``."""
    described = "; ".join(
        f"{o.get('server')}.{o.get('tool')} result {o.get('serial')}, {o.get('label')}" for o in origins
    )
    return f"`{path}` = a value from {described}"


def is_untrusted(origins: Iterable[Mapping[str, Any]]) -> bool:
    """Whether any of these JSON origins is labelled `untrusted` (shown highlighted)."""
    return any(o.get("label") == "untrusted" for o in origins)


def origins_of(data: Mapping[str, Any]) -> dict[str, tuple[Origin, ...]]:
    """`provenance_json` read back (origins that are not well formed are left out)."""
    out: dict[str, tuple[Origin, ...]] = {}
    for path, origins in data.items():
        read = tuple(
            Origin(str(o["server"]), str(o["tool"]), int(o["serial"]), o["label"], float(o.get("time", 0)))
            for o in origins
            if isinstance(o, Mapping)
            and o.get("label") in ("untrusted", "private", "trusted")
            and {"server", "tool", "serial"} <= o.keys()
        )
        if read:
            out[str(path)] = read
    return out
