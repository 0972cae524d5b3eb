"""The `regex` of approval rules, run by RE2 (linear time) with the meaning Python's `re` gives it.

Why: rules are decided on the supervisor's event loop, and `ipybox validate` checks every rule's
examples. With Python's backtracking `re`, `regex = '(a+)+'` against a 28-character argument took 22 s
(every session and `ipybox status` froze meanwhile) and validating that rule's examples 83 s. RE2
(PyPI `google-re2`) matches in time linear in the argument: the same call is answered in microseconds.

Contracts:

- A rule's regex is written as for Python's `re` and keeps that meaning; it must match the whole
  argument (`fullmatch`). Where RE2 reads the same text differently, the pattern is translated before
  RE2 compiles it: `\\d`, `\\w`, `\\s` (and `\\D`, `\\W`, `\\S`) are Unicode classes in Python and ASCII
  ones in RE2, so they become `\\p{Nd}`, `[\\p{L}\\p{N}_]` and the exact list of Python's whitespace
  (checked against Python over every code point in tests/rules/test_linear_regex.py); `\\Z` becomes
  RE2's `\\z`; `x{,n}` becomes `x{0,n}` (RE2 would read a literal `{,n}`); `\\uXXXX`, `\\UXXXXXXXX`,
  `\\N{name}` and octal escapes become `\\x{...}`; `(?#...)` comments are dropped.
- What a linear-time engine cannot do is a load error naming the feature and what to do instead:
  look-around, backreferences, atomic groups, possessive quantifiers, conditional groups, and `\\b`/`\\B`
  (RE2's word boundary knows only ASCII letters, Python's all of Unicode: refused rather than silently
  narrowed). Anything else RE2 cannot compile is an "invalid regex" error with RE2's reason.
- RE2 syntax that Python's `re` lacks (`\\p{L}`, `\\z`, `[[:alpha:]]`, `\\Q...\\E`) is accepted with RE2's
  meaning: no pattern valid for Python changes meaning through it.
- Known differences that remain, both measured: `$` (without `(?m)`) also matches before a final newline
  in Python, so `a$\\n` fullmatches `"a\\n"` there and not here (a fullmatch pattern ending in `$` behaves
  the same); under `(?i)`, Python also folds `i` with the Turkish `İ` (U+0130) and `ı` (U+0131), RE2 does
  not.
- A string with lone surrogates (JSON allows `"\\ud800"`) is not text RE2 can read: `fullmatch` returns
  `None`, "cannot judge", which matching resolves toward caution as it does for a non-string.

Cost: a small argument costs ~3 us per regex (Python's `re`: 0.5 us); 16 MiB costs ~36 ms per regex
(DFA, no captures: `never_capture` makes it 28x faster than with RE2's submatch engine, and matching
UTF-8 bytes rather than `str` avoids the wrapper's offset bookkeeping, 3x). RE2 releases the GIL while it
matches, so a large decision in a worker thread does not hold up the event loop.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Final

import re2  # type: ignore[import-untyped]  # google-re2 ships no type information

__all__ = ["LinearRegex", "translate"]

# Python's classes for str patterns, in RE2 syntax. `\s` is exactly `str.isspace()`.
_WORD: Final = r"\p{L}\p{N}_"
_SPACE: Final = (
    r"\x{9}-\x{d}\x{1c}-\x{20}\x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000}"
)
_OUTSIDE_CLASS: Final = {
    "d": r"\p{Nd}",
    "D": r"\P{Nd}",
    "w": f"[{_WORD}]",
    "W": f"[^{_WORD}]",
    "s": f"[{_SPACE}]",
    "S": f"[^{_SPACE}]",
    "Z": r"\z",
}
_INSIDE_CLASS: Final = {"d": r"\p{Nd}", "D": r"\P{Nd}", "w": _WORD, "s": _SPACE, "b": r"\x{8}"}

_REPEAT: Final = re.compile(r"\{([0-9]*)(,([0-9]*))?\}")  # Python reads only ASCII digits here
_POSIX_CLASS: Final = re.compile(r"\[:\^?[a-z]+:\]")
_OCTAL: Final = frozenset("01234567")
_HEX: Final = frozenset("0123456789abcdefABCDEF")


def _unsupported(pattern: str, at: int, length: int, feature: str, advice: str) -> ValueError:
    snippet = pattern[at : at + length]
    return ValueError(
        f"regex {pattern!r} uses {feature} ({snippet!r} at position {at}), which ipybox's linear-time "
        f"regex engine does not support; {advice}"
    )


_LOOK_AROUND_ADVICE: Final = (
    "rewrite it without look-around (a glob or not_glob on the same argument, or a second rule, can often "
    "say what the look-around checked)"
)
_BACKREFERENCE_ADVICE: Final = "rewrite it without one (repeating a matched part needs backtracking)"
_GROUPS: Final = (
    ("(?<=", "look-around", _LOOK_AROUND_ADVICE),
    ("(?<!", "look-around", _LOOK_AROUND_ADVICE),
    ("(?=", "look-around", _LOOK_AROUND_ADVICE),
    ("(?!", "look-around", _LOOK_AROUND_ADVICE),
    ("(?>", "an atomic group", "rewrite it without one (a plain group (?:...) often matches the same)"),
    ("(?P=", "a backreference", _BACKREFERENCE_ADVICE),
    ("(?(", "a conditional group", "rewrite it as alternatives (a|b)"),
)


def _char(code: int) -> str:
    return f"\\x{{{code:x}}}"


def _escape(pattern: str, i: int, in_class: bool) -> tuple[str, int]:
    """The RE2 text for the escape at `pattern[i]` (a backslash) and the index after it."""
    if i + 1 >= len(pattern):
        return "\\", i + 1  # RE2 reports the trailing backslash
    c = pattern[i + 1]
    table = _INSIDE_CLASS if in_class else _OUTSIDE_CLASS
    if c in table:
        return table[c], i + 2
    if c in "bB" and not in_class:
        raise _unsupported(
            pattern,
            i,
            2,
            "a word boundary",
            "RE2's \\b knows only ASCII letters (Python's all of Unicode); a regex that must match the "
            "whole argument rarely needs one: rewrite it without",
        )
    if c in "WS":  # in a class: a negated class cannot be nested in RE2
        raise _unsupported(
            pattern, i, 2, f"\\{c} inside [...]", "list the characters the class should match instead"
        )
    if c == "Q":  # RE2's literal text, up to \E: copied as it is
        end = pattern.find("\\E", i + 2)
        end = len(pattern) if end == -1 else end + 2
        return pattern[i:end], end
    if c in "pP" and pattern.startswith("{", i + 2):
        end = pattern.find("}", i + 3)
        end = len(pattern) if end == -1 else end + 1
        return pattern[i:end], end
    if c == "x" and pattern.startswith("{", i + 2):
        end = pattern.find("}", i + 3)
        end = len(pattern) if end == -1 else end + 1
        return pattern[i:end], end
    for letter, digits in (("u", 4), ("U", 8)):
        hex_digits = pattern[i + 2 : i + 2 + digits]
        if c == letter and len(hex_digits) == digits and set(hex_digits) <= _HEX:
            return _char(int(hex_digits, 16)), i + 2 + digits
    if c == "N" and pattern.startswith("{", i + 2):
        end = pattern.find("}", i + 3)
        if end != -1:
            name = pattern[i + 3 : end]
            try:
                return _char(ord(unicodedata.lookup(name))), end + 1
            except KeyError:
                raise ValueError(f"regex {pattern!r}: unknown Unicode character name {name!r}") from None
    if c.isdigit() and c.isascii():
        return _number(pattern, i, in_class)
    if not c.isascii():
        return _char(ord(c)), i + 2  # an escaped non-ASCII character is itself (RE2 refuses the escape)
    return pattern[i : i + 2], i + 2


def _number(pattern: str, i: int, in_class: bool) -> tuple[str, int]:
    """`\\<digits>`: an octal escape or a backreference, by Python's rules."""
    digits = pattern[i + 1 : i + 4]
    if (in_class or digits[0] == "0") and digits[0] in _OCTAL:
        octal = digits[0]  # up to three octal digits
        for d in digits[1:]:
            if d not in _OCTAL:
                break
            octal += d
        return _char(int(octal, 8)), i + 1 + len(octal)
    if len(digits) == 3 and set(digits) <= _OCTAL:
        return _char(int(digits, 8)), i + 4  # `\1` to `\7` and two more octal digits: octal
    length = 3 if digits[1:2].isdigit() else 2
    raise _unsupported(pattern, i, length, "a backreference", _BACKREFERENCE_ADVICE)


