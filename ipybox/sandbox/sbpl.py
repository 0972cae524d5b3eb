"""Writing Seatbelt profile language (SBPL) safely: strings, regexes and path filters.

SBPL is a Scheme dialect that libsandbox reads with TinyScheme. A path goes into a profile as a string
literal, and nothing in a path may end that literal early: `string()` escapes the only two characters
that could (`\\` and `"`) and refuses control characters, so no file name, however chosen, adds a rule.
"""

from __future__ import annotations

from collections.abc import Iterable

from ipybox.sandbox.errors import SandboxUnavailableError

# The metacharacters of the POSIX extended regular expressions Seatbelt's `regex` filter takes. Only these
# are escaped: in ERE a backslash before an ordinary character is undefined, not a harmless no-op.
_REGEX_SPECIAL = frozenset(".[]()*+?{}|^$\\")


def string(text: str) -> str:
    """`text` as an SBPL string literal.

    Raises:
        SandboxUnavailableError: `text` has a control character (a newline in a file name, say), which
            ipybox does not put into a profile.
    """
    if any(ord(char) < 0x20 or ord(char) == 0x7F for char in text):
        raise SandboxUnavailableError(
            f"the macOS sandbox cannot name {text!r} in its profile (it has a control character): "
            "rename it, or run with sandbox=False"
        )
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def regex_literal(text: str) -> str:
    """`text` as a regular expression that matches exactly `text`."""
    return "".join(f"\\{char}" if char in _REGEX_SPECIAL else char for char in text)


def literal(path: str) -> str:
    """A filter matching exactly `path`."""
    return f"(literal {string(path)})"


def subpath(path: str) -> str:
    """A filter matching `path` and everything under it."""
    return f"(subpath {string(path)})"


def regex(pattern: str) -> str:
    """A filter matching the paths `pattern` (a POSIX extended regular expression) matches."""
    return f"(regex {string(pattern)})"


def rule(action: str, operations: str, filters: Iterable[str]) -> list[str]:
    """The lines of `(action operations filter...)`, or none when there are no filters.

    A rule without filters applies to every path: an allow rule that lost its filters must vanish, not
    allow everything.
    """
    unique = list(dict.fromkeys(filters))
    if not unique:
        return []
    return [f"({action} {operations}", *(f"  {item}" for item in unique[:-1]), f"  {unique[-1]})"]
