"""What a person asked about a call sees besides the call: the code that made it and the client that asked.

Two parts of an [AskView][ipybox.approval.ask_events.AskView], built once when the ask is opened (so
every approver shows the same: the web console, `ipybox approve`, the MCP client's elicitation):

- `CellView`: the cell whose code made the call, with the call's line. Its text comes from the host
  when the host knows it (`verified`: the cell the session's application registered with the workspace
  just before executing it, `POST /leases/{lease}/cells`, whose SHA-256 the call reports; only the
  session's latest cell counts, so a kernel can claim no other text of the session's; which cell made the
  call, and on which line, stays the kernel's word) and otherwise from the kernel's request (`ToolCall.cell_text`, at most `MAX_CELL_TEXT`
  characters: the whole cell or the lines around the call), marked "as reported by the kernel": code in
  the kernel can send any text, so an approver says so. The call's line is the kernel's claim too; one
  outside the text is dropped. A long text has a `window` of `WINDOW_BEFORE`/`WINDOW_AFTER` lines around
  the call shown first, the rest on request (the console's `<details>`, `ipybox approve`'s `v`).
- `ClientView`: who asked: the session's name (an MCP client's `clientInfo` name and version, or the
  name an application gave when it took its lease, by default `python (pid N)`), when it started, how
  many of its calls were allowed and denied so far, and what a person answered "for this session" for
  it. The opaque session id stays, for a tooltip.

Pure: no I/O. Everything is bounded: cell text by `MAX_CELL_TEXT`, a name by `MAX_CLIENT_NAME`, grants
listed by `MAX_GRANTS_SHOWN`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import datetime
from typing import Final

from pydantic import Field

from ipybox.approval.grants import Grant
from ipybox.approval.message import WireMessage
from ipybox.rules.calls import MAX_CELL_TEXT, ToolCall

__all__ = [
    "MAX_CELL_TEXT",
    "MAX_CLIENT_NAME",
    "MAX_GRANTS_SHOWN",
    "MAX_REGISTERED_CELL",
    "WINDOW_AFTER",
    "WINDOW_BEFORE",
    "CellView",
    "ClientView",
    "cell_view",
    "client_name",
]

WINDOW_BEFORE: Final = 6
"""Lines shown before the call's line of a long cell (the rest behind "show all")."""
WINDOW_AFTER: Final = 3
"""Lines shown after it."""
MAX_REGISTERED_CELL: Final = 65536
"""The most characters of a cell an application registers with the workspace (`POST /leases/{lease}/cells`)
to be shown as verified; a longer cell is not registered, and its asks show the kernel's text."""
MAX_CLIENT_NAME: Final = 120
"""Characters of a session's name kept (it comes from the client)."""
MAX_GRANTS_SHOWN: Final = 8
"""Answers "for this session" listed in a client's history (the rest counted)."""


class CellLine(WireMessage):
    number: int
    text: str
    call: bool = False


class CellView(WireMessage):
    """The code of the cell that made a call (see the module docstring).

    Attributes:
        cell: The cell's number, as the kernel reports it.
        sha: The SHA-256 of the cell's text, as the kernel reports it.
        text: The text known: the whole cell, or (`first_line` > 1, or `partial`) the part of it the kernel
            sent.
        first_line: The cell line `text` starts at.
        line: The cell line of the call, when known.
        verified: The text is the host's own record of the cell (registered by its SHA-256 for the
            session); `False`: as reported by the kernel.
        partial: `text` is not the whole cell (the kernel sent the lines around the call).
        window: The lines (first, last; cell line numbers) shown until the person asks for all: the call
            and `WINDOW_BEFORE`/`WINDOW_AFTER` lines around it; `None` when all of `text` is shown.
    """

    cell: int | None = None
    sha: str | None = None
    text: str
    first_line: int = 1
    line: int | None = None
    verified: bool = False
    partial: bool = False
    window: tuple[int, int] | None = None

    def lines(self, *, all_lines: bool = True) -> list[CellLine]:
        """The text's lines with their cell line numbers (the call's marked); only the `window`'s unless
        `all_lines`."""
        numbered = [
            CellLine(number=self.first_line + index, text=text, call=self.first_line + index == self.line)
            for index, text in enumerate(self.text.split("\n"))
        ]
        if all_lines or self.window is None:
            return numbered
        low, high = self.window
        return [line for line in numbered if low <= line.number <= high]

    @property
    def source(self) -> str:
        """Where the text comes from, as approvers say it."""
        return "verified: submitted through ipybox" if self.verified else "as reported by the kernel"


