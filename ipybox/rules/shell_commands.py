"""Shell command lines split into the commands they run, so that approval rules can decide each one.

A kernel asks before `!cmd`, `x = !cmd`, `!!cmd` or a `%%bash` cell runs (`ipybox.shell` /
`ipybox.shell_magic`, with the command line after IPython's `{var}`/`$var` expansion). A line such as
`ls && rm -rf d` or `echo $(rm -rf d)` runs more than one program, so `split_commands` splits it into
`ShellCommand`s, one per program that may run, and `shell_calls` turns each into the call the rules judge:
`ToolCall(server="shell", tool=<program>, args={"cmd": <text>})`.

What is split off as a command of its own: the parts of lists and pipelines (`;`, `&`, `&&`, `||`, `|`,
`|&`, newlines), of groups and subshells (`{ ...; }`, `( ... )`), the bodies of `if`/`while`/`for`/`case`,
and what runs inside `$( ... )`, backticks, `<( ... )`/`>( ... )` and here-documents' substitutions. Such
a substitution's commands come before the command that uses its output, which is decided with the
substitution in its text: `echo $(rm -rf d)` is `rm -rf d` and `echo $(rm -rf d)`.

A command's `program` is its first word after shell keywords (`!`, `if`, `then`, `do`, `time`, `{`, ...),
the builtins that run the next word (`exec`, `command`, `builtin`) and `NAME=value` assignments;
programs that run others (`sudo`, `env`, `xargs`, `nohup`, `bash -c`, `eval`) stay the program, as a
reviewer writes rules for them. A command of assignments or redirections alone has the program `""`.
Its `text` is the command as the shell reads it, in one normalized spelling for rules to match: words
without the quotes and escapes that only spell them (`r"m" -r'f'` is `rm -rf`), quoted again only where
needed (`shlex.quote`; control and invisible characters as `$'\\n'`), single spaces, redirections glued
to their target (`ls >out 2>&1`), skipped keywords and builtins left out, assignments kept
(`LD_PRELOAD=x ls` is not `ls`). Text from quoted words is shown single-quoted even where the shell
expands it (`"$HOME"` reads `'$HOME'`): `$`, `` ` ``, `*`, `?`, `[`, `{` and `~` in a text may be
expanded when it runs, so an allow rule must not let them through.

The reading follows bash, and POSIX sh (dash, `/bin/sh` on Debian) where they differ: the standard
library's `shlex` (posix, `punctuation_chars`) tokenizes, and the source it reads from (`_Source`)
handles what shlex alone gets wrong about the shell, each of which would let a command past unseen:
a `#` inside a word (`a#; rm x`: shlex took the rest of the line for a comment), line continuations,
comments swallowing the newline that ends a command, `$( )` and backticks inside double quotes,
`$'...'` strings, here-document bodies (skipped, and searched for substitutions unless the delimiter
is quoted), and `$(( ))` arithmetic. When bash and sh would read a line differently it is decided as
both would run it, or refused: `(( ... ))` is decided as nested subshells (sh's reading; bash's
arithmetic runs nothing), and a `$'...'` with `\\'` in it, a here-document inside `(( ))` and `coproc`
are refused. Some readings decide more than runs, never less: `case` patterns are skipped but a
`[[ ... ]]` with parentheses or `((i++))` is decided as commands.

Anything that cannot be read (unbalanced quotes or parentheses, an unfinished here-document, nesting
deeper than `MAX_NESTING`, a line too costly to read) raises `ShellSyntaxError`: the approver refuses
the command, it never lets an unread command run.

Not a sandbox: a program that runs others (`bash -c`, `python -c`, `make`) is one command here, what it
runs is not; programs computed at run time (`$cmd`, `$(which rm)`, `/bin/r?`) are decided under their
unexpanded text. Rules that allow must be written for what they name, and the sandbox is the boundary.
"""

from __future__ import annotations

import logging
import posixpath
import re
import shlex
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Final

from ipybox.errors import IpyboxError
from ipybox.in_kernel.call_protocol import SHELL_KINDS as _CALL_SHELL_KINDS
from ipybox.in_kernel.call_protocol import SHELL_SERVER as _CALL_SHELL_SERVER
from ipybox.rules.calls import ToolCall

_log = logging.getLogger(__name__)

__all__ = [
    "KERNEL_SHELL_SERVER",
    "KERNEL_SHELL_TOOLS",
    "MAX_NESTING",
    "SHELL_SERVER",
    "ShellCommand",
    "ShellSyntaxError",
    "is_shell_question",
    "shell_calls",
    "split_commands",
]

