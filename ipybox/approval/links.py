"""Where a path argument of an asked call leads when a symlink is on its way: `→ <target>`, shown next to
the argument wherever a person or an application is asked (`ipybox approve`, the web console,
`ApprovalRequest.links`).

Why: a kernel may make `gentools/notes.md` a link to `../ipybox.toml` and then ask to write
`gentools/notes.md`; the person asked sees a harmless name. The target is resolved here, on the host, when
the ask is opened (never taken from the kernel), and travels with the ask (`AskView.links`,
`CallParams.links`), so every front end shows the same thing.

Contracts:

- Only arguments that look like paths are resolved: a string (or a string in a list) of at most
  `MAX_PATH_CHARS` characters without a control character, whose name says path (`path`, `source`,
  `destination`, `*_path`, `file`, `dir`, ...) or whose value has a `/` or starts with `~` or `.`. A value
  is resolved against `base` (the server's `cwd`, else the workspace), `~` against the home.
- A value is listed only when resolving it changes it (a link on the way, at any component, also when the
  final name does not exist yet): `target` is the resolved absolute path. `flag` says when the target is
  one of the names a sandbox hides or protects at the workspace's top level (`protected`) or lies outside
  the workspace (`outside the workspace`).
- Cheap: a few `lstat`s per such argument, at most `MAX_LINKED_ARGS` arguments; never raises (a path
  that can't be resolved is left out).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict

from ipybox.sandbox.policy import DEFAULT_DENY_WRITE, DOTENV_PATTERN

__all__ = ["MAX_LINKED_ARGS", "MAX_PATH_CHARS", "PathLink", "path_links"]

MAX_PATH_CHARS: Final = 4096
"""Longer strings are not taken for paths (Linux's `PATH_MAX`)."""
MAX_LINKED_ARGS: Final = 64
"""Path-like values resolved per call, at most (a list of thousands of paths costs no more)."""

_PATH_NAME = re.compile(
    r"(?i)(path|paths|file|files|filename|dir|directory|source|destination|target|src|dst)$|_(path|file|dir)s?$"
)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_PROTECTED = (DOTENV_PATTERN, *DEFAULT_DENY_WRITE)


class PathLink(BaseModel):
    """Where a path argument leads (see the module's contracts).

    Attributes:
        target: The resolved absolute path.
        flag: `protected` (a name the sandbox hides or keeps read-only at the workspace's top level),
            `outside the workspace`, or `None`.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    target: str
    flag: Literal["protected", "outside the workspace"] | None = None

    def describe(self) -> str:
        """`→ /ws/ipybox.toml (protected)`."""
        return f"→ {self.target}" + (f" ({self.flag})" if self.flag else "")


def path_links(args: Mapping[str, Any], *, base: Path, workspace: Path) -> dict[str, PathLink]:
    """The path-like arguments of `args` that lead somewhere else through a link, by argument name (`paths[1]`
    for an item of a list)."""
    found: dict[str, PathLink] = {}
    tried = 0
    real_workspace = os.path.realpath(workspace)
    for name, value in args.items():
        items = [(str(name), value)] if isinstance(value, str) else []
        if isinstance(value, list):
            items = [(f"{name}[{i}]", item) for i, item in enumerate(value) if isinstance(item, str)]
        for key, text in items:
            if not _looks_like_path(str(name), text):
                continue
            tried += 1
            if tried > MAX_LINKED_ARGS:
                return found
            link = _resolve(text, base, real_workspace)
            if link is not None:
                found[key] = link
    return found


def _looks_like_path(name: str, value: str) -> bool:
    if not value or len(value) > MAX_PATH_CHARS or _CONTROL.search(value):
        return False
    return bool(_PATH_NAME.search(name)) or "/" in value or value[0] in "~."


def _resolve(value: str, base: Path, real_workspace: str) -> PathLink | None:
    try:
        joined = os.path.join(os.path.realpath(base), os.path.expanduser(value))
        written = os.path.normpath(joined)  # what the text says, `..` taken as written
        target = os.path.realpath(joined)  # where it leads: links followed, `..` after them
    except (OSError, ValueError):
        return None
    if target == written:
        return None  # no link on the way
    inside = target == real_workspace or target.startswith(real_workspace.rstrip("/") + "/")
    if not inside:
        return PathLink(target=target, flag="outside the workspace")
    top = os.path.relpath(target, real_workspace).split(os.sep)[0]
    protected = top != "." and any(fnmatchcase(top, pattern) for pattern in _PROTECTED)
    return PathLink(target=target, flag="protected" if protected else None)
