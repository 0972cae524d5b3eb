"""The web console of a running workspace: a person answers `ask`s (once, for the session, or always) and
watches what runs, on loopback, behind a one-time login link.

- [target][ipybox.console.target]: `ConsoleTarget`, what the console reads and drives (the supervisor).
- [endpoint][ipybox.console.endpoint]: `ConsoleEndpoint`, the server the supervisor enters.
- [app][ipybox.console.app]: `console_app`, the ASGI app (tests drive it in process); its parts:
  [auth][ipybox.console.auth] (login tokens, sessions, CSRF tokens), [guard][ipybox.console.guard]
  (Host, Origin and session checks, security headers), [views][ipybox.console.views] (routes),
  [forms][ipybox.console.forms] (POST bodies, CSRF-checked), [events][ipybox.console.events] (the SSE
  stream), [rendering][ipybox.console.rendering] (templates, view models).

Layer: above `running` (status models), `approval` (the ask board) and `rules` (policy, audit log); below
the supervisor, which holds it. Pages are jinja2 templates kept as files (`templates/`), live updates
come over SSE, and there is no front-end build step (one small script in `static/`).
"""

from ipybox.console.endpoint import ConsoleEndpoint
from ipybox.console.target import ConsoleTarget

__all__ = ["ConsoleEndpoint", "ConsoleTarget"]
