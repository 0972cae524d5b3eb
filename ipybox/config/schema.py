"""The JSON Schema of `ipybox.toml`, kept in `schemas/` for editors (regenerate:
`python -m ipybox.config.schema`).

Taplo and Even Better TOML pick it up from a first line `#:schema ./schemas/ipybox.schema.json`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pydantic.alias_generators import to_camel

from ipybox.config.workspace_config import WorkspaceConfig

SCHEMA_FILE = "ipybox.schema.json"

_SECTION = re.compile(r"[A-Z][a-z]+( [a-z]+)*:")
_ENTRY = re.compile(r"    (\w+): (.*)")


def workspace_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of `ipybox.toml`, with keys as they are written in the file."""
    schema: dict[str, Any] = _without_null(WorkspaceConfig.model_json_schema(by_alias=True))
    for table in [schema, *schema.get("$defs", {}).values()]:
        _describe_keys(table)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "ipybox workspace configuration (ipybox.toml)"
    return schema


def _without_null(node: Any) -> Any:
    # TOML has no null: an optional key is one left out, so `null` alternatives and defaults only mislead.
    if isinstance(node, list):
        return [_without_null(item) for item in node]
    if not isinstance(node, dict):
        return node
    result = {key: _without_null(value) for key, value in node.items()}
    if "default" in result and result["default"] is None:
        del result["default"]
    options = result.get("anyOf")
    if isinstance(options, list):
        options = [option for option in options if option != {"type": "null"}]
        if len(options) == 1:
            del result["anyOf"]
            result = {**options[0], **result}
        else:
            result["anyOf"] = options
    return result


def _describe_keys(table: dict[str, Any]) -> None:
    # Editors show a key's description on hover: move each documented attribute of the class docstring
    # to its key, and keep the table's own description to the summary (Python examples don't help there).
    summary, attributes = _split_docstring(table.get("description", ""))
    if summary:
        table["description"] = summary
    else:
        table.pop("description", None)
    properties = table.get("properties", {})
    for name, text in attributes.items():
        for key in (name, to_camel(name)):
            if key in properties:
                properties[key]["description"] = text


def _split_docstring(docstring: str) -> tuple[str, dict[str, str]]:
    """The summary (the text before the first section) and the `Attributes:` entries of a Google-style
    docstring, each as one paragraph."""
    summary: list[str] = []
    attributes: dict[str, list[str]] = {}
    section: str | None = None
    for line in docstring.splitlines():
        if _SECTION.fullmatch(line):
            section = line[:-1]
        elif section is None:
            summary.append(line)
        elif section == "Attributes":
            entry = _ENTRY.fullmatch(line)
            if entry is not None:
                attributes[entry.group(1)] = [entry.group(2)]
            elif line.strip() and attributes:
                attributes[next(reversed(attributes))].append(line.strip())
    text = "\n".join(summary).strip()
    return text, {name: " ".join(lines) for name, lines in attributes.items()}


def render() -> str:
    return json.dumps(workspace_schema(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    target = Path(__file__).resolve().parents[2] / "schemas" / SCHEMA_FILE
    target.write_text(render())
    print(f"wrote {target}")
