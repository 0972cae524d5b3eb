"""`server_outcome`: what became of one MCP server after the current `ipybox.toml` was applied.

Contract: pure (no I/O: the caller passes the file's text). A configuration problem
belongs to server X by *where it is*: its place in `ipybox.toml` lies in the table `[servers.X]` (the key
paths `key_positions` finds under `("servers", X)`), never by whether X's name appears in its text, so
server `fs` does not own a problem of server `refs`.
"""

from __future__ import annotations

import bisect

from ipybox.config.errors import ConfigError, ConfigProblem
from ipybox.config.positions import KeyPath, key_positions
from ipybox.running.status import Problem, ReconcilerStatus, ServerOutcome


def server_outcome(
    name: str, status: ReconcilerStatus, error: ConfigError | None, source: str | None
) -> ServerOutcome:
    """The outcome for server `name`.

    Args:
        name: The server.
        status: The reconciler's status after it applied (or failed to load) the file.
        error: Why the file does not load, if it does not.
        source: The file's text as loaded (to place `error`'s problems); `None` if unreadable.
    """
    if error is not None:
        located = problems_about(name, error, source)
        problems = located or list(error.problems)
        what = f"[servers.{name}] in" if located else "it is not applied:"
        return ServerOutcome(
            name=name,
            state="config_error",
            error=f"{what} {error.path.name} does not load:\n" + "\n".join(map(str, problems)),
            problems=[_wire(problem) for problem in problems],
            about_server=bool(located),
        )
    server = status.servers.get(name)
    if server is None:
        return ServerOutcome(
            name=name, state="absent", error=f"no enabled server {name!r} in the configuration that runs"
        )
    if server.state == "ready":
        return ServerOutcome(name=name, state="ready", generation=server.generation, tools=server.tools)
    return ServerOutcome(
        name=name,
        state="failed",
        generation=server.generation,
        tools=server.tools,
        error=server.error or f"it is still {server.state}",
    )


def problems_about(name: str, error: ConfigError, source: str | None) -> list[ConfigProblem]:
    """The problems of `error` placed inside `[servers.<name>]` of the file `error` is about."""
    if source is None:
        return []
    positions = sorted((place, path) for path, place in key_positions(source).items())
    places = [place for place, _ in positions]
    owned: list[ConfigProblem] = []
    for problem in error.problems:
        if problem.source != str(error.path) or problem.line is None:
            continue
        # The key written last at or before the problem's place is the one it is about.
        index = bisect.bisect_right(places, (problem.line, problem.column or 1)) - 1
        if index >= 0 and _under(positions[index][1], name):
            owned.append(problem)
    return owned


def _under(path: KeyPath, name: str) -> bool:
    return len(path) >= 2 and path[0] == "servers" and path[1] == name


def _wire(problem: ConfigProblem) -> Problem:
    return Problem(source=problem.source, line=problem.line, column=problem.column, reason=problem.reason)
