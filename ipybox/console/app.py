"""`console_app`: the console's ASGI application, its routes behind `ConsoleGuard`.

The app is built without listening anywhere, so tests drive it in process (`httpx.ASGITransport`,
starlette's `TestClient`); `ConsoleEndpoint` serves it on loopback and tells it its port.
"""

from __future__ import annotations

import getpass
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from ipybox.console.auth import ConsoleAuth
from ipybox.console.events import KEEPALIVE_S, AskStreams
from ipybox.console.guard import ConsoleGuard, ConsoleSite
from ipybox.console.rendering import environment
from ipybox.console.target import ConsoleTarget
from ipybox.console.views import ConsoleViews

__all__ = ["STATIC_DIR", "ConsoleApp", "console_app"]

STATIC_DIR: Final = Path(__file__).parent / "static"


def _whoami() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container's arbitrary user)
        return "unknown user"


@dataclass
class ConsoleApp:
    """The console's app and the parts its endpoint drives.

    Attributes:
        asgi: The ASGI application.
        auth: Login tokens and sessions.
        site: The address it answers to (set by `site.listening_on(port)`).
        streams: Open event streams (`streams.stop()` ends them).
        views: The route handlers.
    """

    asgi: Starlette
    auth: ConsoleAuth
    site: ConsoleSite
    streams: AskStreams
    views: ConsoleViews


def console_app(
    target: ConsoleTarget,
    *,
    user: str | None = None,
    auth: ConsoleAuth | None = None,
    keepalive_s: float = KEEPALIVE_S,
) -> ConsoleApp:
    """The console of `target`, answering as `console (<user>)` (default: the user running it)."""
    auth = auth or ConsoleAuth()
    site = ConsoleSite()
    streams = AskStreams(target.board, keepalive_s=keepalive_s)
    views = ConsoleViews(target, auth, site, streams, environment(), user or _whoami())
    routes: list[BaseRoute] = [
        Route("/login", views.login, methods=["GET"]),
        Route("/", views.overview, methods=["GET"]),
        Route("/fragments/overview", views.overview_fragment, methods=["GET"]),
        Route("/asks", views.asks, methods=["GET"]),
        Route("/asks/{ask_id}/card", views.ask_card, methods=["GET"]),
        Route("/asks/{ask_id}/answer", views.answer, methods=["POST"]),
        Route("/asks/{ask_id}/always", views.always, methods=["GET"]),
        Route("/events", views.events, methods=["GET"]),
        Route("/audit", views.audit, methods=["GET"]),
        Route("/rules", views.rules, methods=["GET"]),
        Route("/rules/explain", views.explain, methods=["POST"]),
        Route("/rules/edit", views.edit_rule, methods=["POST"]),
        Route("/rules/args", views.rule_args, methods=["POST"]),
        Route("/pins/accept", views.accept_pins, methods=["POST"]),
        Mount("/static", StaticFiles(directory=STATIC_DIR), name="static"),
    ]
    asgi = Starlette(
        routes=routes,
        middleware=[Middleware(ConsoleGuard, auth=auth, site=site, refuse=views.refuse)],
        exception_handlers={HTTPException: views.http_error},
    )
    return ConsoleApp(asgi, auth, site, streams, views)