def translate(pattern: str) -> str:
    """`pattern` (Python `re` syntax) as an RE2 pattern with the same meaning.

    Raises:
        ValueError: The pattern uses what a linear-time engine cannot do (the message names it and what
            to write instead).
    """
    out: list[str] = []
    i, n = 0, len(pattern)
    in_class = False
    class_start = -1  # where a `]` is still a literal (right after `[` or `[^`)
    after_quantifier = False
    while i < n:
        c = pattern[i]
        if c == "\\":
            text, i = _escape(pattern, i, in_class)
            out.append(text)
            after_quantifier = False
            continue
        if in_class:
            if c == "[" and (posix := _POSIX_CLASS.match(pattern, i)) is not None:
                out.append(posix.group())  # RE2's [:alpha:] (Python has no such classes)
                i = posix.end()
                continue
            if c == "]" and i != class_start:
                in_class = False
            out.append(c)
            i += 1
            continue
        if c == "[":
            start = i + 1 + pattern.startswith("^", i + 1)
            in_class, class_start = True, start
            out.append(pattern[i:start])
            i = start
            after_quantifier = False
            continue
        if c == "(" and pattern.startswith("(?", i):
            if pattern.startswith("(?#", i):
                end = pattern.find(")", i)
                i = n if end == -1 else end + 1
                continue  # Python skips comments while parsing; so does the translation
            for prefix, feature, advice in _GROUPS:
                if pattern.startswith(prefix, i):
                    raise _unsupported(pattern, i, len(prefix), feature, advice)
        if c in "*+?" or (c == "{" and _REPEAT.match(pattern, i)):
            if c == "+" and after_quantifier:
                raise _unsupported(
                    pattern, i - 1, 2, "a possessive quantifier", "drop the + after the quantifier"
                )
            if c == "?" and after_quantifier:  # a lazy quantifier: same strings match
                after_quantifier = False
                out.append(c)
                i += 1
                continue
            if c == "{" and (repeat := _REPEAT.match(pattern, i)) is not None:
                low, comma, high = repeat.group(1), repeat.group(2), repeat.group(3)
                if low or comma:  # Python: `{}` is a literal, `{,n}` is `{0,n}`, `{,}` is `*`
                    out.append(f"{{{low or '0'}{',' + high if comma else ''}}}")
                else:
                    out.append(repeat.group(0))
                i = repeat.end()
                after_quantifier = bool(low or comma)
                continue
            after_quantifier = True
            out.append(c)
            i += 1
            continue
        after_quantifier = False
        out.append(c)
        i += 1
    return "".join(out)


