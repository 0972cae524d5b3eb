"""`ConsoleEndpoint`: the web console served on a loopback port, entered by the supervisor.

```python
async with ConsoleEndpoint(target, "127.0.0.1", 0) as console:
    print(console.url)          # http://127.0.0.1:40123/
    print(console.login_url())  # http://127.0.0.1:40123/login?token=... (works once)
```

Contracts:

- It listens only on the `host` it is given (the supervisor passes a loopback address); every request
  must name the console's own address in `Host` (see `ipybox.console.guard`).
- `login_url()` makes a new one-time link each call; the link is the only way in.
- Leaving the context ends the open event streams (each sends `event: bye`), then stops the server, whose
  stop waits for open responses: ending the streams first is what lets it return at once. Sessions and
  unused login links are forgotten. Leaving twice is harmless.
"""

from __future__ import annotations

import ipaddress
from types import TracebackType
from typing import Self

from ipybox.asgi_server import EmbeddedServer, ListenError
from ipybox.console.app import ConsoleApp, console_app
from ipybox.console.events import KEEPALIVE_S
from ipybox.console.target import ConsoleTarget

__all__ = ["ConsoleEndpoint"]


def _url_host(host: str) -> str:
    try:
        return f"[{host}]" if ipaddress.ip_address(host).version == 6 else host
    except ValueError:  # a name (localhost)
        return host


class ConsoleEndpoint:
    """The console of `target` on `host:port` (0: a free port).

    Args:
        target: The workspace it shows and answers for.
        host: The address to listen on (loopback).
        port: The port; 0 picks a free one (`url` says which).
        user: Who answers from it, in the audit log: `console (<user>)` (default: the user running it).
        keepalive_s: Seconds between keep-alive comments on idle event streams.
    """

    def __init__(
        self,
        target: ConsoleTarget,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        user: str | None = None,
        keepalive_s: float = KEEPALIVE_S,
    ) -> None:
        self.host = host
        self.port = port
        self.app: ConsoleApp = console_app(target, user=user, keepalive_s=keepalive_s)
        self._server = EmbeddedServer(self.app.asgi, "ipybox-console")
        self._url: str | None = None

    async def __aenter__(self) -> Self:
        try:
            await self._server.start(host=self.host, port=self.port)
        except ListenError as e:
            raise ListenError(f"the web console: {e} (set by [endpoints] console_port)") from None
        assert self._server.port is not None
        self.app.site.listening_on(self._server.port)
        self._url = f"http://{_url_host(self.host)}:{self._server.port}/"
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._url = None
        self.app.streams.stop()
        await self._server.stop()
        self.app.auth.end_sessions()

    @property
    def url(self) -> str | None:
        """`http://127.0.0.1:PORT/` (an IPv6 host in brackets); `None` until it listens and after it stops."""
        return self._url

    def login_url(self) -> str:
        """A new one-time login link: `{url}login?token=...`.

        Raises:
            RuntimeError: The console is not listening.
        """
        if self._url is None:
            raise RuntimeError("the console is not listening: enter its context first")
        return f"{self._url}login?token={self.app.auth.new_login_token()}"
