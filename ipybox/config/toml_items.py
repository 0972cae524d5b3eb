"""`toml_item()`: a value as ipybox writes it into `ipybox.toml` (a server's table, a rule for an
"always" answer), in the style of `ipybox.toml.example`: mappings as inline tables `{ a = 1 }`, and
strings with backslashes (regexes, Windows paths) as literal strings `'...'` when they can be, so they
read as written."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

import tomlkit
from tomlkit.items import Item, Whitespace

NOT_IN_COMMENT: Final = re.compile(r"[\x00-\x08\x0a-\x1f\x7f\x85\u2028\u2029]")
"""What a TOML comment or literal string cannot hold: control characters but tab (line separators would
read as line breaks)."""


def toml_item(value: Any) -> Item:
    """`value` as a tomlkit item, inline tables written `{ a = 1 }` as ipybox.toml.example does, and
    strings with backslashes (regexes) as literal strings when they can be."""
    if isinstance(value, Mapping):
        table = tomlkit.inline_table()
        for key, item in value.items():
            table.append(str(key), toml_item(item))
        if value:
            table.value.body[0][1].trivia.indent = " "
            table.append(None, Whitespace(" "))
        return table
    if isinstance(value, list | tuple):
        array = tomlkit.array()
        for item in value:
            array.append(toml_item(item))
        return array
    if isinstance(value, str) and "\\" in value and "'" not in value and not NOT_IN_COMMENT.search(value):
        return tomlkit.string(value, literal=True)
    scalar: Item = tomlkit.item(value)
    return scalar
