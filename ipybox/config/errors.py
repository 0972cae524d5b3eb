"""`ConfigError`: everything wrong with a workspace's configuration, each problem with where it is."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ipybox.errors import IpyboxError


@dataclass(frozen=True)
class ConfigProblem:
    """One problem in a workspace's configuration.

    Attributes:
        source: Where the offending value comes from: a file (`ipybox.toml`, `.env`) or
            `environment variable IPYBOX_...`.
        line: 1-based line in `source`, when it is a file and the place is known.
        column: 1-based column in that line.
        reason: What is wrong, in one line.
    """

    source: str
    line: int | None
    column: int | None
    reason: str

    def __str__(self) -> str:
        if self.line is None:
            return f"{self.source}: {self.reason}"
        return f"{self.source}:{self.line}:{self.column or 1}: {self.reason}"


class ConfigError(IpyboxError, ValueError):
    """A workspace configuration that can't be used: a missing file, bad TOML, or values that don't fit.

    `str(error)` is one line per problem, `file:line:column: reason`, the first problem first.

    Attributes:
        path: The `ipybox.toml` that was loaded.
        problems: All problems found (at least one).
        line: Line of the first problem (`None` when it has no place in a file).
        column: Column of the first problem.
        reason: The first problem, without its place.

    Example:
        ```python
        try:
            load_config("ipybox.toml")
        except ConfigError as e:
            print(e)  # ipybox.toml:3:1: unknown key 'comand' in [servers.fs] (did you mean 'command'?)
        ```
    """

    def __init__(self, path: Path, problems: Sequence[ConfigProblem]) -> None:
        if not problems:
            raise ValueError("a ConfigError needs at least one problem")
        self.path = path
        self.problems = tuple(problems)
        first = self.problems[0]
        self.line = first.line
        self.column = first.column
        self.reason = first.reason
        super().__init__("\n".join(str(problem) for problem in self.problems))
