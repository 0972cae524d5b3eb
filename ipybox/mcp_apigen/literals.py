"""Putting untrusted strings and JSON values into generated Python source, safely.

Everything a server sends (descriptions, titles, names, enum values, defaults) reaches generated code
only through these functions: as a string literal built by `repr()`, or as docstring text in which
no quote run, backslash, control character or line separator survives unescaped.
"""

from __future__ import annotations

import math
import re
from typing import Any

from ipybox.errors import IpyboxError

_QUOTE_RUN = re.compile(r'"(?=")')


class NotALiteralError(IpyboxError, ValueError):
    """A JSON value that cannot be written as a Python literal (e.g. a non-finite float)."""


def py_str(value: str) -> str:
    """A Python string literal for `value`, preferring double quotes (as `ruff format` does)."""
    literal = repr(value)
    if literal[0] == "'" and '"' not in value and "'" not in value:
        literal = f'"{literal[1:-1]}"'
    return literal


def py_literal(value: Any) -> str:
    """A Python literal for a JSON value (`None`, bool, int, finite float, str, list, dict).

    Raises:
        NotALiteralError: `value` is not a JSON value with a safe literal form.
    """
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, int):
        return repr(int(value))
    if isinstance(value, float):
        if not math.isfinite(value):
            raise NotALiteralError(f"{value!r} has no JSON literal")
        return repr(float(value))
    if isinstance(value, str):
        return py_str(value)
    if isinstance(value, list):
        return "[" + ", ".join(py_literal(item) for item in value) + "]"
    if isinstance(value, dict):
        items = []
        for key, item in value.items():
            if not isinstance(key, str):
                raise NotALiteralError("JSON object keys must be strings")
            items.append(f"{py_str(key)}: {py_literal(item)}")
        return "{" + ", ".join(items) + "}"
    raise NotALiteralError(f"{type(value).__name__} is not a JSON value")


def _escape_char(char: str) -> str:
    if char == "\t":
        return "    "
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def doc_text(value: str) -> str:
    """Text safe to place between `\"\"\"` quotes of a (non-raw) docstring.

    Backslashes are doubled, every quote followed by another quote is escaped (so no `\"\"\"` can
    form), a trailing quote is escaped, line breaks are normalized to `\\n`, trailing spaces are
    removed, and every other non-printable character (NUL, escape, U+2028, ...) becomes an escape.
    """
    text = value.replace("\r\n", "\n").replace("\r", "\n").replace("\\", "\\\\")
    text = "".join(char if char == "\n" or char.isprintable() else _escape_char(char) for char in text)
    text = _QUOTE_RUN.sub('\\\\"', text)
    text = "\n".join(line.rstrip() for line in text.split("\n")).strip("\n")
    if text.endswith('"'):
        text = text[:-1] + '\\"'
    return text


def docstring(value: str | None, indent: str = "") -> str:
    """A complete docstring literal for `value` (empty if there is no text), indented for its block."""
    text = doc_text(value or "")
    if not text:
        return ""
    lines = text.split("\n")
    if len(lines) == 1:
        return f'"""{text}"""'
    body = "\n".join(f"{indent}{line}" if line else "" for line in lines[1:])
    return f'"""{lines[0]}\n{body}\n{indent}"""'


def first_line(value: str | None, limit: int = 120) -> str:
    """The first sentence of a description's first paragraph (its lines joined: docstrings wrap), at most
    `limit` characters (unescaped)."""
    if not value:
        return ""
    paragraph = re.split(r"\n\s*\n", value.strip(), maxsplit=1)[0]
    line = " ".join(part.strip() for part in paragraph.splitlines() if part.strip())
    sentence = re.match(r"(.+?[.!?])(\s|$)", line)
    if sentence:
        line = sentence.group(1)
    return line if len(line) <= limit else line[: limit - 3].rstrip() + "..."
