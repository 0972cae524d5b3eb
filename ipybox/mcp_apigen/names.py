"""Turning untrusted names (tools, properties, `$defs`) into valid, distinct, deterministic Python
identifiers.

Only ASCII letters, digits and underscores survive, so no identifier can smuggle in syntax, and
Unicode normalization (NFKC) can never make two different names the same identifier.
"""

from __future__ import annotations

import hashlib
import keyword
import re
import unicodedata

import pydantic

_NON_IDENTIFIER = re.compile(r"[^A-Za-z0-9_]")
_MAX_LENGTH = 80

# Names that cannot be model fields: pydantic's own attributes, names the generated code uses in
# annotations (a field named `str` would shadow the type in its class body), and names flake8/ruff
# reject (E741).
_BASE_MODEL_NAMES = frozenset(name for name in dir(pydantic.BaseModel) if not name.startswith("__"))
RESERVED_IN_CLASS_BODY = frozenset(
    {
        "Annotated",
        "Any",
        "BaseModel",
        "ConfigDict",
        "Field",
        "Literal",
        "RootModel",
        "bool",
        "dict",
        "float",
        "int",
        "list",
        "str",
        "tuple",
        "I",
        "O",
        "l",
    }
)


def _ascii(name: str) -> str:
    # Accented letters keep their base letter ("naïve" -> "naive"); anything else becomes "_".
    decomposed = unicodedata.normalize("NFKD", name)
    return _NON_IDENTIFIER.sub("_", "".join(c for c in decomposed if not unicodedata.combining(c)))


def _shorten(name: str, original: str) -> str:
    if len(name) <= _MAX_LENGTH:
        return name
    digest = hashlib.sha256(original.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{name[: _MAX_LENGTH - 9]}_{digest}"


def module_name(tool_name: str) -> str:
    """A lowercase module name for a tool (before resolving collisions)."""
    name = _shorten(_ascii(tool_name).lower(), tool_name)
    if not name or name[0].isdigit() or name[0] == "_":
        name = f"tool_{name.lstrip('_')}" if name.strip("_") else "tool"
    if keyword.iskeyword(name) or keyword.issoftkeyword(name):
        name += "_"
    return name


def sanitized_field_name(property_name: str) -> str:
    """The identifier part of a property's field name, before keywords and collisions are handled."""
    return _ascii(property_name).lstrip("_")


def field_name(property_name: str, taken: set[str]) -> str:
    """A field name for a JSON property, distinct from `taken` (which it is added to).

    Valid, non-reserved identifiers stay as they are; others become the closest valid name (leading
    underscores, which pydantic treats as private, are dropped; keywords and reserved names get a
    trailing underscore).
    """
    name = _shorten(_ascii(property_name), property_name).lstrip("_")
    if not name:
        name = "field"
    if name[0].isdigit():
        name = f"field_{name}"
    if keyword.iskeyword(name) or keyword.issoftkeyword(name) or name in RESERVED_IN_CLASS_BODY:
        name += "_"
    if name in _BASE_MODEL_NAMES or name.startswith("model_"):
        name += "_"
    return unique(name, taken)


def class_name(hint: str, taken: set[str]) -> str:
    """A PascalCase class name from `hint`, distinct from `taken` (which it is added to)."""
    words = [word for word in _ascii(hint).split("_") if word]
    name = "".join(word[0].upper() + word[1:] for word in words)
    name = _shorten(name, hint) or "Model"
    if name[0].isdigit():
        name = f"Model{name}"
    if keyword.iskeyword(name) or name in RESERVED_IN_CLASS_BODY:
        name += "Model"
    return unique(name, taken)


def unique(name: str, taken: set[str]) -> str:
    """`name`, or `name_2`, `name_3`, ... (`Name2` for class-like names): the first not in `taken`."""
    candidate, n = name, 1
    separator = "" if name[:1].isupper() else "_"
    while candidate in taken:
        n += 1
        candidate = f"{name}{separator}{n}"
    taken.add(candidate)
    return candidate


def module_names(tool_names: list[str]) -> dict[str, str]:
    """Distinct module names for all tools of a server, independent of the order they are listed in.

    A tool whose name is already a valid module name keeps it; the others are assigned in sorted
    order of their original names, getting `_2`, `_3`, ... on a collision.
    """
    taken: set[str] = set()
    result: dict[str, str] = {}
    for tool_name in sorted(set(tool_names)):
        if module_name(tool_name) == tool_name:
            result[tool_name] = unique(tool_name, taken)
    for tool_name in sorted(set(tool_names)):
        if tool_name not in result:
            result[tool_name] = unique(module_name(tool_name), taken)
    return result