SHELL_SERVER: Final = "shell"
"""The server name rules use for shell commands: `server = "shell"`, `tool` = the program."""

KERNEL_SHELL_SERVER: Final = _CALL_SHELL_SERVER
"""The server name of a kernel's question about a shell command (as in ipybox 0.9.2; the call channel's
`SHELL_SERVER`)."""

KERNEL_SHELL_TOOLS: Final = _CALL_SHELL_KINDS
"""`ipybox.shell`: `!cmd` and its forms; `ipybox.shell_magic`: a script cell magic (`%%bash`, `%%perl`)."""

MAX_NESTING: Final = 40
"""The deepest nesting of substitutions (`$(...)`, backticks) read; deeper is refused."""

# What reading may cost, in characters read (counting re-reads): a line is read once, plus once more for
# each `$((` that is not arithmetic after all, so only hostile nesting comes near this.
_READ_FACTOR: Final = 8
_READ_ALLOWANCE: Final = 1 << 16

_PLACEHOLDER: Final = "\ue000"  # stands in a word for a substitution, which the source has read itself
_PUNCTUATION: Final = "();<>|&\n"
_BLANKS: Final = " \t"  # the shell's blanks; "\r" and "\n" are not
_UNQUOTED: Final = (" ", "a", "c")  # shlex's states outside quotes and escapes

_REDIRECTIONS: Final = frozenset({"<", ">", ">>", "<<", "<<<", "<&", ">&", "&>", "&>>", "<>", ">|"})
# Longest first: an operator run such as `;;&` or `)|` is split greedily.
_OPERATORS: Final = sorted(
    {*_REDIRECTIONS, "&&", "||", "|&", ";;", ";&", ";;&", *"();&|\n"}, key=len, reverse=True
)
_CASE_ENDS: Final = frozenset({";;", ";&", ";;&"})

# Words skipped at the start of a command: reserved words, and builtins that run the next word.
_KEYWORDS: Final = frozenset(
    {"!", "{", "}", "if", "then", "elif", "else", "fi", "while", "until", "do", "done", "esac"}
)
_RUNNERS: Final = frozenset({"time", "exec", "command", "builtin"})
_ASSIGNMENT: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\[[^\]]*\])?\+?=", re.ASCII)
_BARE_WORD: Final = re.compile(r"[\w@%+=:,./*?~$\[\]{}-]+", re.ASCII)

_ANSI_ESCAPE: Final = re.compile(
    r"\\(?:([abeEfnrtv\\\"?])|([0-7]{1,3})|x([0-9a-fA-F]{1,2})|u([0-9a-fA-F]{1,4})|U([0-9a-fA-F]{1,8})|c(.)|(.))",
    re.DOTALL,
)
_ANSI_SIMPLE: Final = {
    "a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
    "\\": "\\", '"': '"', "?": "?",
}  # fmt: skip

# Script cell magics' own options (IPython's `%%script`), which are not the interpreter's.
_SCRIPT_FLAGS: Final = frozenset({"--bg", "--no-raise-error"})
_SCRIPT_OPTIONS: Final = frozenset({"--proc", "--out", "--err"})
_SCRIPT_SHELLS: Final = frozenset({"bash", "sh"})


class ShellSyntaxError(IpyboxError, ValueError):
    """A shell command line that cannot be read into the commands it runs; it must not run."""


@dataclass(frozen=True, slots=True)
class ShellCommand:
    """One command that a shell command line runs.

    Attributes:
        program: The program it runs, as written (`rm`, `/bin/rm`, `$(which rm)`), or `""` when it runs
            none (only assignments or redirections).
        text: The command in normalized spelling (see the module's documentation), what rules' argument
            conditions on `cmd` match.
    """

    program: str
    text: str


def split_commands(line: str) -> list[ShellCommand]:
    """The commands `line` runs, read as bash and sh read it (see the module's documentation).

    Args:
        line: A shell command line or script.

    Returns:
        The commands, in the order they appear, the commands of a substitution before the command
        that contains it. Empty when the line runs nothing (blank, or comments only).

    Raises:
        ShellSyntaxError: The line cannot be read: what is wrong, and what to write instead.

    Example:
        ```python
        assert [c.program for c in split_commands("ls && rm -rf d | tee $(date)")] == ["ls", "date", "rm", "tee"]
        ```
    """
    if _PLACEHOLDER in line:
        raise ShellSyntaxError(
            f"the command contains the character U+{ord(_PLACEHOLDER):04X}, which is not read"
        )
    splitter = _Splitter(len(line))
    try:
        splitter.parse(line, 0, closing=False)
    except ShellSyntaxError:
        raise
    except Exception as e:
        # A line this reader gets wrong is refused like one it can't read, and audited as such by the
        # approver: never a traceback in place of a decision.
        _log.debug("reading a shell command failed", exc_info=True)
        raise ShellSyntaxError(
            f"ipybox's shell reader failed on it ({type(e).__name__}); write it more plainly"
        ) from None
    return splitter.commands


