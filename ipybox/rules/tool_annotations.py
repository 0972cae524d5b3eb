"""MCP tool annotations that rules can match, with the defaults the MCP spec gives an undeclared hint.

Annotations are hints a server declares about its own tools, not guarantees: a server can declare
`readOnlyHint = true` on a tool that writes. Rules that allow calls on the strength of an annotation
trust the server; rules that deny or ask on one are safe to write because an undeclared hint takes the
cautious default (a tool that declares nothing counts as destructive, not read-only, not idempotent and
open-world).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any, Final

ANNOTATION_DEFAULTS: Final[Mapping[str, bool]] = MappingProxyType(
    {
        "readOnlyHint": False,
        "destructiveHint": True,
        "idempotentHint": False,
        "openWorldHint": True,
    }
)
"""The boolean MCP tool annotations, each with the value the spec assumes when a tool does not declare it."""


def annotation_value(annotations: Mapping[str, Any], name: str) -> bool:
    """The value of annotation `name` as declared in `annotations`, or its MCP default.

    A value that is not a bool (e.g. `None`, which MCP SDKs use for "not declared") counts as undeclared.
    """
    value = annotations.get(name)
    return value if isinstance(value, bool) else ANNOTATION_DEFAULTS[name]


def check_annotation_names(names: Iterable[str]) -> None:
    """Raise `ValueError` naming the known annotations if any of `names` is not one of them."""
    known = ", ".join(sorted(ANNOTATION_DEFAULTS))
    for name in names:
        if name not in ANNOTATION_DEFAULTS:
            close = difflib.get_close_matches(name, ANNOTATION_DEFAULTS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"unknown annotation {name!r}{hint}; known annotations: {known}")
