"""Where the keys of a TOML document are written: `key_positions()` maps key paths to line and column.

Neither `tomllib` nor `tomlkit` tells where a key is, so this scans the source itself, tracking table
headers (`[a.b]`, `[[a.b]]`), dotted keys, inline tables and arrays. It is meant for documents `tomllib`
has accepted and is lenient beyond that: on anything unexpected it finds less, it never fails.

`too_deep()` is for any text, before `tomllib` sees it: `tomllib` parses arrays and inline tables by
recursion (`x = ` + `[` * 100000 raised `RecursionError`, and so did this scanner), and its work on a
dotted key or table header grows with the square of its parts (100,000 parts: minutes and gigabytes).

Example:
    ```python
    positions = key_positions('[servers.fs]\\ncommand = "npx"\\n')
    assert positions[("servers", "fs", "command")] == (2, 1)
    ```
"""

from __future__ import annotations

import bisect
import re
import tomllib

KeyPath = tuple[str | int, ...]
"""Keys from the document's root to a value; array elements are numbered from 0."""

Position = tuple[int, int]
"""1-based line and column."""

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_SCALAR_END = ",]}\n\r#"


def key_positions(source: str) -> dict[KeyPath, Position]:
    """Map each key path of `source` to where it is first written: the key itself, or for an element of
    an array of tables the `[[` of its header, or for an element of an inline array its first character.
    """
    return _Scanner(source).scan()


def table_headers(source: str) -> list[tuple[int, KeyPath]]:
    """Each table header of `source` (`[a.b]`, `[[a.b]]`), in order: its 1-based line and the path of the
    table it opens (an element of an array of tables numbered from 0). Lines inside multi-line strings
    and arrays are never taken for headers."""
    scanner = _Scanner(source)
    scanner.scan()
    return scanner.headers


def too_deep(source: str, limit: int) -> tuple[Position, str] | None:
    """Where `source` first nests deeper than `limit` levels, and how; `None` when it does not.

    Counted are arrays and inline tables opened inside one another (table headers' brackets too, which
    add at most two), and the parts of one dotted key or table header. One pass over any text, without
    recursion: strings and comments are stepped over as TOML reads them, anything else counts as written.
    """
    return _Scanner(source).too_deep(limit)


