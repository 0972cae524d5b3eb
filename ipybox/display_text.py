"""Text from outside ipybox made safe to show a person: the one sanitiser for everything ipybox prints to a
terminal or puts on a console page that came from a kernel, an MCP server or a file a kernel wrote (tool
names and arguments, a parser's exception message, a server's stderr, the log, a traceback).

Contract: `printable(text)` returns `text` with every character that a terminal or a browser would not
show as itself written as a visible escape (`\\x1b`, `\\x0d`, `\\u202e`, `\\u200b`, `\\ud800`):

- control characters (C0 and C1: escape sequences such as OSC 52, which writes the clipboard, a title set,
  CSI clear screen, a carriage return that overwrites the line, a bell);
- format characters (bidi overrides and isolates U+202A-202E, U+2066-2069, which reorder text; zero-width
  spaces and joiners U+200B-200D, U+2060, U+FEFF; tags), surrogates (a lone one can't even be encoded),
  private-use and unassigned characters, line and paragraph separators;
- a few letters and marks that render as nothing (Hangul fillers, the combining grapheme joiner, Khmer
  and Mongolian invisible marks), which could hide or fake a difference between two names.

With `lines=True`, newlines and tabs are kept (text shown as several lines: a log, a traceback, a `<pre>`);
everything else is escaped the same way. The result holds no such character, so `printable` applied
again changes nothing. Backslashes are not escaped: `\\x1b` in the output may have been those four
characters in the input, which is harmless (it shows as what it is). Everything else (letters of any
script, emoji, combining accents, spaces) is kept, so ordinary text reads as it is.

`one_line` is the same for a single line (a progress line): whitespace runs, newlines included, become
one space. `PrintableFormatter` is a logging formatter whose records come out through `printable`.
"""

from __future__ import annotations

import functools
import logging
import re
import unicodedata
from typing import Final

__all__ = ["PrintableFormatter", "one_line", "printable"]

_INVISIBLE: Final = frozenset(
    "\u034f"  # combining grapheme joiner
    "\u115f\u1160\u3164\uffa0"  # Hangul fillers
    "\u17b4\u17b5"  # Khmer inherent vowels
    "\u180b\u180c\u180d\u180f"  # Mongolian free variation selectors
)
"""Characters that are letters or marks, not format characters, and still show as nothing."""

# Only characters outside printable ASCII (and, for lines, newline and tab) are looked at one by one.
_LOOKED_AT: Final = re.compile(r"[^\x20-\x7e]")
_LOOKED_AT_IN_LINES: Final = re.compile(r"[^\x20-\x7e\n\t]")


def _escaped(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


@functools.lru_cache(maxsize=4096)
def _shown(char: str) -> str:
    """`char` as `printable` shows it."""
    return _escaped(char) if _hidden(char) else char


def _hidden(char: str) -> bool:
    """Whether `char` would not show as itself: control, format, surrogate, private-use, unassigned (all
    `C*` categories), a line or paragraph separator, or an invisible letter or mark."""
    category = unicodedata.category(char)
    return category[0] == "C" or category in ("Zl", "Zp") or char in _INVISIBLE


def printable(text: str, *, lines: bool = False) -> str:
    """`text` with every character that would not show as itself escaped (see the module); `lines`:
    newlines and tabs are kept."""
    looked_at = _LOOKED_AT_IN_LINES if lines else _LOOKED_AT
    return looked_at.sub(lambda match: _shown(match.group()), text)


def one_line(text: str) -> str:
    """`text` as one printable line: newlines, tabs and runs of spaces as one space, everything else that
    would not show as itself escaped."""
    return " ".join(printable(text, lines=True).split())


class PrintableFormatter(logging.Formatter):
    """A `logging.Formatter` whose output (message, arguments, traceback) goes through `printable` with its
    lines kept: a record carrying a server's stderr can't put an escape sequence on the terminal or into
    the log file that `ipybox logs` prints."""

    def format(self, record: logging.LogRecord) -> str:
        return printable(super().format(record), lines=True)