def is_shell_question(call: ToolCall) -> bool:
    """Whether `call` is a kernel's question about a shell command (`ipybox.shell`/`ipybox.shell_magic`)."""
    return call.server == KERNEL_SHELL_SERVER and call.tool in KERNEL_SHELL_TOOLS


def shell_calls(call: ToolCall) -> list[ToolCall]:
    """The calls the rules decide for a kernel's question about a shell command, one per command it runs.

    `ipybox.shell(cmd=...)` and `ipybox.shell_magic(cmd=...)` (a `%%bash`/`%%sh` cell, or a `%%script`
    magic whose interpreter is plain `bash` or `sh`) are split by `split_commands`. Another script magic
    (`magic` is "<name> <line>", e.g. "perl -w" or "script python3") is one command whose program is the
    interpreter: `shell.<interpreter>(cmd=<cell>, magic=<magic>)`. Each call keeps `call.caller`.

    Raises:
        ShellSyntaxError: The question is malformed or its command cannot be read.
    """
    cmd, magic = call.args.get("cmd"), call.args.get("magic")
    if not isinstance(cmd, str) or not isinstance(magic, str | None):
        raise ShellSyntaxError(
            "a shell question needs a string `cmd` (and, for a cell magic, a string `magic`)"
        )
    if call.tool == "shell_magic" and magic is not None:
        argv = _interpreter(magic)
        if posixpath.basename(argv[0]) not in _SCRIPT_SHELLS or len(argv) > 1:
            return [ToolCall(SHELL_SERVER, argv[0], {"cmd": cmd, "magic": magic}, caller=call.caller)]
    return [
        ToolCall(SHELL_SERVER, command.program, {"cmd": command.text}, caller=call.caller)
        for command in split_commands(cmd)
    ]


def _interpreter(magic: str) -> list[str]:
    """The interpreter's command line of a script cell magic ("perl -w", "script --bg python3")."""
    try:
        words = shlex.split(magic)
    except ValueError as e:
        raise ShellSyntaxError(f"the cell magic line {magic!r} cannot be read: {e}") from None
    if words[:1] == ["script"]:
        words = words[1:]
    argv: list[str] = []
    skip = False
    for word in words:  # IPython takes its own options wherever they are (argparse's parse_known_args)
        if skip:
            skip = False
        elif word in _SCRIPT_FLAGS or ("=" in word and word.split("=", 1)[0] in _SCRIPT_OPTIONS):
            continue
        elif word in _SCRIPT_OPTIONS:
            skip = True
        else:
            argv.append(word)
    if not argv:
        raise ShellSyntaxError(f"the cell magic line {magic!r} names no interpreter")
    return argv


# -- reading


@dataclass(frozen=True, slots=True)
class _Substitution:
    """What a placeholder in a word stands for, rendered: `$(ls)`, `<(ls)`, `$((1+2))`."""

    text: str


@dataclass(slots=True)
class _Token:
    value: str
    op: bool
    start: int  # where it is written in the text read
    end: int
    raw: str  # as written: differs from `value` when quoted, escaped or substituted
    subs: tuple[_Substitution, ...] = ()


@dataclass(frozen=True, slots=True)
class _HereDocument:
    delimiter: str
    strip_tabs: bool
    expands: bool  # an unquoted delimiter: the body's substitutions run


