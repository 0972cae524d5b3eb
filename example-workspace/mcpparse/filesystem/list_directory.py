"""Output parser for filesystem.list_directory, whose result is one text of `[FILE] name` and `[DIR] name`
lines. With this file, `mcptools/filesystem/list_directory.py` gains `run_parsed()` returning a
`ParseResult` (written for this workspace: ipybox keeps it when it regenerates the package)."""

import json

from pydantic import BaseModel


class ParseResult(BaseModel):
    files: list[str]
    directories: list[str]


def parse(raw: str) -> ParseResult:
    """`raw`: the tool's result as JSON text (the tool declares an output schema: `{"content": "..."}`)."""
    content = json.loads(raw)["content"]
    files, directories = [], []
    for line in content.splitlines():
        kind, _, name = line.partition(" ")
        if kind == "[FILE]":
            files.append(name)
        elif kind == "[DIR]":
            directories.append(name)
    return ParseResult(files=sorted(files), directories=sorted(directories))
