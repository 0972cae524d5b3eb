"""The host's side of checking agent-written modules in a fresh kernel (`ipybox.in_kernel.import_check`
runs there): the code to execute, and the report it prints, read as untrusted data.

Whoever owns kernels runs the code (`RunCheck`): `CodeExecutor.save_code_action` in a kernel of its own
gateway or workspace, the workspace's reconciler in a kernel from the warm pool. The kernel is fresh (no
module the agent imported before is cached) and is deleted afterwards.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from ipybox.errors import IpyboxError
from ipybox.in_kernel.import_check import MARKER

RunCheck = Callable[[str], Awaitable[str]]
"""Executes code in a fresh kernel (sandboxed as the workspace's kernels are) and returns its output text
(raising `CodeExecutionError` if the code itself failed)."""


class CheckOutputError(IpyboxError, ValueError):
    """The check printed no report that could be read (the kernel died, or module code interfered)."""


@dataclass(frozen=True)
class CheckProblem:
    """A module that did not import, or does not match its layout, and where.

    Attributes:
        module: The dotted module name.
        path: The file (as the kernel saw it), if known.
        line: 1-based line, if known.
        column: 1-based column, if known.
        message: `ExceptionType: message`, or what does not match the layout.
    """

    module: str
    path: str | None
    line: int | None
    column: int | None
    message: str

    def location(self, relative_to: Path | None = None) -> str:
        """`path:line:col` (as much of it as is known), `path` relative to `relative_to` if under it."""
        path = self.path or self.module
        if relative_to is not None and self.path is not None:
            with contextlib.suppress(ValueError):
                path = str(Path(self.path).relative_to(relative_to))
        parts = [path, *[str(n) for n in (self.line, self.column) if n is not None][: 2 if self.line else 0]]
        return ":".join(parts)

    def describe(self, relative_to: Path | None = None) -> str:
        """`path:line:col: message`."""
        return f"{self.location(relative_to)}: {self.message}"

    def __str__(self) -> str:
        return self.describe()


@dataclass(frozen=True)
class CheckReport:
    """What a check found: problems (none: every module imported) and, when asked, the action's api."""

    problems: tuple[CheckProblem, ...]
    action: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return not self.problems


class _Problem(BaseModel):
    module: str
    path: str | None = None
    line: int | None = None
    column: int | None = None
    message: str


class _Report(BaseModel):
    problems: list[_Problem]
    action: dict[str, Any] | None = None


def check_code(
    modules: Sequence[str],
    *,
    root: Path,
    staged: Mapping[str, Path] | None = None,
    describe: str | None = None,
) -> str:
    """The code a fresh kernel executes to check `modules` (see `ipybox.in_kernel.import_check.main`).

    Everything is passed as one JSON document inside a Python string literal (`repr` of a `str`), so no
    name or path can become code.
    """
    payload = json.dumps(
        {
            "modules": list(modules),
            "staged": {name: str(path) for name, path in (staged or {}).items()},
            "describe": describe,
            "root": str(root),
        }
    )
    return (
        "def _ipybox_check():\n"
        "    import json\n"
        "    from ipybox.in_kernel.import_check import main\n"
        f"    main(**json.loads({payload!r}))\n"
        "_ipybox_check()\n"
        "del _ipybox_check\n"
    )


def parse_check_output(text: str) -> CheckReport:
    """The report in a check's output (its last report line).

    Raises:
        CheckOutputError: There is none, or it is not a report.
    """
    lines = [line for line in text.splitlines() if line.startswith(MARKER)]
    if not lines:
        tail = text.strip()[-500:]
        raise CheckOutputError(f"the check printed no report{': ' + tail if tail else ''}")
    try:
        report = _Report.model_validate_json(lines[-1][len(MARKER) :])
    except ValidationError as e:
        raise CheckOutputError(f"the check's report could not be read: {e}") from None
    problems = tuple(CheckProblem(**p.model_dump()) for p in report.problems)
    return CheckReport(problems, report.action)


async def run_check(
    run: RunCheck,
    modules: Sequence[str],
    *,
    root: Path,
    staged: Mapping[str, Path] | None = None,
    describe: str | None = None,
) -> CheckReport:
    """Check `modules` with `run` (see `check_code`, `parse_check_output`)."""
    output = await run(check_code(modules, root=root, staged=staged, describe=describe))
    return parse_check_output(output)