class _Splitter:
    """One reading of a command line: the commands found so far, shared by nested readings."""

    def __init__(self, length: int) -> None:
        self.commands: list[ShellCommand] = []
        self.budget = _READ_FACTOR * length + _READ_ALLOWANCE
        self.depth = 0

    def charge(self, characters: int) -> None:
        self.budget -= characters
        if self.budget < 0:
            raise ShellSyntaxError(
                "the command is too costly to read (deeply nested `$((` substitutions); simplify it"
            )

    def parse(self, text: str, start: int, *, closing: bool, arithmetic: bool = False) -> tuple[str, int]:
        """Read `text` from `start`: to its end, or (`closing`) to the `)` that closes a substitution.

        Returns:
            The rendering of what was read, and where it ended (the index of the closing `)`).
        """
        if self.depth >= MAX_NESTING:
            raise ShellSyntaxError(f"substitutions are nested deeper than {MAX_NESTING} levels")
        self.depth += 1
        try:
            return _Parser(self, text, start, closing=closing, arithmetic=arithmetic).run()
        finally:
            self.depth -= 1

    def substitution(self, text: str, paren: int) -> tuple[_Substitution, int]:
        """The `$( ... )` or `$(( ... ))` whose `(` is at `paren`, and the index after it."""
        if text.startswith("(", paren + 1):
            found = len(self.commands)
            try:
                rendered, close = self.parse(text, paren + 2, closing=True, arithmetic=True)
            except _NotArithmetic:
                close = -1
            if close >= 0 and text.startswith(")", close + 1):
                return _Substitution(f"$(({rendered}))"), close + 2
            # `$((a) )` is a command substitution of a subshell (bash reads it so): read it again as one.
            del self.commands[found:]
        rendered, close = self.parse(text, paren + 1, closing=True)
        return _Substitution(f"$({rendered})"), close + 1

    def backticks(self, text: str, tick: int, *, in_double_quotes: bool) -> tuple[_Substitution, int]:
        """The `` `...` `` starting at `tick`, and the index after it."""
        i, n = tick + 1, len(text)
        while i < n and text[i] != "`":
            i += 2 if text[i] == "\\" else 1
        if i >= n:
            raise ShellSyntaxError(
                "a backtick substitution is not closed: add the closing ` (or use $( ... ))"
            )
        # Inside backticks a backslash escapes only $, ` and \ (and " within double quotes).
        escaped = '$`\\"' if in_double_quotes else "$`\\"
        inner = re.sub(
            r"\\(.)", lambda m: m[1] if m[1] in escaped else m[0], text[tick + 1 : i], flags=re.DOTALL
        )
        self.charge(i - tick)
        rendered, _ = self.parse(inner, 0, closing=False)
        return _Substitution(f"$({rendered})"), i + 1

    def here_document(self, text: str, start: int, end: int) -> None:
        """Find the substitutions in the body `text[start:end]` of a here-document whose delimiter is not
        quoted: they run, the rest is data."""
        i = start
        while i < end:
            char = text[i]
            if char == "\\":
                i += 2
                continue
            if char == "$" and text.startswith("(", i + 1):
                _, i = self.substitution(text, i + 1)
            elif char == "`":
                _, i = self.backticks(text, i, in_double_quotes=True)
            else:
                i += 1
                continue
            if i > end:
                raise ShellSyntaxError("a substitution in a here-document runs past the end of its body")


class _Lexer(shlex.shlex):
    """shlex, with the attributes `_Source` reads and sets declared."""

    state: str | None  # " " between tokens, "a" in a word, "c" in an operator, a quote, "\\", None at the end
    posix: bool