class _Scanner:
    def __init__(self, text: str) -> None:
        self.text = text
        self.i = 0
        self.positions: dict[KeyPath, Position] = {}
        self.line_starts = [0, *(match.end() for match in re.finditer("\n", text))]
        # Tables of an array of tables seen so far, per array: `[[a]]` ... `[a.b]` means the last `a`.
        self.array_lengths: dict[KeyPath, int] = {}
        self.headers: list[tuple[int, KeyPath]] = []

    def scan(self) -> dict[KeyPath, Position]:
        table: KeyPath = ()
        while True:
            self.skip_blank(newlines=True)
            if self.i >= len(self.text):
                return self.positions
            start = self.i
            if self.peek() == "[":
                line = self.position(self.i)[0]
                table = self.header()
                self.headers.append((line, table))
            else:
                self.key_value(table)
            if self.i == start:
                self.i += 1  # not TOML after all: step over it rather than loop

    def too_deep(self, limit: int) -> tuple[Position, str] | None:
        text, depth, parts, key_start = self.text, 0, 1, -1
        while self.i < len(text):
            i, char = self.i, text[self.i]
            self.i += 1
            if char == "#":
                end = text.find("\n", i)
                self.i = len(text) if end < 0 else end
            elif char in "\"'":
                if key_start < 0:
                    key_start = i
                if text.startswith(char * 3, i):
                    self.i = self.multiline_string_end(i)
                elif char == '"':
                    self.i = self.basic_string_end(i)
                else:
                    end = text.find("'", i + 1)
                    self.i = len(text) if end < 0 else end + 1
            elif char in "[{":
                depth += 1
                if depth > limit:
                    return self.position(i), f"nesting deeper than {limit} levels (arrays and inline tables)"
                parts, key_start = 1, -1
            elif char in "]}":
                depth = max(depth - 1, 0)
                parts, key_start = 1, -1
            elif char == ".":
                parts += 1
                if parts > limit:
                    place = self.position(key_start if key_start >= 0 else i)
                    return place, f"nesting deeper than {limit} levels (a dotted key or table name)"
            elif char in ",=\n":
                parts, key_start = 1, -1
            elif char not in " \t\r" and key_start < 0:
                key_start = i
        return None

    def position(self, index: int) -> Position:
        line = bisect.bisect_right(self.line_starts, index)
        return line, index - self.line_starts[line - 1] + 1

    def peek(self, length: int = 1) -> str:
        return self.text[self.i : self.i + length]

    def record(self, path: KeyPath, index: int) -> None:
        self.positions.setdefault(path, self.position(index))

    def skip_blank(self, newlines: bool) -> None:
        while self.i < len(self.text):
            char = self.text[self.i]
            if char in " \t" or (newlines and char in "\r\n"):
                self.i += 1
            elif char == "#" and newlines:
                end = self.text.find("\n", self.i)
                self.i = len(self.text) if end < 0 else end
            else:
                return

    def key(self) -> list[tuple[str, int]]:
        """A dotted key: each part with the index it starts at."""
        parts: list[tuple[str, int]] = []
        while True:
            self.skip_blank(newlines=False)
            start = self.i
            if self.peek() == '"':
                end = self.basic_string_end(self.i)
                try:
                    name = tomllib.loads(f"k = {self.text[start:end]}")["k"]
                except tomllib.TOMLDecodeError:
                    return parts
                self.i = end
            elif self.peek() == "'":
                end = self.text.find("'", start + 1)
                if end < 0:
                    return parts
                name, self.i = self.text[start + 1 : end], end + 1
            else:
                match = _BARE_KEY.match(self.text, start)
                if match is None:
                    return parts
                name, self.i = match.group(), match.end()
            parts.append((name, start))
            self.skip_blank(newlines=False)
            if self.peek() != ".":
                return parts
            self.i += 1

    def header(self) -> KeyPath:
        start = self.i
        is_array = self.peek(2) == "[["
        self.i += 2 if is_array else 1
        parts = self.key()
        if not parts:
            return ()
        path: list[str | int] = []
        for name, index in parts[:-1]:
            path.append(name)
            self.record(tuple(path), index)
            if tuple(path) in self.array_lengths:
                path.append(self.array_lengths[tuple(path)] - 1)
        name, index = parts[-1]
        path.append(name)
        self.record(tuple(path), index)
        if is_array:
            length = self.array_lengths.get(tuple(path), 0)
            self.array_lengths[tuple(path)] = length + 1
            path.append(length)
            self.record(tuple(path), start)
        self.skip_blank(newlines=False)
        self.i += 2 if is_array else 1
        return tuple(path)

    def key_value(self, table: KeyPath) -> None:
        path = self.dotted_key(table)
        if path is None:
            return
        self.skip_blank(newlines=False)
        if self.peek() == "=":
            self.i += 1
            self.skip_blank(newlines=False)
            self.value(path)

    def dotted_key(self, table: KeyPath) -> KeyPath | None:
        parts = self.key()
        if not parts:
            return None
        path = table
        for name, index in parts:
            path = (*path, name)
            self.record(path, index)
        return path

    def value(self, path: KeyPath) -> None:
        char = self.peek()
        if char == "{":
            self.inline_table(path)
        elif char == "[":
            self.array(path)
        elif self.peek(3) in ('"""', "'''"):
            self.i = self.multiline_string_end(self.i)
        elif char == '"':
            self.i = self.basic_string_end(self.i)
        elif char == "'":
            end = self.text.find("'", self.i + 1)
            self.i = len(self.text) if end < 0 else end + 1
        else:
            while self.i < len(self.text) and self.text[self.i] not in _SCALAR_END:
                self.i += 1

    def inline_table(self, path: KeyPath) -> None:
        self.i += 1
        while self.i < len(self.text):
            self.skip_blank(newlines=True)
            char = self.peek()
            if char == "}":
                self.i += 1
                return
            if char == ",":
                self.i += 1
                continue
            start = self.i
            self.key_value(path)
            if self.i == start:
                self.i += 1

    def array(self, path: KeyPath) -> None:
        self.i += 1
        index = 0
        while self.i < len(self.text):
            self.skip_blank(newlines=True)
            char = self.peek()
            if char == "]":
                self.i += 1
                return
            if char == ",":
                self.i += 1
                index += 1
                continue
            start = self.i
            self.record((*path, index), start)
            self.value((*path, index))
            if self.i == start:
                self.i += 1

    def basic_string_end(self, start: int) -> int:
        """The index after the closing quote of the `"..."` string at `start`."""
        i = start + 1
        while i < len(self.text) and self.text[i] not in '"\n':
            i += 2 if self.text[i] == "\\" else 1
        return min(i + 1, len(self.text))

    def multiline_string_end(self, start: int) -> int:
        """The index after the closing delimiter of the `\"\"\"...\"\"\"` or `'''...'''` string at `start`."""
        delimiter = self.text[start : start + 3]
        i = start + 3
        while i < len(self.text):
            if delimiter == '"""' and self.text[i] == "\\":
                i += 2
            elif self.text.startswith(delimiter, i):
                # Up to two quotes may end the content right before the delimiter: `""""x"""""`.
                while self.text.startswith(delimiter[0], i + 3):
                    i += 1
                return i + 3
            else:
                i += 1
        return len(self.text)
