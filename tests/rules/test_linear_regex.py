"""Rule regexes on RE2: linear time, and the meaning Python's `re` gives the same pattern."""

from __future__ import annotations

import re
import sys
import unicodedata
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ipybox.rules.linear_regex import LinearRegex, translate


@pytest.mark.timeout(
    10
)  # a guard against a hang (SIGALRM interrupts a backtracking match), not a speed check
def test_a_nested_quantifier_against_a_28_character_argument_returns() -> None:
    # Python's re takes ~20 s here (four times as long per two more characters); RE2 answers at once.
    regex = LinearRegex("(a+)+")
    assert regex.fullmatch("a" * 28 + "!") is False
    assert regex.fullmatch("a" * 1_000_000 + "!") is False
    assert regex.fullmatch("a" * 28) is True


# --- same meaning as Python's re -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "texts"),
    [
        # RE2's \d \w \s are ASCII; Python's are Unicode.
        (r"\d+", ["123", "١٢٣", "12a", "²"]),
        (r"\w+", ["abc_1", "héllo", "日本語", "a-b", "x\u0301"]),
        (r"\s*", [" \t\n", "\u00a0\u2003\u3000", "\x0b\x1c", "a"]),
        (r"[\w.-]+", ["a.b-c", "ü.ß", "a b"]),
        (r"\D\W\S", ["a b", "1 b", "a_b"]),
        (r"[^\d]+", ["abc", "a١"]),
        # \Z is RE2's \z; \A is the same in both.
        (r"\Aabc\Z", ["abc", "abc\n"]),
        (r"abc$", ["abc", "abc\n"]),
        # Case folding: the Kelvin sign and the long s fold with k and s in both.
        (r"(?i)kiss", ["KISS", "\u212aiss", "ki\u017fs", "kisS"]),
        (r"(?i:ab)c", ["ABc", "ABC"]),
        # Repeats: Python's {,n} is {0,n} (a literal in RE2), {,} is *, {} is a literal.
        (r"x{,2}", ["", "xx", "xxx", "x{,2}"]),
        (r"x{,}", ["", "xxxx"]),
        (r"x{}", ["x{}", "x"]),
        (r"a{2,3}?b", ["aab", "aaab", "ab"]),
        # Escapes Python has and RE2 spells differently.
        (r"\u00e9\U0001F600", ["é😀", "e😀"]),
        (r"\N{EM DASH}", ["—", "-"]),
        (r"\101\0", ["A\0", "A"]),
        (r"[\101-\103]+", ["ABC", "D"]),
        (r"[\b]", ["\b", "b"]),
        (r"a(?#a comment)*b", ["aaab", "b"]),
        # Classes: a leading ] is a literal in both.
        (r"[]a]+", ["]a]", "b"]),
        (r"[^]a]+", ["bc", "]"]),
        # Dot, anchors and flags.
        (r"a.c", ["abc", "a\nc"]),
        (r"(?s)a.c", ["a\nc"]),
        (r"(?m)a$\n^b", ["a\nb"]),
        (r"https://example\.com/.*", ["https://example.com/x", "https://exampleXcom/"]),
    ],
)
def test_a_pattern_means_what_it_means_in_python(pattern: str, texts: list[str]) -> None:
    regex = LinearRegex(pattern)
    for text in texts:
        assert regex.fullmatch(text) is (re.fullmatch(pattern, text) is not None), (pattern, text)


@cache
def assigned_code_points() -> str:
    """Every code point Python's Unicode database assigns (RE2's tables are newer: code points Python
    does not know yet would differ only because of that)."""
    return "".join(
        chr(c)
        for c in range(sys.maxunicode + 1)
        if not 0xD800 <= c <= 0xDFFF and unicodedata.category(chr(c)) != "Cn"
    )


@pytest.mark.parametrize("escape", [r"\d", r"\w", r"\s"])
def test_unicode_classes_match_exactly_the_characters_python_s_do(escape: str) -> None:
    everything = assigned_code_points()
    inside = set(re.findall(escape, everything))
    members = "".join(c for c in everything if c in inside)
    others = "".join(c for c in everything if c not in inside)
    negated = escape.upper()
    for pattern, text in [
        (f"{escape}*", members),
        (f"[{escape}]*", members),
        (f"{negated}*", others),
        (f"[^{escape}]*", others),
    ]:
        assert LinearRegex(pattern).fullmatch(text), pattern
    if escape == r"\d":  # \W and \S are refused inside a class (RE2 cannot nest a negated class)
        assert LinearRegex(f"[{negated}]*").fullmatch(others)


_ALPHABET = "abA1_ é١\n-."
_ATOMS = [
    "a",
    "b",
    ".",
    r"\d",
    r"\w",
    r"\s",
    r"\D",
    r"\W",
    r"\S",
    "[a-b]",
    r"[\w-]",
    r"[^\s1]",
    "é",
    r"\.",
    "1",
]