class _Source:
    """What shlex reads: the text one character at a time, with what shlex alone gets wrong about the
    shell taken care of, and where each token starts and ends noted for the parser."""

    def __init__(self, splitter: _Splitter, text: str, start: int, *, arithmetic: bool = False) -> None:
        self.splitter = splitter
        self.arithmetic = arithmetic
        self.text = text
        self.pos = start
        lexer = _Lexer(self, posix=True, punctuation_chars=_PUNCTUATION)  # type: ignore[arg-type]
        lexer.whitespace = _BLANKS
        lexer.whitespace_split = True
        lexer.commenters = "#"
        self.lexer = lexer
        self.subs: list[_Substitution] = []
        self.starts: deque[int] = deque()  # where tokens start, in order
        # Where each operator character is, in order: an operator run can span a skipped here-document.
        self.operator_chars: deque[int] = deque()
        self.last = start  # where the last token ended
        self.previous = ("", " ")  # the character read last, and shlex's state when it was read
        self.injected: deque[str] = deque()
        self.newline_read = False
        self.here_documents: list[_HereDocument] = []
        self.restore_posix = False

    def read(self, size: int = 1) -> str:
        lexer = self.lexer
        if self.restore_posix:
            lexer.posix, self.restore_posix = True, False
        if self.injected:
            char = self.injected.popleft()
            self.previous = (char, lexer.state or " ")
            return char
        if self.newline_read:
            self.newline_read = False
            if self.here_documents:
                self._skip_here_documents()
        state = lexer.state or " "
        text, pos = self.text, self.pos
        # A backslash-newline joins lines (outside single quotes), before anything else reads them.
        while text.startswith("\\\n", pos) and state in (*_UNQUOTED, '"'):
            pos += 2
        self.splitter.charge(1)
        if pos >= len(text):
            self.pos = self.last = len(text)
            return ""
        char, after = text[pos], pos + 1
        unquoted = state in _UNQUOTED
        if unquoted or state == '"':
            after_dollar = self.previous[0] == "$" and self.previous[1] in (*_UNQUOTED, '"')
            if char == "(" and after_dollar:
                lexer.token = lexer.token[:-1]  # the `$` is the substitution's
                sub, after = self.splitter.substitution(text, pos)
                char = self._stand_in(sub)
            elif char == "`":
                sub, after = self.splitter.backticks(text, pos, in_double_quotes=state == '"')
                char = self._stand_in(sub)
            elif unquoted and char == "(" and state == "c" and lexer.token[-1:] in ("<", ">"):
                char, after = self._process_substitution(pos)
            elif char == "'" and state == "a" and after_dollar:
                char, after = self._ansi_c_string(pos)
            elif char == '"' and state == "a" and after_dollar:
                lexer.token = lexer.token[:-1]  # `$"..."` is a double-quoted string (translated by bash)
            elif unquoted and char == "\n":
                self.newline_read = True
        self._note_boundaries(char, pos, state)
        self.pos = after
        self.previous = (char, state)
        return char

    def readline(self) -> str:
        """shlex's way to skip a comment, which it takes `#` to start anywhere outside quotes."""
        lexer = self.lexer
        if self.arithmetic and lexer.state != "a":
            raise _NotArithmetic
        if lexer.state == "a":
            # Inside a word `#` is part of it. Keep shlex on the word: it ends a word on a comment only
            # in posix mode (restored at the next read).
            lexer.token += "#"
            lexer.posix, self.restore_posix = False, True
            return ""
        end = self.text.find("\n", self.pos)
        self.pos = len(self.text) if end < 0 else end  # the newline still ends the command
        return ""

    def _note_boundaries(self, char: str, pos: int, state: str) -> None:
        """Note where tokens start and end: at the first character read outside a token, and at the
        character that ends one (which, unless blank, shlex pushes back to start the next)."""
        if char in _PUNCTUATION and state in _UNQUOTED:
            self.operator_chars.append(pos)
        if state == " ":
            if char not in _BLANKS and char != "#":
                self.starts.append(pos)
        elif state == "a":
            if char in _PUNCTUATION or char in _BLANKS:
                self.last = pos
                if char in _PUNCTUATION:
                    self.starts.append(pos)
        elif state == "c" and char not in _PUNCTUATION:
            self.last = pos
            if char not in _BLANKS and char != "#":
                self.starts.append(pos)

    def _stand_in(self, sub: _Substitution) -> str:
        self.subs.append(sub)
        return _PLACEHOLDER

    def _process_substitution(self, paren: int) -> tuple[str, int]:
        lexer = self.lexer
        direction = lexer.token[-1]
        lexer.token = lexer.token[:-1]
        self.operator_chars.pop()
        if not lexer.token:
            self.starts.pop()  # the operator is gone: shlex returns an empty token, which is skipped
        rendered, close = self.splitter.parse(self.text, paren + 1, closing=True)
        return self._stand_in(_Substitution(f"{direction}({rendered})")), close + 1

    def _ansi_c_string(self, quote: int) -> tuple[str, int]:
        """`$'...'` (bash's escapes; sh reads `$` and a single-quoted string): decoded, and given to shlex
        as escaped characters."""
        text, i = self.text, quote + 1
        while i < len(text) and text[i] != "'":
            if text.startswith("\\'", i):
                raise ShellSyntaxError(
                    "a $'...' string with \\' in it is read differently by bash and sh; "
                    'write the quote in double quotes instead ("\'")'
                )
            i += 2 if text[i] == "\\" else 1
        if i >= len(text):
            raise ShellSyntaxError("a $'...' string is not closed: add the closing '")
        self.lexer.token = self.lexer.token[:-1]
        value = _ANSI_ESCAPE.sub(_ansi_c_char, text[quote + 1 : i]).split("\0", 1)[0]
        chars = [c for char in value for c in ("\\", char)] or ["'", "'"]
        self.injected.extend(chars[1:])
        return chars[0], i + 1

    def _skip_here_documents(self) -> None:
        """Skip the bodies of the here-documents started on the line that just ended."""
        text, pos = self.text, self.pos
        for document in self.here_documents:
            line_start = pos
            while True:
                if line_start >= len(text):
                    raise ShellSyntaxError(
                        f"a here-document has no line {document.delimiter!r} to end it: add it (or use a file)"
                    )
                newline = text.find("\n", line_start)
                line_end = len(text) if newline < 0 else newline
                line = text[line_start:line_end]
                if (line.lstrip("\t") if document.strip_tabs else line) == document.delimiter:
                    break
                line_start = line_end + 1
            self.splitter.charge(line_end - pos)
            if document.expands:
                self.splitter.here_document(text, pos, line_start)
            pos = min(line_end + 1, len(text))
        self.here_documents.clear()
        self.pos = pos


