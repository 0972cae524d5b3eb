"""`DomainProxy`: the only way out of a sandbox's network namespace, for the domains the policy allows.

It runs on the host and listens on a Unix socket that is bind-mounted into the sandbox, where a bridge
(`ipybox.sandbox.netbridge`) exposes it as `http://127.0.0.1:PORT` in `HTTP(S)_PROXY`. It speaks the
two forms of HTTP proxying clients use: `CONNECT host:port` (HTTPS, and any TCP protocol a client
tunnels) and absolute-form plain HTTP requests (`GET http://host/path`), one request per connection.

The host name is checked before anything is resolved; the name is then resolved here and the proxy
connects to the address it checked (no second lookup a name server could answer differently). Addresses
that are not globally reachable ([addresses][ipybox.sandbox.addresses]: IANA's special-purpose ranges,
including shared address space and cloud metadata, and IPv6 forms judged by the IPv4 address they carry)
are refused unless the allowed entry names that host exactly.

Secrets ([SecretRoute][ipybox.sandbox.interception.SecretRoute]): a kernel holds a placeholder, and the
proxy puts the value in its place only where the secret may go:

- **Intercepted**: a `CONNECT` to a host at least one secret is for (any port), once the host passed the
  checks above. The proxy first opens TLS to the checked address itself, verifying the origin's
  certificate for the host name (`upstream_context`, the system's CAs by default; a failure is a 502
  before anything else happens), then answers `200`, serves TLS to the client with a certificate of the
  workspace's [InterceptionCA][ipybox.sandbox.interception.InterceptionCA], and relays HTTP/1.1 request by
  request (ALPN offers `http/1.1` alone on both sides). Each request head is checked, then sent on:
  its `Host` must be the CONNECT host (the port, if given, the CONNECT port), else `421` and the
  origin sees nothing; in the values of the headers a secret allows (`Authorization: Basic` credentials
  decoded), the placeholder of each secret for this host is replaced by its value; not in the request
  line, the body, trailers, or headers it does not allow. Bodies and answers pass unchanged, framed by
  `Content-Length` or chunked encoding, so the next request on the connection is found where the
  client and the origin find it. `Connection: close` from either side, HTTP/1.0, an answer delimited by
  the origin closing, or the origin closing an idle connection (a client must see that before it
  reuses the connection) end the connection.
- **Refused** on an intercepted connection (a secret's host or a host with request rules), with a
  plain-text answer naming what and why (and the connection closed): the placeholder of a secret for other hosts anywhere in the request head (`403`,
  naming the secret and the host, logged as a warning: a misrouted secret); both `Content-Length` and
  `Transfer-Encoding`, a repeated or malformed `Content-Length`, a bare CR or LF, header line folding or
  a malformed header line (`400`: an origin could frame the request otherwise than the proxy checked it,
  which is request smuggling); a `Transfer-Encoding` other than `chunked` (`501`); `Upgrade` (WebSocket,
  h2c: `501`, the proxy reads HTTP/1.1 only); `CONNECT` inside (`501`); other HTTP versions (`505`);
  a head over 64 KiB (`431`).
- **Never replaced**: in `CONNECT` targets, in tunnels to other hosts (the proxy can't read them), and in
  plain `http://` requests, where a placeholder of any secret in the request head is refused (`403`,
  logged as a warning): the secret would travel in clear text.

Request rules ([domains][ipybox.sandbox.domains]: an `allowedDomains` entry with `methods` or `paths`, or
`readOnly`): each request to a host whose rule restricts anything is checked before the origin sees it.

- **Plain HTTP**: the method and the path of the request line, before connecting. A refused request gets
  `403` (`400` for a path an origin could normalize into another: `..`, `%2F`, ...), in plain text naming
  the host, the method and path, the entry (or `readOnly`) and that a person allows it by editing
  `allowedDomains` in `ipybox.toml`. An allowed one is parsed as strictly as an intercepted one (the
  refusals below), and only its own body goes to the origin: what the client sends after it is not
  relayed, so a second request can't follow the checked one down the connection.
- **HTTPS**: a `CONNECT` to such a host is intercepted as a secret's host is (any port; the CA must have
  been made for these hosts too, `DomainFilter.restricted_entries`), and each request on it is checked
  the same way; a refused one is answered, and the connection closed. Without a CA such a `CONNECT` is
  refused (`403`): the proxy can't check requests it can't read. `CONNECT` itself is not a method an
  entry allows; the requests inside are.

Unknown hosts (`unknown = "ask"`, with a [HostAsker][ipybox.sandbox.host_asks.HostAsker]): a `CONNECT` or
plain-HTTP request to a host no allowed entry covers is not refused at once. A denied host is (no answer
lets it through), as is one that can't be resolved (`502`). Otherwise the proxy resolves the name, asks
about it (`HostQuestion`: the host, the port, the method, and the internal address it resolves to, if it
does, and `client_pid`, the pid of the process at the other end of the socket from its peer credentials:
in a sandbox, the kernel's bridge) and holds the connection until the asker returns; connections to the
same host from the same process meanwhile wait for the same ask. Allowed, the connection goes to the addresses checked before asking (no second lookup), an
internal one included: the person was shown it, as an exact `allowedDomains` entry would reach it. An
asked host's requests are not restricted (hence `readOnly` and `ask` are refused together: its HTTPS
could not be read). Refused, timed out, or with nobody to answer (the asker says so at once), the client
gets `403` naming the host, what happened, and that `allowedDomains` in `ipybox.toml` allows it for good.
`once` answers the waiting connections; `session` answers (allow or deny) hold for the host until the
proxy stops; `always` ones (the asker wrote the host into `ipybox.toml`) hold until the next `update`,
which the edit brings. Without an asker, `unknown = "ask"` refuses, saying nobody can be asked. Who can
answer is the asker's business: in a workspace, the supervisor tells the kernel from the client's pid and
asks as for that kernel's tool calls (its application, its MCP client, the people at the web console and
in `ipybox approve`), or only the people when it can't tell (`WorkspaceApprover.ask_host`). The pid only
chooses who is asked: any process in the sandbox can connect to the socket.

Policy updates (`DomainProxy.update`): the allowed and denied hosts, `readOnly` and `unknown` can change
while the proxy runs; connections accepted afterwards get the new policy, open ones keep the one they were accepted
under. The secrets and the CA don't change: an entry that becomes restricted must be one the CA was made
for (clients can't start trusting another CA), else the update is refused.

What a secret can't prevent: an origin that echoes a request's headers in its answer (an echo service,
some error pages) shows the value to the kernel; answers pass unchanged.

No message or log line names a secret's value. Everything not intercepted is relayed as before.

Cost, against a `CONNECT` tunnel to the same origin in the same run (`python -m bench proxy`: the origin
on loopback and the client in processes of their own, samples alternating; a 2-core VM): a request on a
kept-alive connection takes 0.2-0.4 ms more (medians of 200: 0.65-0.86 ms against 0.38-0.47 ms: both TLS
legs and the parsing run in Python), a new connection with one request 2.5-4.5 ms more (8.6-11.5 ms
against 4.9-6.2 ms: the proxy's own handshakes with the origin, before its 200, and with the client). A
one-off script before it (the client a thread of the proxy's process) found +0.2-0.4 ms and +3-5 ms. A
leaf certificate is minted once per host (about 2 ms) and kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import shutil
import socket
import ssl
import struct
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Literal, Self

from ipybox.sandbox.addresses import internal_reason
from ipybox.sandbox.domains import AllowedEntry, DomainFilter, RequestRule, covers, normalize_host
from ipybox.sandbox.host_asks import ASK_WITH_READ_ONLY, HostAnswer, HostAsker, HostQuestion
from ipybox.sandbox.interception import InterceptionCA, SecretRoute, basic_credentials
from ipybox.sandbox.netbridge import pipe

logger = logging.getLogger(__name__)

_HEAD_LIMIT = 64 * 1024
# An origin's answer heads run larger than requests' (cookies, security policies).
_RESPONSE_HEAD_LIMIT = 256 * 1024
_CONNECT_TIMEOUT = 15.0
_COPY_SIZE = 64 * 1024
_HOP_BY_HOP = {b"proxy-connection", b"proxy-authorization", b"connection", b"keep-alive"}
# RFC 9110 5.6.2 token; a header name outside it is refused rather than guessed at.
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# Control characters other than tab, in a field value: some parsers end the line there.
_CONTROL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_HEX = re.compile(rb"[0-9A-Fa-f]{1,16}")
# A request target is visible ASCII (RFC 9112 3.2; obs-text is allowed in no URI).
_TARGET_FORBIDDEN = re.compile(rb"[^\x21-\x7e]")
_NO_BODY_STATUSES = (204, 304)
# A reason phrase is visible ASCII and spaces (RFC 9112 4); a refusal's message goes there, cut to this.
_PHRASE_UNSAFE = re.compile(r"[^\x20-\x7e]")
_PHRASE_CHARS = 400

Unknown = Literal["deny", "ask"]
"""What happens to a host no allowed entry covers: refused, or asked about (`DomainProxy`'s `ask`)."""
_Address = tuple[int, int, str, int]  # family, proto, ip, port: where a checked name resolved

Framing = int | Literal["chunked", "close"]
"""How a message's body ends: after that many bytes, after the last chunk, or when the sender closes."""


class _Refused(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason = status, reason


class _Broken(_Refused):
    """An exchange on an intercepted connection that can't go on: the connection ends (answered with
    the status when no answer was started yet)."""


class DomainProxy:
    """An HTTP proxy on a Unix socket that lets through only connections to allowed domains, and puts
    secrets in the requests to their hosts (see the module's description).

    Args:
        allowed: `network.allowedDomains` entries: host strings, or entries with request rules
            (`DomainRule`).
        denied: `network.deniedDomains` entries (they win over allowed ones).
        read_only: `network.readOnly`: every allowed host is limited to GET, HEAD and OPTIONS.
        unknown: `network.unknown`: `"ask"` asks `ask` about a host no allowed entry covers (see the
            module's description); `"deny"` refuses it.
        ask: Who is asked (`HostAsker`); without one, `unknown = "ask"` refuses, saying nobody can be asked.
        secrets: The secrets whose placeholders it replaces; their hosts must be allowed to be reached.
        ca: The CA whose certificates it serves to the sandbox for the hosts it intercepts: made for the
            secrets' hosts and the restricted entries (`DomainFilter.restricted_entries`). Needed when
            there are secrets; without it, `CONNECT`s to restricted hosts are refused.
        upstream_context: How it verifies the secrets' hosts (default: `ssl.create_default_context()`);
            it must check host names and require a certificate. Its ALPN is set to `http/1.1`.

    Raises:
        ValueError: Secrets without a CA, a CA not made for all their hosts or all the restricted entries,
            two secrets whose placeholders overlap, a host listed twice with different rules, or an
            upstream context that does not verify.

    Example:
        ```python
        async with DomainProxy(["pypi.org", "*.pythonhosted.org"]) as proxy:
            socket_path = await proxy.start()
            ...  # sandboxes with the socket bind-mounted reach exactly those hosts

        github = SecretRoute("github", placeholder, token, ("api.github.com",), frozenset({"authorization"}))
        ca = InterceptionCA.load_or_create(state_dir / "interception", github.hosts)
        async with DomainProxy(["api.github.com"], secrets=[github], ca=ca) as proxy:
            ...  # kernels trusting the CA (trust_env) send the placeholder; api.github.com gets the token
        ```
    """

    def __init__(
        self,
        allowed: Sequence[str | AllowedEntry],
        denied: Sequence[str] | None = None,
        *,
        read_only: bool = False,
        unknown: Unknown = "deny",
        ask: HostAsker | None = None,
        secrets: Sequence[SecretRoute] = (),
        ca: InterceptionCA | None = None,
        upstream_context: ssl.SSLContext | None = None,
    ) -> None:
        self.hosts = DomainFilter(allowed, denied or [], read_only=read_only)
        self.unknown: Unknown = _checked_unknown(unknown, read_only)
        self._ask = ask
        # Answers for the proxy's session (host -> the answer); `always` ones until the next `update`.
        self._granted: dict[str, HostAnswer] = {}
        # One pending ask per host and client process, shared by its waiting connections.
        self._asking: dict[tuple[str, int | None], asyncio.Task[HostAnswer]] = {}
        self.secrets = tuple(secrets)
        _check_secrets(self.secrets, ca)
        _check_restricted(self.hosts.restricted_entries, ca)
        self._ca = ca
        self._upstream_given = upstream_context
        self._upstream_context: ssl.SSLContext | None = None
        if self.secrets or (ca is not None and self.hosts.restricted_entries):
            self._upstream_context = self._make_upstream_context()
        self.unix_socket: Path | None = None
        self._private_dir: Path | None = None
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    def _make_upstream_context(self) -> ssl.SSLContext:
        # Made only when needed: loading the system's CAs takes milliseconds.
        context = self._upstream_given or ssl.create_default_context()
        if not context.check_hostname or context.verify_mode != ssl.CERT_REQUIRED:
            raise ValueError("the upstream TLS context must verify certificates and host names")
        context.set_alpn_protocols(["http/1.1"])
        return context

    def update(
        self,
        allowed: Sequence[str | AllowedEntry],
        denied: Sequence[str] | None = None,
        *,
        read_only: bool = False,
        unknown: Unknown = "deny",
    ) -> None:
        """Filter by a new policy from now on: `allowed`, `denied`, `read_only` and `unknown` as for the
        constructor; the secrets, the CA and who is asked stay, and so do answers given for the session
        (`always` answers end here: the edit they made is in the new policy, or was undone).

        The filter is swapped at once (one assignment on the event loop): each connection accepted after
        this returns is judged by the new policy; a connection accepted before keeps the policy it was
        accepted under until it ends (a `CONNECT` tunnel, an intercepted connection and its later
        requests, a plain-HTTP request being relayed). Clients that keep connections alive (a
        `requests.Session`, a pool) see the new policy on their next new connection.

        Raises:
            ValueError: The new policy is invalid (a host listed twice with different rules, ...), or an
                entry becomes restricted (methods, paths or `readOnly`) that the proxy's CA was not made
                for, or the proxy has no CA at all: its HTTPS requests could only be checked with a CA
                the clients already trust, so the policy can't change under them (start new clients, with
                a CA made for it, instead). The proxy is unchanged.
        """
        hosts = DomainFilter(allowed, denied or [], read_only=read_only)
        unknown = _checked_unknown(unknown, read_only)
        added = [entry for entry in hosts.restricted_entries if entry not in self.hosts.restricted_entries]
        if added and self._ca is None:
            raise ValueError(
                f"allowedDomains entries {', '.join(added)} now limit their requests (methods, paths or "
                "readOnly), and this proxy has no interception CA to check their HTTPS requests with: the "
                "policy can't change under running clients"
            )
        _check_restricted(hosts.restricted_entries, self._ca)
        upstream = self._upstream_context
        if upstream is None and self._ca is not None and hosts.restricted_entries:
            upstream = self._make_upstream_context()
        # Everything is checked: nothing above changed the proxy, and nothing below can fail.
        self._upstream_context = upstream
        self.hosts = hosts
        self.unknown = unknown
        self._granted = {host: answer for host, answer in self._granted.items() if answer.scope == "session"}

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def start(self, unix_socket: Path | None = None) -> Path:
        """Listen on `unix_socket` (mode 0600; default: in a private directory, removed by `stop()`).

        Returns:
            The socket's path.
        """
        if unix_socket is None:
            self._private_dir = Path(tempfile.mkdtemp(prefix="ipybox-net-"))
            unix_socket = self._private_dir / "proxy.sock"
        self._server = await asyncio.start_unix_server(self._accept, str(unix_socket), limit=_HEAD_LIMIT)
        os.chmod(unix_socket, 0o600)
        self.unix_socket = unix_socket
        return unix_socket

    async def stop(self) -> None:
        """Stop listening and cut every open connection."""
        if self._server is not None:
            self._server.close()
            for task in [*self._connections, *self._asking.values()]:
                task.cancel()
            await asyncio.gather(*self._connections, *self._asking.values(), return_exceptions=True)
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None
        if self.unix_socket is not None:
            self.unix_socket.unlink(missing_ok=True)
            self.unix_socket = None
        if self._private_dir is not None:
            shutil.rmtree(self._private_dir, ignore_errors=True)
            self._private_dir = None

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            await self._serve(reader, writer, _peer_pid(writer))
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            self._connections.discard(task)
            writer.close()

    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, client_pid: int | None = None
    ) -> None:
        # The policy the connection was accepted under, for all of it (`update` swaps `self.hosts`).
        hosts, unknown = self.hosts, self.unknown
        head = await reader.readuntil(b"\r\n\r\n")
        request_line, _, header_block = head.partition(b"\r\n")
        routes: tuple[SecretRoute, ...] = ()
        rule: RequestRule | None = None
        body: Framing | None = None  # a checked plain-HTTP request's own body: all that is relayed
        try:
            method, target, version = request_line.decode("latin-1").split(" ")
            if method == "CONNECT":
                host, port = _split_host_port(target, default_port=None)
                routes = tuple(route for route in self.secrets if route.applies_to(host))
                rule, addresses = await self._admit(hosts, unknown, host, port, method, client_pid)
                if rule.restricts and self._ca is None:
                    name = normalize_host(host)
                    logger.info("sandbox network: refused CONNECT %s: its requests can't be checked", name)
                    raise _Refused(
                        403,
                        "Forbidden",
                        f"ipybox sandbox proxy: refused CONNECT to {name}: allowedDomains entry {rule.entry}"
                        f"{' with readOnly = true' if rule.read_only else ''} limits its requests, and TLS "
                        "requests to it can't be checked without the workspace's interception CA, which this "
                        "proxy was not given",
                    )
            else:
                host, port, path = _parse_absolute_http(target)
                self._refuse_in_clear(head, host)
                rule, addresses = await self._admit(hosts, unknown, host, port, method, client_pid)
                if rule.restricts:
                    body = _checked_plain_request(head, rule, normalize_host(host), method, path)
            intercept = method == "CONNECT" and (bool(routes) or rule.restricts)
            upstream_reader, upstream_writer = await self._open(
                hosts, host, port, tls=intercept, addresses=addresses
            )
        except _Refused as refused:
            await _answer(writer, refused.status, refused.reason, str(refused))
            return
        except ValueError:
            await _answer(writer, 400, "Bad Request", "not an HTTP proxy request")
            return
        try:
            if intercept:
                # Bytes sent before the 200 (checked after the origin answered, which takes a while) would
                # be lost to the TLS started below: asyncio hands it only what arrives later. Clients wait.
                if _buffered(reader):
                    await _answer(
                        writer, 400, "Bad Request", "ipybox sandbox proxy: send TLS after the 200 answer"
                    )
                    return
                writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                await self._intercept(
                    reader, writer, upstream_reader, upstream_writer, normalize_host(host), port, routes, rule
                )
                return
            if method == "CONNECT":
                writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            else:
                upstream_writer.write(_origin_form(method, path, version, header_block))
                if body is not None:
                    # Checked: its body alone goes on, and nothing the client sends after it; the
                    # connection ends with the answer (an origin need not honour `Connection: close`).
                    await _copy(body, reader, upstream_writer, "request")
                    await _relay_answer(upstream_reader, writer, method, normalize_host(host))
                    return
            await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))
        finally:
            upstream_writer.close()

    async def _admit(
        self, hosts: DomainFilter, unknown: Unknown, host: str, port: int, method: str, client_pid: int | None
    ) -> tuple[RequestRule, list[_Address] | None]:
        """What `hosts` lets be asked of `host`, and, for a host a person let through (`unknown = "ask"`),
        the addresses checked before asking, which the connection goes to (no second lookup).

        Raises:
            _Refused: It is not allowed (403), or can't be resolved to ask about it (502).
        """
        rule = hosts.rule(host)
        if rule is not None:
            return rule, None
        name = normalize_host(host)
        if unknown == "deny" or hosts.denies(name):
            logger.info("sandbox network: refused %s (not in allowedDomains)", name)
            raise _Refused(403, "Forbidden", _not_allowed(name, denied=hosts.denies(name)))
        answer = self._granted.get(name)
        if answer is not None and not answer.allow:
            raise _Refused(403, "Forbidden", _asked_refusal(name, answer))
        addresses = await _resolve(name, port)
        if answer is None:
            internal = next(
                (f"{ip}: {why}" for _, _, ip, _ in addresses if (why := internal_reason(ip)) is not None),
                None,
            )
            answer = await self._asked(HostQuestion(name, port, method, internal, client_pid))
            if not answer.allow:
                logger.info("sandbox network: refused %s:%d: %s", name, port, answer.why)
                raise _Refused(403, "Forbidden", _asked_refusal(name, answer))
            logger.info("sandbox network: %s:%d allowed (%s)", name, port, answer.why or answer.scope)
        return RequestRule(json.dumps(name)), addresses

    async def _asked(self, question: HostQuestion) -> HostAnswer:
        """The answer to `question`, asked once for all the connections to its host that wait meanwhile.
        A `session` or `always` answer is kept for the host's next connections."""
        if self._ask is None:
            return HostAnswer(
                False,
                why='network.unknown = "ask", but this proxy has nobody to ask (only a workspace\'s '
                "supervisor asks: the kernel's application, the web console, `ipybox approve`)",
            )
        # Shared per host and client process (in a sandbox, one kernel's bridge): clients that the asker
        # may route to different answerers each get their own question.
        key = (question.host, question.client_pid)
        task = self._asking.get(key)
        if task is None:
            task = asyncio.ensure_future(self._ask_now(question))
            self._asking[key] = task
        # Shielded: a client that goes away does not withdraw the question others wait for too.
        return await asyncio.shield(task)

    async def _ask_now(self, question: HostQuestion) -> HostAnswer:
        assert self._ask is not None
        try:
            answer = await self._ask(question)
        except Exception as e:  # the asker's bug refuses the connection: fail closed
            logger.exception("sandbox network: asking about %s failed", question.host)
            answer = HostAnswer(False, why=f"asking failed ({type(e).__name__})")
        finally:
            self._asking.pop((question.host, question.client_pid), None)
        if answer.scope != "once":
            self._granted[question.host] = answer
        return answer

    def _refuse_in_clear(self, head: bytes, host: str) -> None:
        """Refuse a plain-HTTP request that carries a placeholder: its secret would go out in clear text."""
        sites = _placeholder_sites(head)
        for route in self.secrets:
            placeholder = route.placeholder.encode()
            if any(placeholder in site for site in sites):
                name = normalize_host(host)
                logger.warning(
                    "sandbox network: refused a plain http:// request to %s: it carries the placeholder of "
                    "secret %r",
                    name,
                    route.name,
                )
                raise _Refused(
                    403,
                    "Forbidden",
                    f"ipybox sandbox proxy: refused a plain http:// request to {name}: it carries the "
                    f"placeholder of secret {route.name!r}, which is put in only in https:// requests to "
                    f"{', '.join(route.hosts)} (over http:// it would travel in clear text)",
                )

    async def _intercept(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        upstream_reader: asyncio.StreamReader,
        upstream_writer: asyncio.StreamWriter,
        host: str,
        port: int,
        routes: tuple[SecretRoute, ...],
        rule: RequestRule | None,
    ) -> None:
        assert self._ca is not None
        # On the loop: a leaf is minted once per host (about 2 ms), then kept (2 us).
        context = self._ca.leaf_context(host)
        try:
            await writer.start_tls(context, ssl_handshake_timeout=_CONNECT_TIMEOUT)
        except (OSError, TimeoutError) as e:
            logger.info(
                "sandbox network: TLS with a sandboxed client for %s failed (does it trust the workspace's "
                "interception CA? see SSL_CERT_FILE): %s",
                host,
                e,
            )
            return
        others = tuple(route for route in self.secrets if route not in routes)
        checked = rule if rule is not None and rule.restricts else None
        relay = _Relay(reader, writer, upstream_reader, upstream_writer, host, port, routes, others, checked)
        await relay.run()

    async def _open(
        self,
        hosts: DomainFilter,
        host: str,
        port: int,
        *,
        tls: bool = False,
        addresses: list[_Address] | None = None,
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Connect to `host` (resolved here, or at `addresses`: checked, and a person let it through)."""
        name = normalize_host(host)
        asked = addresses is not None
        if not asked and not hosts.allows(name):
            logger.info("sandbox network: refused %s:%d (not in allowedDomains)", name, port)
            raise _Refused(403, "Forbidden", _not_allowed(name, denied=hosts.denies(name)))
        if addresses is None:
            addresses = await _resolve(name, port)
        if not asked and not hosts.names_exactly(name):
            # One internal address is enough to refuse: a name server may hand out any of them next time.
            internal = next(
                (f"{ip}: {why}" for _, _, ip, _ in addresses if (why := internal_reason(ip)) is not None),
                None,
            )
            if internal is not None:
                logger.warning("sandbox network: refused %s, which resolves to %s", name, internal)
                raise _Refused(
                    403,
                    "Forbidden",
                    f"ipybox sandbox: {name} resolves to an internal address ({internal}); "
                    "list it exactly in allowedDomains",
                )
        errors = []
        for family, proto, ip, ip_port in addresses:
            try:
                if not tls:
                    connecting = asyncio.open_connection(
                        ip, ip_port, family=family, proto=proto, limit=_RESPONSE_HEAD_LIMIT
                    )
                else:
                    connecting = asyncio.open_connection(
                        ip,
                        ip_port,
                        family=family,
                        proto=proto,
                        ssl=self._upstream_context,
                        server_hostname=name,
                        ssl_handshake_timeout=_CONNECT_TIMEOUT,
                        limit=_RESPONSE_HEAD_LIMIT,
                    )
                return await asyncio.wait_for(connecting, _CONNECT_TIMEOUT)
            except (OSError, TimeoutError) as e:
                errors.append(f"{ip}: {e or 'timed out'}")
        raise _Refused(
            502, "Bad Gateway", f"ipybox sandbox proxy: cannot connect to {name}: {'; '.join(errors)}"
        )


def _peer_pid(writer: asyncio.StreamWriter) -> int | None:
    """The pid of the process at the other end of a Unix socket (`SO_PEERCRED`, translated by the kernel
    into this process's pid namespace), or `None` when the platform or the socket can't tell."""
    sock = writer.get_extra_info("socket")
    option = getattr(socket, "SO_PEERCRED", None)
    if sock is None or option is None:
        return None
    try:
        pid, _, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, option, struct.calcsize("3i")))
    except (OSError, struct.error):
        return None
    return pid if pid > 0 else None


async def _resolve(name: str, port: int) -> list[_Address]:
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(name, port, type=socket.SOCK_STREAM)
    except OSError as e:
        raise _Refused(502, "Bad Gateway", f"ipybox sandbox proxy: cannot resolve {name}: {e}") from None
    return [(family, proto, str(info[0]), int(info[1])) for family, _, proto, _, info in infos]


def _checked_unknown(unknown: str, read_only: bool) -> Unknown:
    if unknown not in ("deny", "ask"):
        raise ValueError(f'network.unknown must be "deny" or "ask", not {unknown!r}')
    if unknown == "ask" and read_only:
        raise ValueError(ASK_WITH_READ_ONLY)
    return "ask" if unknown == "ask" else "deny"


def _not_allowed(name: str, *, denied: bool) -> str:
    """Why `name` is refused, and what a person changes to allow it (the model reads this, and tells them)."""
    if denied:
        return (
            f"ipybox sandbox: {name} is not in network.allowedDomains: it is in network.deniedDomains, which "
            "wins; a person allows it by removing it there ([sandbox.network] in ipybox.toml, or the "
            "sandbox policy file)"
        )
    return (
        f"ipybox sandbox: {name} is not in network.allowedDomains; a person allows it by adding it there "
        '([sandbox.network] in ipybox.toml, or the sandbox policy file), or has hosts asked about with unknown = "ask"'
    )


def _asked_refusal(name: str, answer: HostAnswer) -> str:
    return (
        f"ipybox sandbox: {name} is not in network.allowedDomains, and connecting to it was asked about: "
        f"{answer.why or 'denied'}; to allow it for good, add it to allowedDomains in [sandbox.network] "
        "of ipybox.toml"
    )


def _check_secrets(secrets: tuple[SecretRoute, ...], ca: InterceptionCA | None) -> None:
    if not secrets:
        return
    if ca is None:
        raise ValueError("secrets need an InterceptionCA to serve their hosts' certificates with")
    for route in secrets:
        for entry in route.hosts:
            if not any(covers(ca_entry, entry) for ca_entry in ca.hosts):
                raise ValueError(
                    f"secret {route.name!r} is for {entry}, which the interception CA was not made for "
                    f"({', '.join(ca.hosts)}): make it with every secret's hosts"
                )
    for route in secrets:
        for other in secrets:
            # A placeholder inside another's would be replaced inside it, leaving neither intact.
            if other is not route and route.placeholder in other.placeholder:
                raise ValueError(
                    f"secrets {route.name!r} and {other.name!r}: one's placeholder holds the other's"
                )


def _check_restricted(entries: tuple[str, ...], ca: InterceptionCA | None) -> None:
    """A CA given must be made for every restricted entry: the proxy reads the TLS to their hosts."""
    if ca is None:
        return  # CONNECTs to them are refused
    missing = [entry for entry in entries if not any(covers(ca_entry, entry) for ca_entry in ca.hosts)]
    if missing:
        raise ValueError(
            f"allowedDomains entries {', '.join(missing)} limit their requests (methods, paths or readOnly), "
            f"so the proxy reads the TLS to them, and the interception CA was not made for them "
            f"({', '.join(ca.hosts)}): make it with the secrets' hosts and DomainFilter.restricted_entries"
        )


def _checked_plain_request(head: bytes, rule: RequestRule, host: str, method: str, path: str) -> Framing:
    """How a plain-HTTP request to a restricted host frames its body, once its head passed the rule.

    Raises:
        _Refused: The rule refuses it, or its head could be read otherwise by the origin (as on an
            intercepted connection).
    """
    if (refusal := rule.refusal(host, method, path)) is not None:
        status, message = refusal
        logger.info("sandbox network: %s", message)
        raise _Refused(status, "Forbidden" if status == 403 else "Bad Request", message)
    start, fields = _parse_request_head(head)
    if not _TOKEN.fullmatch(start[0]) or _TARGET_FORBIDDEN.search(start[1]):
        raise _Refused(400, "Bad Request", "ipybox sandbox proxy: a malformed request line")
    if start[2] not in (b"HTTP/1.1", b"HTTP/1.0"):
        raise _Refused(505, "HTTP Version Not Supported", "ipybox sandbox proxy: only HTTP/1.x")
    if any(name == b"upgrade" for name, _, _ in fields):
        raise _Refused(
            501,
            "Not Implemented",
            f"ipybox sandbox proxy: no protocol upgrades to {host}, whose requests the proxy checks one by "
            "one",
        )
    return _request_framing(fields, start[2])


async def _relay_answer(
    upstream_reader: asyncio.StreamReader, writer: asyncio.StreamWriter, method: str, host: str
) -> None:
    """Relay the answer (and interim ones) to a checked plain-HTTP request, as far as its framing says."""
    answered = False
    try:
        while True:
            head = await upstream_reader.readuntil(b"\r\n\r\n")
            _, status, fields = _parse_response_head(head, host)
            if status < 100 or status == 101:
                raise _Broken(502, "Bad Gateway", f"ipybox sandbox proxy: {host} answered status {status}")
            writer.write(head)
            answered = True
            if status >= 200:
                break
        await _copy(
            _response_framing(fields, status, method.encode(), host), upstream_reader, writer, "answer"
        )
        await writer.drain()
    except _Broken as broken:
        logger.info("sandbox network: %s", broken)
        if not answered:
            await _answer(writer, broken.status, broken.reason, str(broken))
    except asyncio.LimitOverrunError:
        if not answered:
            await _answer(
                writer, 502, "Bad Gateway", f"ipybox sandbox proxy: {host} answered with a huge head"
            )


def _buffered(reader: asyncio.StreamReader) -> bool:
    # StreamReader has no public way to ask; its buffer is a bytearray in every CPython since 3.4.
    buffer = getattr(reader, "_buffer", b"")
    return bool(buffer)


def _placeholder_sites(head: bytes) -> list[bytes]:
    """Where in a request head a placeholder may be: the head itself, and the decoded credentials of its
    `Authorization: Basic` headers (a URL's password, base64-encoded)."""
    sites = [head]
    for line in head.split(b"\r\n")[1:]:
        name, colon, value = line.partition(b":")
        if colon and name.strip().lower() in (b"authorization", b"proxy-authorization"):
            credentials = basic_credentials(value.strip())
            if credentials is not None:
                sites.append(credentials)
    return sites


@dataclass
class _Request:
    head: bytes  # as the origin gets it
    method: bytes
    body: Framing
    keep_alive: bool


class _Relay:
    """HTTP/1.1 between a sandboxed client and an origin, request by request, on an intercepted
    connection (see the module's description)."""

    def __init__(
        self,
        client_reader: asyncio.StreamReader,
        client_writer: asyncio.StreamWriter,
        upstream_reader: asyncio.StreamReader,
        upstream_writer: asyncio.StreamWriter,
        host: str,
        port: int,
        routes: tuple[SecretRoute, ...],
        others: tuple[SecretRoute, ...],
        rule: RequestRule | None = None,
    ) -> None:
        self.client_reader, self.client_writer = client_reader, client_writer
        self.rule = rule  # checked on every request; None: nothing to check
        self.upstream_reader, self.upstream_writer = upstream_reader, upstream_writer
        self.host, self.port = host, port
        self.routes = [(route, route.placeholder.encode()) for route in routes]
        self.others = [(route, route.placeholder.encode()) for route in others]
        self.answering = False  # a final answer to the current request was started

    async def run(self) -> None:
        """Relay until either side ends the connection, or a request is refused."""
        try:
            while True:
                head = await self._next_head()
                if head is None:
                    return
                self.answering = False
                request = self._check(head)
                self.upstream_writer.write(request.head)
                if not await self._exchange(request):
                    return
        except _Broken as broken:
            logger.info("sandbox network: %s", broken)
            if not self.answering:
                await self._refuse(broken)
        except _Refused as refused:
            await self._refuse(refused)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as e:
            logger.debug("sandbox network: connection to %s ended: %r", self.host, e)

    async def _refuse(self, refused: _Refused) -> None:
        with contextlib.suppress(OSError):  # the client may be gone already
            await _answer(self.client_writer, refused.status, refused.reason, str(refused))

    async def _next_head(self) -> bytes | None:
        """The next request's head; `None` when the client closed, or the origin did while waiting."""
        # An origin closes idle connections (its keep-alive timeout): the client must see its connection
        # close then too, or it would send its next request into it (clients check a pooled connection
        # for that before reusing it, and retry only then).
        watch = asyncio.ensure_future(self.upstream_reader.read(1))
        watch.add_done_callback(lambda task: None if task.cancelled() else self.client_writer.close())
        head: bytes | None = None
        try:
            head = await self.client_reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as e:
            if e.partial:
                logger.debug("sandbox network: a client to %s closed in the middle of a request", self.host)
        except asyncio.LimitOverrunError:
            raise _Refused(
                431,
                "Request Header Fields Too Large",
                f"ipybox sandbox proxy: a request head larger than {_HEAD_LIMIT // 1024} KiB",
            ) from None
        finally:
            watch.cancel()
            await asyncio.wait({watch})
        if watch.cancelled():
            return head
        if watch.exception() is None and watch.result():
            logger.info("sandbox network: %s sent data before a request; connection closed", self.host)
        return None

    def _check(self, head: bytes) -> _Request:
        """The request as it goes to the origin, with the placeholders of this host's secrets replaced.

        Raises:
            _Refused: It is refused (see the module's description).
        """
        start, fields = _parse_request_head(head)
        method, target, version = start
        if not _TOKEN.fullmatch(method) or _TARGET_FORBIDDEN.search(target):
            raise _Refused(400, "Bad Request", "ipybox sandbox proxy: a malformed request line")
        if version not in (b"HTTP/1.1", b"HTTP/1.0"):
            raise _Refused(
                505,
                "HTTP Version Not Supported",
                f"ipybox sandbox proxy: only HTTP/1.1 to {self.host}, whose requests the proxy reads",
            )
        host_values = [value for name, _, value in fields if name == b"host"]
        if len(host_values) != 1:
            raise _Refused(
                400, "Bad Request", "ipybox sandbox proxy: a request needs exactly one Host header"
            )
        self._check_authority(host_values[0], "Host header")
        if target[:1] != b"/" and target != b"*":
            if not target.lower().startswith((b"https://", b"http://")):
                raise _Refused(
                    400, "Bad Request", "ipybox sandbox proxy: a request target must be a path or a URL"
                )
            self._check_authority(target.split(b"/", 3)[2], "request URL")
        if method == b"CONNECT":
            raise _Refused(
                501, "Not Implemented", f"ipybox sandbox proxy: no CONNECT inside a connection to {self.host}"
            )
        if self.rule is not None:
            self._check_rule(method.decode("latin-1"), target.decode("latin-1"))
        sites = _placeholder_sites(head)
        for route, placeholder in self.others:
            if any(placeholder in site for site in sites):
                logger.warning(
                    "sandbox network: refused a request to %s: it carries the placeholder of secret %r, "
                    "which is for %s",
                    self.host,
                    route.name,
                    ", ".join(route.hosts),
                )
                raise _Refused(
                    403,
                    "Forbidden",
                    f"ipybox sandbox proxy: refused a request to {self.host}: it carries the placeholder of "
                    f"secret {route.name!r}, which is only for {', '.join(route.hosts)}",
                )
        names = {name for name, _, _ in fields}
        if b"upgrade" in names:
            raise _Refused(
                501,
                "Not Implemented",
                f"ipybox sandbox proxy: no protocol upgrades (Upgrade: WebSocket, h2c) to {self.host}: the "
                "proxy reads each HTTP/1.1 request there (to put secrets in, or check it)",
            )
        body = _request_framing(fields, version)
        keep_alive = version == b"HTTP/1.1" and not _has_token(fields, b"connection", b"close")
        if any(placeholder in site for site in sites for _, placeholder in self.routes):
            head = _substituted(start, fields, self.routes)
        return _Request(head, method, body, keep_alive)

    def _check_rule(self, method: str, target: str) -> None:
        assert self.rule is not None
        if target[:1] != "/" and target != "*":
            # An absolute URL, whose authority was checked: its path (and query) is what the origin serves.
            rest = target.split("/", 3)
            target = "/" + (rest[3] if len(rest) > 3 else "")
        if (refusal := self.rule.refusal(self.host, method, target)) is not None:
            status, message = refusal
            logger.info("sandbox network: %s", message)
            raise _Refused(status, "Forbidden" if status == 403 else "Bad Request", message)

    def _check_authority(self, authority: bytes, what: str) -> None:
        try:
            host, port = _split_host_port(authority.decode("latin-1"), default_port=self.port)
        except ValueError:
            raise _Refused(400, "Bad Request", f"ipybox sandbox proxy: a malformed {what}") from None
        if normalize_host(host) != self.host or port != self.port:
            named = authority.decode("latin-1")
            logger.info("sandbox network: refused a request for %s on a connection to %s", named, self.host)
            raise _Refused(
                421,
                "Misdirected Request",
                f"ipybox sandbox proxy: this connection is to {self.host}:{self.port}, and the {what} names "
                f"{named}: open a connection to that host",
            )

    async def _exchange(self, request: _Request) -> bool:
        """Send the request's body and relay the answer; whether the connection goes on."""
        if request.body == 0:
            await self.upstream_writer.drain()
            return await self._answer(request) and request.keep_alive
        # Both at once: a client that sent `Expect: 100-continue` waits for the origin's 100 before it
        # sends the body, and an origin may answer (and refuse) before it has read the body.
        body = asyncio.ensure_future(_copy(request.body, self.client_reader, self.upstream_writer, "request"))
        answer = asyncio.ensure_future(self._answer(request))
        try:
            done, _ = await asyncio.wait({body, answer}, return_when=asyncio.FIRST_COMPLETED)
            if body in done and (error := body.exception()) is not None:
                raise error
            keep_alive = await answer
            # An answer before the whole body: where the next request starts is unknown.
            return keep_alive and request.keep_alive and body.done()
        finally:
            for task in (body, answer):
                task.cancel()
            await asyncio.wait({body, answer})
            for task in (body, answer):
                if not task.cancelled():
                    task.exception()  # retrieved: the first error was raised above

    async def _answer(self, request: _Request) -> bool:
        """Relay the origin's answer (and interim 1xx ones); whether the connection may go on."""
        while True:
            try:
                head = await self.upstream_reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                raise _Broken(
                    502,
                    "Bad Gateway",
                    f"ipybox sandbox proxy: {self.host} closed the connection without an answer",
                ) from None
            except asyncio.LimitOverrunError:
                raise _Broken(
                    502,
                    "Bad Gateway",
                    f"ipybox sandbox proxy: {self.host} answered with a head over {_RESPONSE_HEAD_LIMIT // 1024} KiB",
                ) from None
            version, status, fields = _parse_response_head(head, self.host)
            if status < 100:
                raise _Broken(
                    502, "Bad Gateway", f"ipybox sandbox proxy: {self.host} answered status {status}"
                )
            if status == 101:
                raise _Broken(
                    502, "Bad Gateway", f"ipybox sandbox proxy: {self.host} switched protocols unasked"
                )
            self.client_writer.write(head)
            if status < 200:
                continue
            self.answering = True
            body = _response_framing(fields, status, request.method, self.host)
            await _copy(body, self.upstream_reader, self.client_writer, "answer")
            return (
                body != "close" and version == b"HTTP/1.1" and not _has_token(fields, b"connection", b"close")
            )


def _parse_request_head(head: bytes) -> tuple[list[bytes], list[tuple[bytes, bytes, bytes]]]:
    """The request line's three parts and the header fields (lower-case name, name as sent, value),
    parsed strictly: what an origin could read otherwise is refused."""
    lines = head[:-4].split(b"\r\n")
    if any(b"\r" in line or b"\n" in line for line in lines):
        raise _Refused(400, "Bad Request", "ipybox sandbox proxy: a bare CR or LF in the request head")
    start = lines[0].split(b" ")
    if len(start) != 3 or not all(start):
        raise _Refused(400, "Bad Request", "ipybox sandbox proxy: a malformed request line")
    fields = []
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.fullmatch(name):
            why = "obsolete line folding" if line[:1] in (b" ", b"\t") else "a malformed header line"
            raise _Refused(400, "Bad Request", f"ipybox sandbox proxy: {why} in the request head")
        value = value.strip(b" \t")
        if _CONTROL.search(value):
            raise _Refused(400, "Bad Request", "ipybox sandbox proxy: a control character in a header value")
        fields.append((name.lower(), name, value))
    return start, fields


def _parse_response_head(head: bytes, host: str) -> tuple[bytes, int, list[tuple[bytes, bytes, bytes]]]:
    """An answer's version, status and fields; leniently (a bare LF ends a line), as clients read it."""
    lines = head.split(b"\n")
    version, _, rest = lines[0].rstrip(b"\r").partition(b" ")
    status_text = rest[:3]
    if not version.startswith(b"HTTP/1.") or len(status_text) != 3 or not status_text.isdigit():
        raise _Broken(
            502, "Bad Gateway", f"ipybox sandbox proxy: {host} answered with no HTTP/1.x status line"
        )
    fields = []
    for line in lines[1:]:
        name, colon, value = line.rstrip(b"\r").partition(b":")
        if colon:
            fields.append((name.strip().lower(), name, value.strip(b" \t")))
    return version, int(status_text), fields


def _request_framing(fields: list[tuple[bytes, bytes, bytes]], version: bytes) -> Framing:
    encodings = [value for name, _, value in fields if name == b"transfer-encoding"]
    lengths = [value for name, _, value in fields if name == b"content-length"]
    if encodings and lengths:
        raise _Refused(
            400,
            "Bad Request",
            "ipybox sandbox proxy: a request with both Content-Length and Transfer-Encoding is refused "
            "(an origin could frame it otherwise: request smuggling)",
        )
    if encodings:
        if len(encodings) != 1 or encodings[0].lower() != b"chunked":
            coding = b", ".join(encodings).decode("latin-1")
            raise _Refused(
                501, "Not Implemented", f"ipybox sandbox proxy: Transfer-Encoding {coding!r}: only 'chunked'"
            )
        if version != b"HTTP/1.1":
            raise _Refused(
                400, "Bad Request", "ipybox sandbox proxy: Transfer-Encoding in an HTTP/1.0 request"
            )
        return "chunked"
    if lengths:
        if len(lengths) != 1 or not lengths[0].isdigit() or len(lengths[0]) > 18:
            raise _Refused(
                400,
                "Bad Request",
                "ipybox sandbox proxy: a repeated or malformed Content-Length is refused (request smuggling)",
            )
        return int(lengths[0])
    return 0


def _response_framing(
    fields: list[tuple[bytes, bytes, bytes]], status: int, method: bytes, host: str
) -> Framing:
    """RFC 9112 6.3, in its order."""
    if method == b"HEAD" or status in _NO_BODY_STATUSES:
        return 0
    encodings = [value for name, _, value in fields if name == b"transfer-encoding"]
    if encodings:
        last = b",".join(encodings).split(b",")[-1].strip().lower()
        return "chunked" if last == b"chunked" else "close"
    lengths = {
        part.strip() for name, _, value in fields if name == b"content-length" for part in value.split(b",")
    }
    if not lengths:
        return "close"
    length = lengths.pop()
    if lengths or not length.isdigit() or len(length) > 18:
        raise _Broken(
            502, "Bad Gateway", f"ipybox sandbox proxy: {host} answered with a malformed Content-Length"
        )
    return int(length)


def _has_token(fields: list[tuple[bytes, bytes, bytes]], header: bytes, token: bytes) -> bool:
    return any(
        part.strip().lower() == token
        for name, _, value in fields
        if name == header
        for part in value.split(b",")
    )


def _substituted(
    start: list[bytes], fields: list[tuple[bytes, bytes, bytes]], routes: list[tuple[SecretRoute, bytes]]
) -> bytes:
    lines = [b" ".join(start)]
    for name, sent_name, value in fields:
        for route, _ in routes:
            value = route.substitute(name, value)
        lines.append(sent_name + b": " + value)
    return b"\r\n".join(lines) + b"\r\n\r\n"


async def _copy(
    framing: Framing, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, what: str
) -> None:
    """Copy one message body, as `framing` delimits it."""
    if framing == "close":
        while data := await reader.read(_COPY_SIZE):
            writer.write(data)
            await writer.drain()
    elif framing == "chunked":
        await _copy_chunked(reader, writer, what)
    else:
        await _copy_exactly(framing, reader, writer)


async def _copy_exactly(size: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while size > 0:
        data = await reader.read(min(size, _COPY_SIZE))
        if not data:
            raise asyncio.IncompleteReadError(b"", size)
        writer.write(data)
        size -= len(data)
        await writer.drain()


async def _copy_chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, what: str) -> None:
    """Copy a chunked body, chunk by chunk, then its trailers: the end is where the zero-size chunk's
    trailers end, as RFC 9112 7.1 has both sides find it."""
    while True:
        line = await reader.readuntil(b"\r\n")
        size_text, _, extension = line[:-2].partition(b";")
        size_text = size_text.rstrip(b" \t")
        if not _HEX.fullmatch(size_text) or b"\n" in extension or b"\r" in extension:
            raise _Broken(
                400, "Bad Request", f"ipybox sandbox proxy: a malformed chunk size line in the {what}"
            )
        writer.write(line)
        size = int(size_text, 16)
        if size == 0:
            break
        await _copy_exactly(size, reader, writer)
        if await reader.readexactly(2) != b"\r\n":
            raise _Broken(
                400, "Bad Request", f"ipybox sandbox proxy: a chunk of the {what} is longer than its size"
            )
        writer.write(b"\r\n")
        await writer.drain()
    trailers = 0
    while True:
        line = await reader.readuntil(b"\r\n")
        trailers += len(line)
        if b"\n" in line[:-2] or b"\r" in line[:-2] or trailers > _HEAD_LIMIT:
            raise _Broken(400, "Bad Request", f"ipybox sandbox proxy: malformed trailers in the {what}")
        writer.write(line)
        if line == b"\r\n":
            break
    await writer.drain()


def _split_host_port(authority: str, default_port: int | None) -> tuple[str, int]:
    if authority.startswith("["):
        host, _, rest = authority[1:].partition("]")
        port_text = rest.removeprefix(":")
    else:
        host, _, port_text = authority.rpartition(":") if ":" in authority else (authority, "", "")
    if not port_text:
        if default_port is None:
            raise ValueError("CONNECT needs host:port")
        return host, default_port
    port = int(port_text)
    if not 0 < port < 65536:
        raise ValueError("bad port")
    return host, port


def _parse_absolute_http(target: str) -> tuple[str, int, str]:
    if not target.lower().startswith("http://"):
        raise _Refused(400, "Bad Request", "ipybox sandbox proxy: use CONNECT for anything but http:// URLs")
    authority, slash, path = target[len("http://") :].partition("/")
    host, port = _split_host_port(authority, default_port=80)
    return host, port, slash + path or "/"


def _origin_form(method: str, path: str, version: str, header_block: bytes) -> bytes:
    """The request as the origin server expects it, on a connection that closes after the answer (so a
    client cannot send a second request, for another host, down the same connection)."""
    lines = [f"{method} {path} {version}".encode("latin-1")]
    for line in header_block.split(b"\r\n"):
        name = line.partition(b":")[0].strip().lower()
        if line and name not in _HOP_BY_HOP:
            lines.append(line)
    lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n"


async def _answer(writer: asyncio.StreamWriter, status: int, reason: str, message: str) -> None:
    """Answer with `status`, `message` as the plain-text body and also in the reason phrase: clients report
    a refused `CONNECT` by its status line alone (Python's `http.client`, hence requests, urllib3 and pip:
    `Tunnel connection failed: 403 Forbidden (ipybox sandbox: x.org is not in ...)`; curl -v), and the
    body is all a plain-HTTP client sees."""
    body = (message + "\n").encode()
    phrase = _PHRASE_UNSAFE.sub("?", message)
    if len(phrase) > _PHRASE_CHARS:
        phrase = phrase[: _PHRASE_CHARS - 3] + "..."
    head = (
        f"HTTP/1.1 {status} {reason} ({phrase})\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n"
    )
    writer.write(head.encode() + b"Connection: close\r\n\r\n" + body)
    await writer.drain()
