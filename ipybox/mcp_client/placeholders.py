"""Noticing that a `${VAR}` placeholder now resolves to another value (a secret changed in `.env`), when
the configuration itself did not change.

A digest is kept instead of the values, so the reconciler holds no secrets of its own.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dotenv import dotenv_values

from ipybox.mcp_client.params import PLACEHOLDER as _PLACEHOLDER


def placeholder_names(value: Any) -> set[str]:
    """The variables `${VAR}` placeholders in `value` (strings, nested in dicts and lists) refer to.

    Example:
        ```python
        assert placeholder_names({"headers": {"Authorization": "Bearer ${TOKEN}"}}) == {"TOKEN"}
        ```
    """
    if isinstance(value, str):
        return set(_PLACEHOLDER.findall(value))
    if isinstance(value, Mapping):
        return set().union(*(placeholder_names(item) for item in value.values()))
    if isinstance(value, list | tuple):
        return set().union(*(placeholder_names(item) for item in value))
    return set()


def placeholder_digest(value: Any, environ: Mapping[str, str], dotenv_path: Path | None) -> str:
    """A digest of what the placeholders in `value` resolve to: from `environ`, else the `.env` file at
    `dotenv_path` (the order `ipybox.mcp_client` resolves them in). Empty when there are none.

    Example:
        ```python
        before = placeholder_digest(params, os.environ, workspace / ".env")
        # ... .env edited ...
        restart = placeholder_digest(params, os.environ, workspace / ".env") != before
        ```
    """
    names = sorted(placeholder_names(value))
    if not names:
        return ""
    dotenv: Mapping[str, str | None] = {}
    if dotenv_path is not None and dotenv_path.is_file():
        try:
            dotenv = dotenv_values(dotenv_path)
        except (OSError, ValueError):  # unreadable, or not UTF-8: starting the server will say so
            dotenv = {}
    digest = hashlib.sha256()
    for name in names:
        resolved = environ[name] if name in environ else dotenv.get(name)
        digest.update(name.encode() + (b"\0\0" if resolved is None else b"\0=" + resolved.encode()) + b"\n")
    return digest.hexdigest()