def _ansi_c_char(match: re.Match[str]) -> str:
    simple, octal, hex2, hex4, hex8, control, other = match.groups()
    if simple is not None:
        return _ANSI_SIMPLE[simple]
    if control is not None:
        return chr(ord(control.upper()) ^ 0x40) if control != "?" else "\x7f"
    if other is not None:
        return "\\" + other
    digits, base = next((d, b) for d, b in ((octal, 8), (hex2, 16), (hex4, 16), (hex8, 16)) if d is not None)
    code = int(digits, base)
    if octal is not None:
        code &= 0xFF
    if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
        raise ShellSyntaxError(f"a $'...' string has an invalid character escape {match[0]!r}")
    return chr(code)


class _NotArithmetic(Exception):
    """A `$((` whose contents hold a comment: not arithmetic (bash refuses it), read as a command."""


class _Parser:
    """Commands from the tokens of one reading (the whole line, or one substitution's contents)."""

    def __init__(
        self, splitter: _Splitter, text: str, start: int, *, closing: bool, arithmetic: bool
    ) -> None:
        self.splitter = splitter
        self.source = _Source(splitter, text, start, arithmetic=arithmetic)
        self.closing = closing
        self.arithmetic = arithmetic
        self.tokens: list[_Token] = []  # everything read, for the rendering of a substitution
        self.command: list[_Token] = []  # the words and redirections of the command being read
        self.runner: str | None = None  # after `time`/`exec`/`command`/`builtin`: their options come next
        self.skip_words = 0  # words that are no command: `function`'s name, `exec -a`'s name
        self.header = False  # inside `for ...`/`select ...` up to `;`, a newline or `do`

    def finish(self) -> None:
        if self.command:
            self.splitter.commands.append(_command(self.command))
        self.command, self.runner, self.skip_words, self.header = [], None, 0, False

    def run(self) -> tuple[str, int]:
        groups: list[bool] = []  # open `(`s: whether each is the second of a `((`
        function_name: list[_Token] | None = None  # words before a `(`: a function's name if `)` follows
        cases: list[str] = []  # per open `case`: "subject", "in", "pattern" or "body"
        array = False  # inside `name=( ... )`
        target: _Token | None = None  # a redirection whose target comes next
        previous: _Token | None = None
        for token in self._read():
            self.tokens.append(token)
            op = token.value if token.op else None
            if self.arithmetic:
                if op == "(":
                    groups.append(False)
                elif op == ")":
                    if not groups:
                        return self._rendered(closing=True), token.start
                    groups.pop()
                previous = token
                continue
            if function_name is not None:
                if op == ")" and previous is not None and previous.value == "(":
                    groups.pop()  # `name()`: a function definition, which runs nothing yet
                    function_name = None
                    previous = token
                    continue
                self.splitter.commands.append(_command(function_name))  # not a function: decide it
                function_name = None
            frame = cases[-1] if cases else None
            if target is not None:
                if op is not None:
                    raise ShellSyntaxError(f"the redirection {target.value!r} has no target before {op!r}")
                self.command.append(token)
                if target.value == "<<":
                    self._here_document(token, target, groups)
                target = None
            elif frame in ("subject", "in", "pattern"):
                state = _case(token, frame)
                if state is None:
                    cases.pop()
                else:
                    cases[-1] = state
            elif array:
                self.command.append(token)
                if op == ")":
                    array = False
                elif op not in (None, "\n"):
                    raise ShellSyntaxError(f"unexpected {op!r} in an array assignment")
            elif op is None:
                self._word(token, cases)
            elif op in _REDIRECTIONS:
                self.command.append(token)
                target = token
            elif op == "(":
                glued = previous is not None and previous.end == token.start
                if glued and previous is not None and not previous.op and _ASSIGNMENT.fullmatch(previous.raw):
                    self.command.append(token)  # `name=( ... )`: words, no commands
                    array = True
                else:
                    if self.command:
                        function_name, self.command = self.command, []
                    self.finish()
                    groups.append(glued and previous is not None and previous.value == "(" and previous.op)
            elif op == ")":
                self.finish()
                if not groups:
                    if self.closing:
                        return self._rendered(closing=True), token.start
                    raise ShellSyntaxError("a ')' closes nothing: remove it or quote it")
                groups.pop()
            elif op in _CASE_ENDS and frame == "body":
                self.finish()
                cases[-1] = "pattern"
            else:  # ; & && || | |& ;; and newlines
                self.finish()
            previous = token
        if function_name is not None:
            self.splitter.commands.append(_command(function_name))
        if target is not None:
            raise ShellSyntaxError(f"the redirection {target.value!r} has no target")
        self.finish()
        if self.closing:
            raise ShellSyntaxError("a $( ... ) or <( ... ) is not closed: add the closing )")
        if groups:
            raise ShellSyntaxError("a '(' is not closed: add the closing ) or quote it")
        if cases:
            raise ShellSyntaxError("a case statement is not closed: add esac")
        return self._rendered(), len(self.source.text)

    def _word(self, token: _Token, cases: list[str]) -> None:
        """A word of a command, or a keyword or builtin before it."""
        keyword = token.value if token.raw == token.value else None  # quoted or escaped: no keyword
        if self.header:
            if keyword == "do":  # `for x do ...`: a command follows
                self.header = False
            return
        if self.skip_words:
            self.skip_words -= 1
            return
        if self.runner is not None and keyword is not None and keyword.startswith("-"):
            if keyword == "--":
                self.runner = None
            elif self.runner == "exec" and "a" in keyword[1:]:
                self.skip_words = 1  # `exec -a NAME`
            return
        self.runner = None
        if self.command or keyword is None:
            self.command.append(token)
        elif keyword in _KEYWORDS:
            if keyword == "esac" and cases and cases[-1] == "body":
                cases.pop()
        elif keyword in _RUNNERS:
            self.runner = keyword
        elif keyword == "case":
            cases.append("subject")
        elif keyword in ("for", "select"):
            self.header = True
        elif keyword == "function":
            self.skip_words = 1
        elif keyword == "coproc":
            raise ShellSyntaxError("coproc is not supported: run the command in the background with &")
        else:
            self.command.append(token)

    def _read(self) -> Iterator[_Token]:
        """The tokens, operator runs split into operators."""
        source, lexer, text = self.source, self.source.lexer, self.source.text
        used = 0
        while True:
            try:
                value = lexer.read_token()
            except ShellSyntaxError:
                raise
            except ValueError as e:  # shlex: "No closing quotation", "No escaped character"
                what = "a quote is not closed" if "quotation" in str(e) else "the line ends in a backslash"
                raise ShellSyntaxError(f"{what}: the command cannot be read") from None
            if value is None:
                if lexer.state is None:
                    return
                continue  # an operator that a process substitution took whole
            start, end = source.starts.popleft(), source.last
            # A word never starts with an unquoted operator character (a process substitution's placeholder
            # stands where its `(` was, but is no operator character).
            if text[start] in _PUNCTUATION and all(char in _PUNCTUATION for char in value):
                positions = [source.operator_chars.popleft() for _ in value]
                i = 0
                for op in _split_operators(value):
                    yield _Token(op, True, positions[i], positions[i + len(op) - 1] + 1, op)
                    i += len(op)
                continue
            count = value.count(_PLACEHOLDER)
            subs = tuple(source.subs[used : used + count])
            used += count
            yield _Token(value, False, start, end, text[start:end], subs)

    def _here_document(self, delimiter: _Token, operator: _Token, groups: list[bool]) -> None:
        if any(groups):
            raise ShellSyntaxError("a here-document inside (( )) is read differently by bash and sh")
        word, strip_tabs = delimiter.value, False
        if operator.end == delimiter.start and delimiter.raw.startswith("-"):  # `<<-EOF`: tabs are stripped
            word, strip_tabs = word[1:], True
        if not word:
            raise ShellSyntaxError("a here-document needs a delimiter word after <<")
        expands = not any(char in delimiter.raw for char in "'\"\\")
        self.source.here_documents.append(_HereDocument(word, strip_tabs, expands))

    def _rendered(self, *, closing: bool = False) -> str:
        return _render(self.tokens[:-1] if closing else self.tokens, separators=True)