def cell_view(call: ToolCall, known: str | None = None) -> CellView | None:
    """The `CellView` of `call`: `known` (the host's record of the cell whose SHA-256 the call reports,
    when the host has one) or the kernel's text; `None` when there is neither."""
    verified = known is not None and call.code is not None
    if verified:
        assert known is not None
        text, first, partial = known, 1, False
    elif call.cell_text is not None and len(call.cell_text) <= MAX_CELL_TEXT:
        text, first = call.cell_text, max(call.cell_text_from, 1)
        partial = first > 1 or (call.code is not None and _sha(text) != call.code)
    else:
        return None
    count = text.count("\n") + 1
    line = call.line if call.line is not None and first <= call.line < first + count else None
    window = None
    if line is not None and count > WINDOW_BEFORE + WINDOW_AFTER + 1:
        window = (max(first, line - WINDOW_BEFORE), min(first + count - 1, line + WINDOW_AFTER))
    return CellView(
        cell=call.cell,
        sha=call.code,
        text=text,
        first_line=first,
        line=line,
        verified=verified,
        partial=partial,
        window=window,
    )


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def client_name(name: str | None) -> str | None:
    """A session's name as kept: printable, one line, at most `MAX_CLIENT_NAME` characters; `None` for
    none (or nothing printable)."""
    if name is None:
        return None
    kept = "".join(char if char.isprintable() else " " for char in name).strip()
    return kept[:MAX_CLIENT_NAME] or None


class ClientView(WireMessage):
    """Who asked, and the session's history (see the module docstring).

    Attributes:
        session: The session's (lease's) id, short: for a tooltip.
        name: The session's name (an MCP client's `name version`, an application's name); `None`: unnamed.
        started_at: When the session started (ISO 8601, UTC), when known.
        allowed: Its calls allowed so far (by rules or answers).
        denied: Its calls denied so far.
        grants: What was answered "for this session" for it: `allowed github.create_issue (by console
            (root))`, at most `MAX_GRANTS_SHOWN`.
        more_grants: How many more there are.
    """

    session: str
    name: str | None = None
    started_at: str | None = None
    allowed: int = 0
    denied: int = 0
    grants: list[str] = Field(default_factory=list)
    more_grants: int = 0

    @classmethod
    def of(
        cls,
        session: str,
        name: str | None,
        started: datetime | None,
        calls: tuple[int, int],
        grants: Mapping[tuple[str, str], Grant],
    ) -> ClientView:
        listed = [
            f"{'allowed' if grant.accept else 'denied'} {server}.{tool} (by {grant.by})"
            for (server, tool), grant in list(grants.items())[:MAX_GRANTS_SHOWN]
        ]
        return cls(
            session=session[:8],
            name=client_name(name),
            started_at=started.isoformat(timespec="seconds").replace("+00:00", "Z") if started else None,
            allowed=calls[0],
            denied=calls[1],
            grants=listed,
            more_grants=max(0, len(grants) - MAX_GRANTS_SHOWN),
        )

    @property
    def title(self) -> str:
        """The name, or the short session id for a session without one."""
        return self.name if self.name is not None else f"session {self.session}"

    def history(self, started: str | None = None) -> str:
        """The session's history in one line: `started 2026-12-07 07:00:01 UTC; 5 calls so far (4 allowed,
        1 denied); for this session: allowed github.create_issue (by ...)`. `started`: the start time as the
        approver shows it (default: the date and time in UTC)."""
        parts = []
        if self.started_at is not None:
            parts.append(f"started {started or self.started_at.replace('T', ' ').replace('Z', ' UTC')}")
        total = self.allowed + self.denied
        parts.append(
            f"{total} call{'' if total == 1 else 's'} so far"
            + (f" ({self.allowed} allowed, {self.denied} denied)" if total else "")
        )
        if self.grants:
            more = f", and {self.more_grants} more" if self.more_grants else ""
            parts.append("for this session: " + "; ".join(self.grants) + more)
        return "; ".join(parts)
