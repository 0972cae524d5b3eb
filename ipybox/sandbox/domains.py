"""`DomainFilter`: which hosts a sandbox may reach, and which requests to them, from `network.allowedDomains`/
`deniedDomains`/`readOnly`.

Entries are host names (`pypi.org`), wildcards for subdomains (`*.pythonhosted.org`, which does not
match `pythonhosted.org` itself), or IP addresses. Denied entries win over allowed ones.

An allowed entry may also be a table (any object with `host`, `methods` and `paths`: the policy's
`DomainRule`) that limits what may be asked of its hosts:

- `methods`: the HTTP methods allowed (upper case, compared exactly as HTTP does); `None`: any.
- `paths`: globs over the request target's path (the query string is not matched: any is allowed),
  each starting with `/`. `*` matches within one segment (no `/`), `**` across segments (anything); a
  trailing `/**` also matches the path without it (`/repos/**` matches `/repos`, `/repos/` and everything
  below). Every other character matches itself. They are matched against the path exactly as the client
  sent it, without decoding: an encoded form of an allowed path (`/rep%6fs/x`) does not match. Because an
  origin normalizes what the proxy does not, a host with `paths` refuses (`target_path_error`) a path
  with a `.` or `..` segment (also as `%2e`, or with `;parameters`, as some servers read `..;`), an empty
  segment (`//`), an encoded `/`, `\\` or NUL (`%2f`, `%5c`, `%00`), a backslash or a NUL: each could
  make `/repos/../admin` pass a `/repos/**` rule. Hosts without `paths` are not checked so (GitLab's API
  takes `%2F` in project names).
- `readOnly` (the filter's `read_only`): every allowed entry is limited to `READ_ONLY_METHODS`; an
  entry's own `methods` narrow that further.

A host matched by several allowed entries gets the rule of the most specific one: an exact name over any
wildcard, a longer wildcard (`*.api.github.com`) over a shorter one (`*.github.com`). The same host may
not be listed twice when one of its entries is a table (which one would hold is not obvious). Rules are
enforced by [DomainProxy][ipybox.sandbox.proxy.DomainProxy], which reads each request to a host whose
rule restricts anything (HTTPS through its interception CA).
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

_LABEL = re.compile(r"^[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?$")
# RFC 9110 9.1: a method is a token; ipybox takes upper-case ones (every registered method is).
_METHOD = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Z]+")
# Visible ASCII but `?` and `#` (a glob matches the path alone) and `\` (refused in paths anyway).
_GLOB = re.compile(r"/[\x21-\x22\x24-\x3e\x40-\x5b\x5d-\x7e]*")
_DOT_SEGMENT = re.compile(r"%2e", re.IGNORECASE)
_ENCODED_FORBIDDEN = re.compile(r"%(2f|5c|00)", re.IGNORECASE)

READ_ONLY_METHODS = ("GET", "HEAD", "OPTIONS")
"""What `readOnly` allows."""


class AllowedEntry(Protocol):
    """An allowed entry with rules (the policy's `DomainRule`)."""

    @property
    def host(self) -> str: ...

    @property
    def methods(self) -> Sequence[str] | None: ...

    @property
    def paths(self) -> Sequence[str] | None: ...


def normalize_host(host: str) -> str:
    """Lower case, no trailing dot, no IPv6 brackets."""
    return host.strip().lower().rstrip(".").removeprefix("[").removesuffix("]")


def domain_entry_error(entry: str) -> str | None:
    """Why `entry` is not a valid allowed/denied domain entry (None when it is)."""
    host = normalize_host(entry.removeprefix("*."))
    try:
        ipaddress.ip_address(host)
        return None if not entry.startswith("*.") else f"{entry!r}: a wildcard needs a domain, not an address"
    except ValueError:
        pass
    if "/" in entry or ":" in entry:
        return f"{entry!r} must be a host name like 'pypi.org' or '*.pypi.org', without scheme, port or path"
    labels = host.split(".")
    if not host or not all(_LABEL.match(label) for label in labels):
        return f"{entry!r} is not a valid host name (e.g. 'pypi.org' or '*.pypi.org')"
    return None


def method_error(method: str) -> str | None:
    """Why `method` can't be in an entry's `methods` (None when it can)."""
    if not _METHOD.fullmatch(method):
        return f"method {method!r} must be an upper-case HTTP method such as 'GET' or 'POST'"
    if method == "CONNECT":
        return (
            "method 'CONNECT' is how clients open HTTPS tunnels, not a request the proxy lets through: list "
            "the methods of the requests inside (GET, POST, ...)"
        )
    return None


def path_glob_error(glob: str) -> str | None:
    """Why `glob` can't be in an entry's `paths` (None when it can; see the module's description)."""
    if not _GLOB.fullmatch(glob):
        return (
            f"path {glob!r} must start with '/' and hold visible ASCII characters but '?', '#' and '\\' "
            "(the query string is not matched)"
        )
    if "***" in glob:
        return f"path {glob!r}: use '*' (within a segment) or '**' (across segments), not '***'"
    segments = glob.split("/")[1:]
    if any(segment in (".", "..") for segment in segments):
        return f"path {glob!r}: no '.' or '..' segments (requests with them are refused)"
    return None


def target_path_error(path: str) -> str | None:
    """Why a request path (without its query) is refused on a host whose rule has `paths`, where an origin
    could normalize it into a path the rule does not allow (see the module's description); None when it
    is matched as it is."""
    if not path.startswith("/"):
        return f"the request target {path!r} is not a path"
    if "\\" in path or "\x00" in path or _ENCODED_FORBIDDEN.search(path):
        return f"the path {path!r} holds a backslash, a NUL, or an encoded '/', '\\' or NUL"
    segments = path.split("/")[1:]
    for index, segment in enumerate(segments):
        if not segment and index < len(segments) - 1:
            return f"the path {path!r} has an empty segment ('//')"
        if _DOT_SEGMENT.sub(".", segment).partition(";")[0] in (".", ".."):
            return f"the path {path!r} has a '.' or '..' segment"
    return None


def _glob_regex(glob: str) -> str:
    tail = ""
    if glob.endswith("/**"):
        glob, tail = glob[:-3], "(?:/.*)?"
    parts = ("[^/]*".join(re.escape(piece) for piece in part.split("*")) for part in glob.split("**"))
    return ".*".join(parts) + tail


def entry_text(entry: str | AllowedEntry) -> str:
    """An entry as `ipybox.toml` spells it, for messages: `"pypi.org"`, or
    `{ host = "api.github.com", methods = ["GET"], paths = ["/repos/**"] }`."""
    if isinstance(entry, str):
        return json.dumps(entry)
    keys = [f"host = {json.dumps(entry.host)}"]
    if entry.methods is not None:
        keys.append(f"methods = {json.dumps(list(entry.methods))}")
    if entry.paths is not None:
        keys.append(f"paths = {json.dumps(list(entry.paths))}")
    return "{ " + ", ".join(keys) + " }"


_HOW_TO_ALLOW = (
    "to allow it, edit allowedDomains (or readOnly) in [sandbox.network] of ipybox.toml (or the sandbox "
    "policy in use)"
)


@dataclass(frozen=True)
class RequestRule:
    """What may be asked of one host (see the module's description).

    Attributes:
        entry: The allowed entry that granted the host, as `ipybox.toml` spells it (for messages).
        methods: The methods allowed, `readOnly` included; `None`: any.
        paths: The path globs; `None`: any path.
        entry_methods: The entry's own `methods` (without `readOnly`); `None`: any.
        read_only: `readOnly` narrowed `methods`.
    """

    entry: str
    methods: frozenset[str] | None = None
    paths: tuple[str, ...] | None = None
    entry_methods: frozenset[str] | None = None
    read_only: bool = False
    # Compiled once, when the filter is made: one alternation of every glob, matched in full.
    pattern: re.Pattern[str] | None = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        if self.paths is not None:
            regex = "|".join(f"(?:{_glob_regex(glob)})" for glob in self.paths)
            object.__setattr__(self, "pattern", re.compile(regex))

    @property
    def restricts(self) -> bool:
        """Whether requests must be read to be checked (methods or paths are limited)."""
        return self.methods is not None or self.paths is not None

    def refusal(self, host: str, method: str, target: str) -> tuple[int, str] | None:
        """The status and message refusing `method` on `target` (origin-form: path and query) of `host`;
        `None` when the rule allows it. The message names the host, the request, the entry (or
        `readOnly`) and how to allow it."""
        path = target.partition("?")[0]
        if self.methods is not None and method not in self.methods:
            allowed = ", ".join(sorted(self.methods))
            if self.read_only and (self.entry_methods is None or method in self.entry_methods):
                granted = (
                    f"readOnly = true in [sandbox.network] allows only {allowed} (allowedDomains entry "
                    f"{self.entry})"
                )
            else:
                granted = f"allowedDomains entry {self.entry} allows only {allowed}"
            return 403, f"ipybox sandbox proxy: refused {method} {path} to {host}: {granted}; {_HOW_TO_ALLOW}"
        if self.pattern is not None:
            if (why := target_path_error(path)) is not None:
                return 400, (
                    f"ipybox sandbox proxy: refused {method} to {host}: {why}, which the origin could read "
                    f"as a path that allowedDomains entry {self.entry} does not allow; send the plain path"
                )
            if not self.pattern.fullmatch(path):
                return 403, (
                    f"ipybox sandbox proxy: refused {method} {path} to {host}: allowedDomains entry "
                    f"{self.entry} allows only the paths {', '.join(self.paths or ())}; {_HOW_TO_ALLOW}"
                )
        return None


class DomainFilter:
    """Decides whether a host may be reached, and with which requests.

    Args:
        allowed: Allowed entries: strings, or entries with rules (nothing is reachable when empty).
        denied: Denied entries, checked first.
        read_only: Limit every allowed entry to `READ_ONLY_METHODS` (`readOnly`).

    Raises:
        ValueError: A host is listed twice and one of its entries has rules, or an entry's methods leave
            none with `read_only`.

    Example:
        ```python
        hosts = DomainFilter(["pypi.org", "*.pythonhosted.org"])
        assert hosts.allows("files.pythonhosted.org") and not hosts.allows("example.com")
        ```
    """

    def __init__(
        self, allowed: Iterable[str | AllowedEntry], denied: Iterable[str] = (), *, read_only: bool = False
    ) -> None:
        self._entries: dict[str, RequestRule] = {}
        for entry in allowed:
            host = normalize_host(entry if isinstance(entry, str) else entry.host)
            rule = _rule_of(entry, read_only)
            previous = self._entries.get(host)
            if previous is not None and previous != rule:
                raise ValueError(
                    f"allowedDomains lists {host!r} twice ({previous.entry} and {rule.entry}): keep one "
                    "entry for it"
                )
            self._entries[host] = rule
        self._allowed = list(self._entries)
        self._denied = [normalize_host(entry) for entry in denied]

    def allows(self, host: str) -> bool:
        """Whether `host` matches an allowed entry and no denied one."""
        host = normalize_host(host)
        return _matches(host, self._allowed) and not _matches(host, self._denied)

    def denies(self, host: str) -> bool:
        """Whether a denied entry matches `host` (no answer to an ask lets it through)."""
        return _matches(normalize_host(host), self._denied)

    def names_exactly(self, host: str) -> bool:
        """Whether an allowed entry is `host` itself, not a wildcard that happens to cover it.

        Only such hosts may resolve to loopback or private addresses: a wildcard must not let a name
        someone else controls point the sandbox at services on the host or the local network.
        """
        return normalize_host(host) in self._entries

    def rule(self, host: str) -> RequestRule | None:
        """The rule of the most specific allowed entry matching `host`; `None` when it is not allowed."""
        host = normalize_host(host)
        if not self.allows(host):
            return None
        if host in self._entries:
            return self._entries[host]
        wildcards = [entry for entry in self._allowed if entry.startswith("*.") and host.endswith(entry[1:])]
        return self._entries[max(wildcards, key=len)]

    @property
    def restricted_entries(self) -> tuple[str, ...]:
        """The allowed entries whose rule restricts requests (normalized): the proxy reads the TLS to
        their hosts, so its interception CA must be made for them."""
        return tuple(host for host, rule in self._entries.items() if rule.restricts)


def _rule_of(entry: str | AllowedEntry, read_only: bool) -> RequestRule:
    text = entry_text(entry)
    own = None if isinstance(entry, str) or entry.methods is None else frozenset(entry.methods)
    paths = None if isinstance(entry, str) or entry.paths is None else tuple(entry.paths)
    methods = own
    if read_only:
        methods = frozenset(READ_ONLY_METHODS) if own is None else own & frozenset(READ_ONLY_METHODS)
        if not methods:
            raise ValueError(
                f"allowedDomains entry {text} allows only {', '.join(sorted(own or ()))}, and readOnly = "
                f"true only {', '.join(READ_ONLY_METHODS)}: nothing is left; drop the entry or readOnly"
            )
    return RequestRule(text, methods, paths, own, read_only)


def covers(outer: str, inner: str) -> bool:
    """Whether every host the entry `inner` matches is one the entry `outer` matches: the same entry, or
    a wildcard `*.x` over a host or a wildcard below `x` (`*.x` does not match `x` itself).

    Example:
        ```python
        assert covers("*.github.com", "api.github.com") and covers("*.github.com", "*.api.github.com")
        assert not covers("*.github.com", "github.com") and not covers("api.github.com", "*.github.com")
        ```
    """
    outer, inner = normalize_host(outer), normalize_host(inner)
    return outer == inner or (outer.startswith("*.") and inner.endswith(outer[1:]))


def _matches(host: str, entries: list[str]) -> bool:
    for entry in entries:
        if entry.startswith("*."):
            if host.endswith(entry[1:]):
                return True
        elif host == entry:
            return True
    return False