def _case(token: _Token, frame: str) -> str | None:
    """The next state of a `case` statement at `token`, outside its commands (`None`: it ended)."""
    op = token.value if token.op else None
    if op == "\n":
        return frame
    if frame == "subject":
        if op is not None:
            raise ShellSyntaxError(f"a case statement needs a word, not {op!r}")
        return "in"
    if frame == "in":
        if token.raw != "in":
            raise ShellSyntaxError(f"a case statement needs `in` after its word, not {token.value!r}")
        return "pattern"
    if op is None:
        return None if token.raw == "esac" else frame
    if op == ")":
        return "body"
    if op in ("(", "|"):
        return frame
    raise ShellSyntaxError(f"unexpected {op!r} in a case pattern")


def _split_operators(run: str) -> Iterator[str]:
    i = 0
    while i < len(run):
        op = next(op for op in _OPERATORS if run.startswith(op, i))
        yield op
        i += len(op)


def _command(tokens: Sequence[_Token]) -> ShellCommand:
    program = ""
    target = array = False
    for token in tokens:
        if token.op:
            target = token.value in _REDIRECTIONS
            array = token.value == "(" or (array and token.value != ")")
        elif target:
            target = False
        elif not array and not _ASSIGNMENT.match(token.raw):
            program = _word(token, for_program=True)
            break
    return ShellCommand(program, _render(tokens, separators=False))


