"""`AskBoard`: the `ask`s of a running workspace that wait for an answer, and the people who can give one.

An `ask` (a rule said "ask" about a tool call, or a shell command of a line) is put to *routes*, in the
order `[approval] ask` lists them (`ASK_ROUTES` is the default):

- `application`: the application attached to the calling kernel's lease (the SDK's `stream()`);
- `elicitation`: the MCP client of the calling session, when it supports elicitation;
- `console`: the web console's open pages;
- `terminal`: `ipybox approve` processes.

The first route that can answer is the one asked (`asked_of`). People (`console`, `terminal`) listed in
`[approval] ask` see every pending ask and may answer it whoever else was asked: the person running the
workspace outranks a dialog nobody looks at. The first answer wins; the ask is then closed everywhere
(`AskClosed` goes to every subscriber, and the application or MCP client asked is told to withdraw its
question).

Contracts:

- Pure asyncio bookkeeping, one event loop: no I/O. The approver opens and closes asks; the console and
  `ipybox approve` subscribe to events and answer through the approver (which writes `always` rules).
- `answer()` settles a pending ask at most once: a second answer (a person clicking after the application
  answered) gets `False`, and the board's `closed` record says who answered first.
- A subscriber gets the asks pending when it subscribed (`Subscription.pending`), then every `AskOpened`
  and `AskClosed` in order. A subscriber that does not read is cut off after `MAX_QUEUED` events (its
  queue gets `None` and it should resubscribe), so a stuck browser tab never holds memory.
- Who is present: `present(route)` is held while a console page's event stream or an `ipybox approve`
  connection is open; `people(route)` counts them. A route with nobody present cannot answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import secrets
from collections import Counter, OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Final, Literal, get_args

from ipybox.approval.ask_context import CellView, ClientView
from ipybox.approval.links import PathLink
from ipybox.rules.calls import AskRoute, ToolCall, Verdict

__all__ = [
    "ASK_ROUTES",
    "MAX_QUEUED",
    "PEOPLE",
    "AskAnswer",
    "AskBoard",
    "AskClosed",
    "AskEvent",
    "AskOpened",
    "AskRoute",
    "PendingAsk",
    "Scope",
    "Subscription",
]

ASK_ROUTES: Final[tuple[AskRoute, ...]] = get_args(AskRoute)
"""Every route, in the default order of `[approval] ask`."""
PEOPLE: Final[frozenset[AskRoute]] = frozenset({"console", "terminal"})
"""The routes where a person answers: they see every pending ask."""

Scope = Literal["once", "session", "always"]
"""How far an answer reaches: this call only; every call of the same tool in the calling session (its lease,
i.e. the application or MCP session) until it ends; or from now on, as a rule written into `ipybox.toml`."""
SCOPES: Final[tuple[Scope, ...]] = get_args(Scope)

MAX_QUEUED: Final = 1000
"""Events a subscriber may leave unread before it is cut off."""

_CLOSED_KEPT: Final = 256  # answers remembered, to tell a late answerer who was first


@dataclass(frozen=True, slots=True)
class AskAnswer:
    """An answer to a pending ask.

    Attributes:
        accept: Let the call run.
        scope: `once`, `session` or `always` (see `Scope`).
        route: Where the answer came from.
        by: Who, for the audit log and the other approvers: e.g. `"console (root)"`,
            `"terminal (alice on /dev/pts/3)"`, `"the MCP client"`.
        choices: For `always`: what the rule written requires of each argument, by name (`any`,
            `exact`, `glob:PATTERN`; see `ipybox.config.rule_writer`), as the person narrowed its
            preview; `None` (or an argument left out): the writer's safe default.
    """

    accept: bool
    scope: Scope = "once"
    route: AskRoute = "application"
    by: str = ""
    choices: Mapping[str, str] | None = field(default=None, hash=False)

    def describe(self) -> str:
        """`allowed once from the console (root)`."""
        verb = "allowed" if self.accept else "denied"
        reach = {"once": "once", "session": "for this session", "always": "always"}[self.scope]
        return f"{verb} {reach} by {self.by or self.route}"


@dataclass(eq=False)
class PendingAsk:
    """A tool call (or one command of a shell line) waiting for a person's or an application's answer.

    Attributes:
        id: Opaque and unguessable (the console's forms and `ipybox approve` answer by it).
        call: The call (`call.caller` is never shown).
        rule_id: The rule that asked (`None`: the default decision).
        reason: Why it asked (`Verdict.reason`).
        subject: For one command of a shell line: the command as text; else `None`.
        session: The lease of the calling kernel (an application or MCP session), `None` if no lease holds
            it; `session` answers reach that far.
        asked_of: The route asked first; `None` when only people can answer.
        routes: Every route that may answer it (`asked_of` and the people listed in `[approval] ask`).
        asked_at: When it was opened (UTC).
        timeout: Seconds it waits before the call is denied (`None`: no limit).
        links: Path arguments that lead elsewhere through a link, by argument name (resolved on the host
            when the ask was opened: [links][ipybox.approval.links]).
        tier: The admin policy the asking rule belongs to (`Verdict.tier`; `None`: `ipybox.toml`).
        explanation: The asking rule's own `reason` text (`Verdict.explanation`), when it has one.
        cell: The code of the cell that made the call, when known ([ask_context][ipybox.approval.ask_context]).
        client: Who asked: the session's name and history, when a session holds the calling kernel.
    """

    id: str
    call: ToolCall
    rule_id: str | None
    reason: str
    subject: str | None
    session: str | None
    asked_of: AskRoute | None
    routes: tuple[AskRoute, ...]
    asked_at: datetime
    timeout: float | None
    answered: asyncio.Future[AskAnswer] = field(repr=False)
    links: Mapping[str, PathLink] = field(default_factory=dict)
    tier: str | None = None
    explanation: str | None = None
    cell: CellView | None = None
    client: ClientView | None = None

    @property
    def done(self) -> bool:
        return self.answered.done()


@dataclass(frozen=True, slots=True)
class AskOpened:
    ask: PendingAsk


@dataclass(frozen=True, slots=True)
class AskClosed:
    """An ask left the board: answered (`answer`), or withdrawn (`answer` is `None`; `why` says why: the
    time ran out, the calling code went away)."""

    ask: PendingAsk
    answer: AskAnswer | None
    why: str = ""


AskEvent = AskOpened | AskClosed


class Subscription:
    """Events for one console page or `ipybox approve` connection (see `AskBoard.subscribe`).

    Attributes:
        pending: The asks pending when it subscribed, oldest first.
        events: `AskOpened` / `AskClosed` from then on; `None` once it was cut off for not reading.
    """

    def __init__(self, pending: list[PendingAsk]) -> None:
        self.pending = pending
        self.events: asyncio.Queue[AskEvent | None] = asyncio.Queue()
        self.cut_off = False

    def _put(self, event: AskEvent) -> None:
        if self.cut_off:
            return
        if self.events.qsize() >= MAX_QUEUED:
            self.cut_off = True
            self.events.put_nowait(None)
            return
        self.events.put_nowait(event)


class AskBoard:
    """The pending asks of a workspace, their subscribers, and the people present to answer."""

    def __init__(self) -> None:
        self._pending: OrderedDict[str, PendingAsk] = OrderedDict()
        self._closed: OrderedDict[str, AskAnswer | None] = OrderedDict()
        self._settled: dict[
            str, int
        ] = {}  # asks an answer settled, by the ask it was given to (kept as _closed)
        self._subscribers: set[Subscription] = set()
        self._present: Counter[AskRoute] = Counter()
        self._serial = itertools.count(1)

    # -- asks

    def open(
        self,
        call: ToolCall,
        verdict: Verdict,
        *,
        asked_of: AskRoute | None,
        routes: tuple[AskRoute, ...],
        session: str | None = None,
        subject: str | None = None,
        timeout: float | None = None,
        links: Mapping[str, PathLink] | None = None,
        cell: CellView | None = None,
        client: ClientView | None = None,
    ) -> PendingAsk:
        """Put an ask on the board and tell every subscriber."""
        ask = PendingAsk(
            id=f"{next(self._serial)}-{secrets.token_urlsafe(12)}",
            call=call,
            rule_id=verdict.rule_id,
            reason=verdict.reason,
            subject=subject,
            session=session,
            asked_of=asked_of,
            routes=routes,
            asked_at=datetime.now(UTC),
            timeout=timeout,
            answered=asyncio.get_running_loop().create_future(),
            links=dict(links or {}),
            tier=verdict.tier,
            explanation=verdict.explanation,
            cell=cell,
            client=client,
        )
        self._pending[ask.id] = ask
        self._publish(AskOpened(ask))
        return ask

    def get(self, ask_id: str) -> PendingAsk | None:
        """The pending ask `ask_id` (`None`: never opened, or closed)."""
        return self._pending.get(ask_id)

    @property
    def pending(self) -> list[PendingAsk]:
        """The pending asks, oldest first."""
        return list(self._pending.values())

    def answer(self, ask_id: str, answer: AskAnswer) -> bool:
        """Answer a pending ask; `False` when it is not pending any more (answered first elsewhere, timed
        out, withdrawn) or `answer.route` may not answer it."""
        ask = self._pending.get(ask_id)
        if ask is None or ask.answered.done() or answer.route not in ask.routes:
            return False
        ask.answered.set_result(answer)
        self.close(ask, answer)
        return True

    def close(self, ask: PendingAsk, answer: AskAnswer | None = None, why: str = "") -> None:
        """Take `ask` off the board (idempotent): answered with `answer`, or withdrawn for `why`."""
        if self._pending.pop(ask.id, None) is None:
            return
        self._closed[ask.id] = answer
        while len(self._closed) > _CLOSED_KEPT:
            gone, _ = self._closed.popitem(last=False)
            self._settled.pop(gone, None)
        if not ask.answered.done():
            ask.answered.cancel()
        self._publish(AskClosed(ask, answer, why))

    def note_settled(self, ask_id: str, count: int) -> None:
        """The answer given to `ask_id` settled `count` asks (it and the pending asks it covered: an answer
        "for this session"); `settled_with` tells the answerer."""
        if ask_id in self._closed:
            self._settled[ask_id] = count

    def settled_with(self, ask_id: str) -> int:
        """How many asks the answer given to `ask_id` settled: 1 for one answered alone, more for an answer
        "for this session" that covered others (`note_settled`), 0 for one not answered (or forgotten)."""
        if self._closed.get(ask_id) is None:
            return 0
        return self._settled.get(ask_id, 1)

    def closed_answer(self, ask_id: str) -> tuple[bool, AskAnswer | None]:
        """Whether `ask_id` was on the board and is closed now, and the answer that closed it (`None`:
        withdrawn). Tells a late answerer what happened."""
        if ask_id in self._closed:
            return True, self._closed[ask_id]
        return False, None

    # -- subscribers

    @contextlib.contextmanager
    def subscribe(self) -> Iterator[Subscription]:
        """Events from now on, and the asks pending now."""
        subscription = Subscription(self.pending)
        self._subscribers.add(subscription)
        try:
            yield subscription
        finally:
            self._subscribers.discard(subscription)

    def _publish(self, event: AskEvent) -> None:
        for subscription in list(self._subscribers):
            subscription._put(event)

    # -- people present

    @contextlib.contextmanager
    def present(self, route: AskRoute) -> Iterator[None]:
        """Held while a console page or `ipybox approve` is connected and can answer."""
        self._present[route] += 1
        try:
            yield
        finally:
            self._present[route] -= 1

    def people(self, route: AskRoute) -> int:
        """How many approvers of `route` are connected now."""
        return self._present[route]
