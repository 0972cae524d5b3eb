"""`ConsoleGuard`: the ASGI middleware every request to the console passes, before any route sees it.

In order, for each HTTP request:

1. Host: the `Host` header must name the console's own address (`127.0.0.1:PORT`, `localhost:PORT` or
   `[::1]:PORT`), else 421. A web page whose own name an attacker re-points at 127.0.0.1 (DNS rebinding)
   reaches the port, but with its own name in `Host`.
2. Origin: a request other than GET/HEAD must carry an `Origin` that is the console's own origin (the
   scheme and the `Host` it was sent to), and a GET that carries one (the event stream, `fetch`) too,
   else 403. Cookies are no defence here on their own: a site is scheme and host without the port, so a
   page served by any other program on 127.0.0.1 is "same-site" and gets `SameSite=Strict` cookies sent.
3. Session: every path but `/login` and `/static/` needs the session cookie of a live session, else 401
   with a short page saying how to get a login link (never data). The session is put in
   `scope["state"]["console_session"]` for the routes; CSRF tokens are checked where forms are read
   (`ipybox.console.forms`).

Every response (refusals included) carries the headers of `SECURITY_HEADERS`: the CSP allows only the
console's own script, style and form targets, and no framing. `Referrer-Policy: same-origin` rather than
`no-referrer`: under `no-referrer` a page's own form submissions carry `Origin: null` (Fetch standard,
"append a request Origin header"; measured with chromium: `fetch` keeps the origin, a submitted form
sends `null`), which step 2 cannot tell from a sandboxed foreign page, so answering without JavaScript
would fail; `same-origin` still never sends a console URL to another site. The login page, whose URL
holds the token, is `no-referrer`. Pages are `Cache-Control: no-store`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ipybox.console.auth import ConsoleAuth

__all__ = ["PUBLIC_PREFIXES", "SECURITY_HEADERS", "ConsoleGuard", "ConsoleSite", "Refuse"]

SECURITY_HEADERS: Final[tuple[tuple[bytes, bytes], ...]] = (
    (b"content-security-policy", b"default-src 'self'; frame-ancestors 'none'; form-action 'self'"),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
)
PUBLIC_PREFIXES: Final = ("/login", "/static/")
"""Paths served without a session: the login link, and the script and style sheet (no data in them)."""

_SAFE_METHODS: Final = frozenset({"GET", "HEAD"})

Refuse = Callable[[Request, int, str, str], Response]
"""Renders a refusal: `(request, status, title, message) -> Response`."""


@dataclass
class ConsoleSite:
    """The console's own address, known once it listens.

    Attributes:
        port: The port it listens on (`None`: not listening; every request is refused).
        hosts: The `Host` values it answers to.
    """

    port: int | None = None
    hosts: frozenset[str] = field(default_factory=frozenset)

    def listening_on(self, port: int) -> None:
        self.port = port
        self.hosts = frozenset({f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"})

    @property
    def cookie_name(self) -> str:
        """The session cookie's name. Cookies are kept per host, not per port: two workspaces' consoles on
        127.0.0.1 would overwrite each other's cookie under one name."""
        return f"ipybox-console-{self.port}"


class ConsoleGuard:
    """Host, Origin and session checks, and the security headers (see the module docstring)."""

    def __init__(self, app: ASGIApp, *, auth: ConsoleAuth, site: ConsoleSite, refuse: Refuse) -> None:
        self.app = app
        self.auth = auth
        self.site = site
        self.refuse = refuse

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":  # the console has none: close before accepting
            await send({"type": "websocket.close", "code": 4403, "reason": "no websockets here"})
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        send = _with_headers(send)
        refusal = self._check(scope)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _check(self, scope: Scope) -> Response | None:
        request = Request(scope)
        headers = Headers(scope=scope)
        host = headers.get("host", "")
        if host not in self.site.hosts:
            return self.refuse(
                request,
                421,
                "Wrong address",
                "This request was not addressed to the console's own address (127.0.0.1, localhost or "
                "[::1] with its port). Open the link that `ipybox console DIR` prints.",
            )
        origin = headers.get("origin")
        own_origin = f"http://{host}"
        if scope["method"] not in _SAFE_METHODS and origin is None:
            return self.refuse(
                request,
                403,
                "Refused",
                "This request carries no Origin header, so it may come from another site.",
            )
        if origin is not None and origin != own_origin:
            return self.refuse(
                request, 403, "Refused", "This request comes from another site's page, not from the console."
            )
        path: str = scope["path"]
        if path.startswith(PUBLIC_PREFIXES):
            return None
        session = self.auth.session(request.cookies.get(self.site.cookie_name))
        if session is None:
            return self.refuse(
                request,
                401,
                "Log in to the console",
                "You are not logged in (or your session ended). Run `ipybox console DIR` for a new "
                "one-time login link and open it.",
            )
        scope.setdefault("state", {})["console_session"] = session
        return None


def _with_headers(send: Send) -> Send:
    async def send_with_headers(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = list(message.get("headers", []))
            present = {name.lower() for name, _ in headers}
            headers += [(name, value) for name, value in SECURITY_HEADERS if name not in present]
            if b"cache-control" not in present:
                headers.append((b"cache-control", b"no-store"))
            message = {**message, "headers": headers}
        await send(message)

    return send_with_headers