@st.composite
def sequences(draw: st.DrawFn, depth: int = 2) -> str:
    parts = []
    for _ in range(draw(st.integers(1, 3))):
        atom = draw(st.sampled_from(_ATOMS))
        if depth and draw(st.booleans()):
            inner = draw(sequences(depth - 1))
            alternative = "|" + draw(sequences(depth - 1)) if draw(st.booleans()) else ""
            atom = f"({inner}{alternative})"
        parts.append(atom + draw(st.sampled_from(["", "*", "+", "?", "{,2}", "{1,2}", "*?", "{2}"])))
    return "".join(parts)


@st.composite
def patterns(draw: st.DrawFn) -> str:
    flags = draw(st.sampled_from(["", "(?i)", "(?s)"]))
    return flags + draw(sequences()) + draw(st.sampled_from(["", "$", r"\Z"]))


@settings(max_examples=150, deadline=None)
@given(pattern=patterns(), texts=st.lists(st.text(_ALPHABET, max_size=6), min_size=1, max_size=8))
def test_random_patterns_agree_with_python(pattern: str, texts: list[str]) -> None:
    regex = LinearRegex(pattern)
    compiled = re.compile(pattern)
    for text in texts:
        assert regex.fullmatch(text) is (compiled.fullmatch(text) is not None), (
            pattern,
            text,
            translate(pattern),
        )


def test_known_differences_from_python_are_the_documented_ones() -> None:
    # `$` also matches before a final newline in Python: only a pattern going on after `$` can tell.
    assert re.fullmatch(r"a$\n", "a\n") and not LinearRegex(r"a$\n").fullmatch("a\n")
    # Python also folds i with the Turkish dotted I and dotless i.
    assert re.fullmatch("(?i)i", "\u0131") and not LinearRegex("(?i)i").fullmatch("\u0131")


def test_re2_syntax_python_lacks_is_accepted_with_its_re2_meaning() -> None:
    assert LinearRegex(r"\p{Greek}+").fullmatch("αβγ")
    assert LinearRegex(r"[[:alpha:]]+").fullmatch("abc")
    assert LinearRegex(r"\Qa.b\E").fullmatch("a.b") and not LinearRegex(r"\Qa.b\E").fullmatch("axb")
    assert LinearRegex(r"a\z").fullmatch("a")


# --- refused: what a linear-time engine cannot do ------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "feature", "where"),
    [
        (r"(?=.*\d)\w+", "look-around", "('(?=' at position 0)"),
        (r"(?!admin).*", "look-around", "('(?!' at position 0)"),
        (r".*(?<=\.txt)", "look-around", "('(?<=' at position 2)"),
        (r".*(?<!x)", "look-around", "('(?<!' at position 2)"),
        (r"(a)\1", "a backreference", r"('\\1' at position 3)"),
        (r"(a)(b)(c)(d)(e)(f)(g)(h)(i)(j)\10", "a backreference", r"('\\10' at position 30)"),
        (r"(?P<x>a)(?P=x)", "a backreference", "('(?P=' at position 8)"),
        (r"(?>a+)b", "an atomic group", "('(?>' at position 0)"),
        (r"a++", "a possessive quantifier", "('++' at position 1)"),
        (r"a{2}+", "a possessive quantifier", "('}+' at position 3)"),
        (r"(a)?(?(1)b|c)", "a conditional group", "('(?(' at position 4)"),
        (r"\bword\b", "a word boundary", r"('\\b' at position 0)"),
        (r"[\W\d]", r"\W inside [...]", r"('\\W' at position 1)"),
    ],
)
def test_what_needs_backtracking_is_refused_naming_the_feature(
    pattern: str, feature: str, where: str
) -> None:
    with pytest.raises(ValueError) as info:
        LinearRegex(pattern)
    message = str(info.value)
    assert message.startswith(
        f"regex {pattern!r} uses {feature} {where}, which ipybox's linear-time regex engine"
    )
    assert "does not support; " in message


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("(a", "invalid regex '(a': missing ) at '(a'"),
        (
            "a{1001}",
            "invalid regex 'a{1001}': invalid repetition size at '{1001}' (RE2 repeats at most 1000 times)",
        ),
        ("[z-a]", "invalid regex '[z-a]': invalid character class range at 'z-a'"),
        (r"\N{NO SUCH NAME}", r"regex '\\N{NO SUCH NAME}': unknown Unicode character name 'NO SUCH NAME'"),
    ],
)
def test_an_invalid_regex_names_what_is_wrong(pattern: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        LinearRegex(pattern)
    assert str(info.value) == message


def test_an_invalid_regex_prints_nothing_to_stderr(capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError):
        LinearRegex("(?=a)(")
    with pytest.raises(ValueError):
        LinearRegex("(")
    assert capfd.readouterr().err == ""


def test_a_string_with_lone_surrogates_cannot_be_judged() -> None:
    assert LinearRegex(".*").fullmatch("a\ud800") is None
    assert LinearRegex(".*").fullmatch("a\U0001f600") is True
