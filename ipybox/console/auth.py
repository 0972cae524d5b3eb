"""`ConsoleAuth`: the console's one-time login tokens, its sessions and their CSRF tokens, in memory.

Access works as Jupyter's does: `ipybox up` and `ipybox console DIR` print a login link holding a token;
opening it trades the token for a session cookie, and the token is spent.

Contracts:

- A login token is good once, for `LOGIN_TTL_S` seconds; at most `MAX_LOGIN_TOKENS` wait at a time (the
  oldest is dropped first), so asking for links never grows memory.
- A session lives `SESSION_TTL_S` seconds from login, or until the console stops (nothing is written to
  disk: a restarted workspace asks for a new link). At most `MAX_SESSIONS` live at a time, the oldest
  dropped first.
- Tokens and session ids are 256 random bits; they are kept only as SHA-256 digests, so a look-up's
  timing says nothing about a stored value. CSRF tokens are compared with `hmac.compare_digest`.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

__all__ = ["LOGIN_TTL_S", "MAX_LOGIN_TOKENS", "MAX_SESSIONS", "SESSION_TTL_S", "ConsoleAuth", "Session"]

LOGIN_TTL_S: Final = 15 * 60.0
"""How long a login link works: long enough to switch to a browser, short enough that a link left in a
terminal's scrollback or a log is worthless by the time someone finds it."""
SESSION_TTL_S: Final = 24 * 3600.0
"""How long a browser stays logged in (a working day and then some)."""
MAX_LOGIN_TOKENS: Final = 64
MAX_SESSIONS: Final = 64


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).digest()


@dataclass(eq=False)
class Session:
    """A logged-in browser.

    Attributes:
        csrf: The token every form and `fetch` of this session must send back.
        expires: `time.monotonic()` when it ends.
        flash: Messages for the next page shown (an answer posted without JavaScript is redirected back
            to the asks page, which shows what became of it).
    """

    csrf: str
    expires: float
    flash: list[str] = field(default_factory=list)

    def csrf_matches(self, supplied: str | None) -> bool:
        """Whether `supplied` is this session's CSRF token (constant time)."""
        if not supplied:
            return False
        return hmac.compare_digest(supplied.encode("utf-8", "surrogateescape"), self.csrf.encode())

    def take_flash(self) -> list[str]:
        messages, self.flash = self.flash, []
        return messages


class ConsoleAuth:
    """Login tokens and sessions of one console.

    Args:
        clock: Monotonic seconds (tests pass their own to expire tokens without waiting).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._tokens: OrderedDict[bytes, float] = OrderedDict()
        self._sessions: OrderedDict[bytes, Session] = OrderedDict()

    # -- login tokens

    def new_login_token(self) -> str:
        """A new one-time token for a login link."""
        token = secrets.token_urlsafe(32)
        self._tokens[_digest(token)] = self._clock() + LOGIN_TTL_S
        while len(self._tokens) > MAX_LOGIN_TOKENS:
            self._tokens.popitem(last=False)
        return token

    def spend_login_token(self, token: str) -> bool:
        """Spend `token`: `True` if it was issued, unused and not expired (it is unusable from now on)."""
        expires = self._tokens.pop(_digest(token), None)
        return expires is not None and self._clock() < expires

    # -- sessions

    def new_session(self) -> tuple[str, Session]:
        """A new session: its id (the cookie's value) and the session."""
        session_id = secrets.token_urlsafe(32)
        session = Session(csrf=secrets.token_urlsafe(32), expires=self._clock() + SESSION_TTL_S)
        self._sessions[_digest(session_id)] = session
        while len(self._sessions) > MAX_SESSIONS:
            self._sessions.popitem(last=False)
        return session_id, session

    def session(self, session_id: str | None) -> Session | None:
        """The live session with this id, `None` for none (unknown, expired, or no id)."""
        if not session_id:
            return None
        key = _digest(session_id)
        session = self._sessions.get(key)
        if session is None:
            return None
        if self._clock() >= session.expires:
            del self._sessions[key]
            return None
        return session

    def end_sessions(self) -> None:
        """Forget every session and login token (the console stops)."""
        self._tokens.clear()
        self._sessions.clear()