def _reason(error: Exception) -> str:
    """RE2's `b"<what>: <where>"` as `<what> at '<where>'`."""
    raw = error.args[0] if error.args else b""
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
    what, _, where = text.partition(": ")
    reason = f"{what} at {where!r}" if where else what
    if what == "invalid repetition size":
        reason += " (RE2 repeats at most 1000 times)"
    return reason


def _options() -> object:
    options = re2.Options()
    # Only whether the whole text matches is asked: without captures RE2 answers with its DFA.
    options.never_capture = True
    # Errors are raised with their reason; RE2 would also print them to stderr.
    options.log_errors = False
    return options


_OPTIONS: Final = _options()


class LinearRegex:
    """A rule's regex compiled for RE2, matched against whole strings.

    Args:
        pattern: The regex as written in the rule (Python `re` syntax).

    Raises:
        ValueError: The pattern is invalid or needs what a linear-time engine cannot do.
    """

    __slots__ = ("_regexp", "pattern")

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        translated = translate(pattern)
        try:
            self._regexp = re2.compile(translated, _OPTIONS)
        except re2.error as e:
            raise ValueError(f"invalid regex {pattern!r}: {_reason(e)}") from None

    def fullmatch(self, text: str) -> bool | None:
        """Whether the regex matches all of `text`; `None` when `text` has lone surrogates, which are not
        text RE2 can read."""
        try:
            data = text.encode()
        except UnicodeEncodeError:
            return None
        return self._regexp.fullmatch(data) is not None

    def __repr__(self) -> str:
        return f"LinearRegex({self.pattern!r})"
