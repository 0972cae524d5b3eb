"""Progress of long operations (`ipybox up`, `ipybox server add`): typed events, and who listens.

Contract:

- A `ProgressEvent` says that one part (`what`: `"gateway"`, `"tool server"`, `"kernels"`,
  `"server <name>"`, `"endpoints"`) reached one `step`. Steps of a part arrive in order; the last one of a
  part has `done=True` and, when it failed, `failed=True` and the reason in `detail`.
- A server's steps are `connecting` (start and `initialize`), `listing tools`, `generating` (its package
  under `mcptools/`), `checking parsers` (only when it has output parsers), then `ready` or `failed`.
- Emitting never blocks and never raises into the operation: a `Progress` listener that fails is a bug in
  the listener, logged and dropped (see `ProgressHub.emit`).
- The events are the same models in process (`Supervisor.start(progress=...)`) and on the wire (the
  control endpoint's NDJSON stream of `POST /servers/{name}/apply`, and the lines a detached `ipybox up`
  writes for the command waiting on it), so nothing between processes is a bare `dict`.
- Rendering is the command line's (`ipybox.cli.progress`): on a terminal only; quiet with `--json` and
  when standard output is not a terminal.
- Who emits times each part from its first event (`PartTimer`): `elapsed_s` travels with the event, so
  a listener in another process (the detached `ipybox up` reads the events seconds late, in batches)
  shows how long the part took where it ran, not when the line reached it.
- `detail` is text from outside (an MCP server's error message): it is clipped to `MAX_DETAIL`
  characters here and sanitised by whoever draws it.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from pydantic import TypeAdapter

logger = logging.getLogger(__name__)

MAX_DETAIL = 1000
"""Characters of an event's `detail` kept (a server's error message can be as long as it likes)."""

ProgressStep = Literal[
    "starting",
    "connecting",
    "listing tools",
    "generating",
    "checking parsers",
    "ready",
    "failed",
]


@dataclass(frozen=True, kw_only=True)
class ProgressEvent:
    """One part of a long operation reached one step.

    Attributes:
        what: The part: `gateway`, `tool server`, `kernels`, `server <name>`, `endpoints`.
        step: What it is doing now, or `ready` / `failed` when it is done.
        detail: More about the step (`3 of 3 kernels`, `12 tools`, the reason it failed), if any.
        done: Whether this is the part's last event.
        failed: Whether the part failed (then `detail` says why).
        elapsed_s: Seconds since the part's first event, where it ran (`None`: not timed).
    """

    kind: Literal["progress"] = "progress"
    what: str
    step: ProgressStep
    detail: str | None = None
    done: bool = False
    failed: bool = False
    elapsed_s: float | None = None

    # A dataclass rather than a pydantic model: every `ipybox up` and `ipybox mcp` makes events, but only
    # streams (`up -d`, `server add`) need JSON, and building a model class on import cost ~10 ms of the
    # time to `initialize`. The wire form is validated as strictly, through a `TypeAdapter` built on first
    # use.
    def to_json(self) -> str:
        """The event as one line of JSON."""
        return progress_adapter().dump_json(self).decode()

    @classmethod
    def from_json(cls, data: str | bytes) -> ProgressEvent:
        """Validate one JSON line back into an event (unknown keys ignored).

        Raises:
            pydantic.ValidationError: It is not an event.
        """
        return progress_adapter().validate_json(data)

    @classmethod
    def from_dict(cls, data: Any) -> ProgressEvent:
        """Validate a decoded JSON object into an event (unknown keys ignored)."""
        return progress_adapter().validate_python(data)


@functools.cache
def progress_adapter() -> TypeAdapter[ProgressEvent]:
    """Validates and dumps `ProgressEvent`s (built once, when first needed)."""
    from pydantic import TypeAdapter

    return TypeAdapter(ProgressEvent)


Progress = Callable[[ProgressEvent], None]
"""A listener: called with each event, on the event loop's thread; must not block."""


class ProgressHub:
    """Fans events out to the listeners subscribed now (the foreground `ipybox up`, each `server add`
    waiting on the control endpoint). Holds nothing back: a listener sees only events after it subscribed.
    """

    def __init__(self) -> None:
        self._listeners: list[Progress] = []

    def subscribe(self, listener: Progress) -> Callable[[], None]:
        """Add `listener`; returns the function that removes it again (idempotent)."""
        self._listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return unsubscribe

    def emit(self, event: ProgressEvent) -> None:
        for listener in list(self._listeners):
            try:
                listener(event)
            except Exception:  # a listener's bug must not fail the operation it watches
                logger.exception("progress listener %r failed on %s", listener, event)


def server_part(name: str) -> str:
    """The part an MCP server's events name (`server <name>`)."""
    return f"server {name}"


def emit_to(listener: Progress | None, event: ProgressEvent) -> None:
    """Call `listener` (if any) with `event`; a listener that raises is logged, never raised into the
    operation (as `ProgressHub.emit` does)."""
    if listener is None:
        return
    try:
        listener(event)
    except Exception:
        logger.exception("progress listener %r failed on %s", listener, event)


class PartTimer:
    """Builds the events of parts, timing each from its first event until its last (`ready`/`failed`).

    Example:
        ```python
        timer = PartTimer()
        hub.emit(timer.event("gateway", "starting"))
        ...
        hub.emit(timer.event("gateway", "ready", "pid 4242"))  # done, elapsed_s = seconds since starting
        ```
    """

    def __init__(self) -> None:
        self._started: dict[str, float] = {}

    def event(self, what: str, step: ProgressStep, detail: str | None = None) -> ProgressEvent:
        now = time.monotonic()
        started = self._started.setdefault(what, now)
        done = step in ("ready", "failed")
        if done:
            del self._started[what]  # the part's next event (a restart) is timed afresh
        if detail is not None and len(detail) > MAX_DETAIL:
            detail = detail[: MAX_DETAIL - 3] + "..."
        return ProgressEvent(
            what=what,
            step=step,
            detail=detail,
            done=done,
            failed=step == "failed",
            elapsed_s=round(now - started, 2),
        )
