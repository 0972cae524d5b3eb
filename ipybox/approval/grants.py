"""`SessionGrants`: answers a person gave "for this session", remembered until the session ends.

A session is a lease on the workspace: one attached application, or one MCP session (each MCP session
holds a lease of its own). An answer for the session covers every later call of the same tool (for a
shell command: the same program) made by that session's kernels, in either direction: allowed without
asking, or denied without asking. Only `ask`s consult grants: a rule that allows or denies decides as
before, so a grant never lets through what a `deny` rule refuses.

It also counts each session's decided calls (`tally`, `calls`), for the history an approver shows with
an ask ([ask_context][ipybox.approval.ask_context]), and says which pending asks an answer for the
session covers (`covers`): the same test as `lookup`, so a session answer settles at once every ask it
would have answered had it come first.

Contract: pure bookkeeping (no I/O, no awaits); the supervisor calls `forget(session)` when the lease ends.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from ipybox.rules.calls import ToolCall

__all__ = ["Grant", "SessionGrants"]


@dataclass(frozen=True, slots=True)
class Grant:
    """An answer for a session: `accept` every call of `server.tool`; given `by` whom, `at` when."""

    accept: bool
    by: str
    at: datetime


class SessionGrants:
    """Grants by session, then by `(server, tool)`."""

    def __init__(self) -> None:
        self._grants: dict[str, dict[tuple[str, str], Grant]] = {}
        self._calls: dict[str, list[int]] = {}  # session -> [allowed, denied]

    def grant(self, session: str, call: ToolCall, accept: bool, by: str) -> Grant:
        """From now on, until `forget(session)`, calls of `call.server`/`call.tool` in `session` are
        `accept`ed (or refused) without asking."""
        grant = Grant(accept, by, datetime.now(UTC))
        self._grants.setdefault(session, {})[(call.server, call.tool)] = grant
        return grant

    def lookup(self, session: str | None, call: ToolCall) -> Grant | None:
        """The grant that answers `call` in `session`, if any."""
        if session is None:
            return None
        grants = self._grants.get(session)
        return grants.get((call.server, call.tool)) if grants is not None else None

    def forget(self, session: str) -> None:
        """The session ended: its grants (and its counts) go with it."""
        self._grants.pop(session, None)
        self._calls.pop(session, None)

    @staticmethod
    def covers(session: str, call: ToolCall, other_session: str | None, other: ToolCall) -> bool:
        """Whether an answer for `session` about `call` decides `other` of `other_session` (what `lookup`
        would find for it once granted): same session, same `server.tool` (for a shell command, the same
        program: its tool)."""
        return other_session == session and (other.server, other.tool) == (call.server, call.tool)

    def tally(self, session: str | None, allowed: bool) -> None:
        """Count a decided call of `session` (nothing without one)."""
        if session is not None:
            counts = self._calls.setdefault(session, [0, 0])
            counts[0 if allowed else 1] += 1

    def calls(self, session: str) -> tuple[int, int]:
        """`(allowed, denied)`: the calls of `session` decided so far."""
        counts = self._calls.get(session, [0, 0])
        return counts[0], counts[1]

    def of(self, session: str) -> dict[tuple[str, str], Grant]:
        """The grants of `session` (a copy)."""
        return dict(self._grants.get(session, {}))