def _render(tokens: Sequence[_Token], *, separators: bool) -> str:
    """Tokens as one line: words quoted as needed, one space between, redirections glued to their target
    (and to an IO number written against them), separators (with `separators`) as `;`, ` && `, ..."""
    out: list[str] = []
    previous: _Token | None = None
    for token in tokens:
        glued = previous is not None and previous.end == token.start
        if not token.op:
            here_document = previous is not None and previous.op and previous.value == "<<"
            text = token.raw if here_document and not token.subs else _word(token, for_program=False)
            space = not (previous is not None and previous.op and previous.value in (*_REDIRECTIONS, "("))
        elif token.value in _REDIRECTIONS:
            text = token.value
            io_number = previous is not None and not previous.op and previous.raw.isdigit()
            space = not (io_number and glued)
        elif token.value == "(":
            text = "("
            space = not (glued and previous is not None and (not previous.op or previous.value == "("))
        elif token.value == ")":
            text, space = ")", False
        elif not separators:
            continue
        elif token.value in ("\n", ";"):
            if not out or out[-1].strip() in (";", "("):
                previous = token
                continue
            text, space = ";", False
        else:
            text, space = token.value, True
        out.append(f" {text}" if space and out else text)
        previous = token
    rendered = "".join(out)
    return rendered[:-1] if rendered.endswith(";") else rendered


def _word(token: _Token, *, for_program: bool) -> str:
    """A word as the text shows it, or as a program's name (unquoted where it has no substitution)."""
    if for_program and not token.subs:
        return token.value
    value, prefix = token.value, ""
    subs = iter(token.subs)
    # `A='x y'`, not `'A=x y'` (which is no assignment): decided on the text as written, then cut from the
    # value as read, where a substitution in a subscript (`a[$(touch x)]=1`, which bash runs) is one
    # placeholder, as everywhere else in the word.
    assignment = None if for_program or not _ASSIGNMENT.match(token.raw) else _ASSIGNMENT.match(value)
    if assignment is not None:
        head, *rest = assignment[0].split(_PLACEHOLDER)
        prefix = head + "".join(next(subs).text + piece for piece in rest)
        value = value[len(assignment[0]) :]
    remaining = tuple(subs)
    pieces = value.split(_PLACEHOLDER)
    out = [prefix, _quote(pieces[0]) if pieces[0] or not (prefix or remaining) else ""]
    for sub, piece in zip(remaining, pieces[1:], strict=True):
        out.append(sub.text)
        if piece:
            out.append(_quote(piece))
    return "".join(out)


def _quote(value: str) -> str:
    """`value` as one shell word, spelled so that a reader errs toward "this may be expanded": bare when it
    has no characters but word characters and the ones the shell may expand (`*`, `$`, `~`, ...), in
    double quotes when it has `$` or `` ` `` and others, else `shlex.quote`d; `$'...'` with escapes when it
    holds characters a reader could not see (control characters, bidirectional overrides)."""
    if _BARE_WORD.fullmatch(value):
        return value
    if not value.isprintable():
        return "$'" + "".join(_escape(char) for char in value) + "'"
    if "$" in value or "`" in value:
        return '"' + re.sub(r'(["\\])', r"\\\1", value) + '"'
    return shlex.quote(value)


def _escape(char: str) -> str:
    if char in "\\'":
        return "\\" + char
    if char.isprintable():
        return char
    named = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x80 else f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"
