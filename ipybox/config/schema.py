"""The JSON Schema of `ipybox.toml` for editors, and where the files ipybox ships for people are installed.

The schemas and `ipybox.toml.example` are package data, in `ipybox/data/` (the repository's `schemas/`
and `ipybox.toml.example` are symlinks to them), so that an installed ipybox has them as files:
`ipybox schema` prints the schema's path for an editor's settings. `ipybox init` writes the `#:schema` line
of a new `ipybox.toml` as `./.ipybox/ipybox.schema.json`, the workspace's own copy (`WORKSPACE_SCHEMA`),
which works when the file is committed and checked out elsewhere (Taplo and Even Better TOML read that
line; Taplo takes a URL, a path relative to the file, or an absolute path); the schema's `$id` is its
published URL (`SCHEMA_ID`). Regenerate the schema with `python -m ipybox.config.schema`
(the sandbox policy's with `python -m ipybox.sandbox.schema`); tests/config/test_schema.py fails while the
packaged copy is stale.

Contract: `packaged_file()` and the paths built on it are files on disk, found with `importlib.resources`
in an editable install and in an installed wheel alike. ipybox installed in a form that has no files
(a zip archive) is an `IpyboxError` naming the remedy, never a path that does not exist.
"""

from __future__ import annotations

import json
import re
from importlib.resources import files
from pathlib import Path
from typing import Any

from pydantic.alias_generators import to_camel

from ipybox.config.workspace_config import WorkspaceConfig
from ipybox.errors import IpyboxError
from ipybox.sandbox.schema import SCHEMA_FILE as SANDBOX_POLICY_SCHEMA_FILE

SCHEMA_FILE = "ipybox.schema.json"
EXAMPLE_FILE = "ipybox.toml.example"
DATA_DIR = "data"
"""The package's directory of files for people (schemas, the example, templates): `ipybox/data/`."""
SCHEMAS_DIR = "schemas"
SCHEMA_ID = "https://raw.githubusercontent.com/gradion-ai/ipybox/main/schemas/ipybox.schema.json"
"""Where the schema is published (its `$id`): the repository's `schemas/` on its main branch."""
EXAMPLE_URL = "https://github.com/gradion-ai/ipybox/blob/main/ipybox.toml.example"
"""Where `ipybox.toml.example` is published (a new `ipybox.toml` names it, not the installed copy's path)."""
WORKSPACE_SCHEMA = ".ipybox/ipybox.schema.json"
"""The workspace's copy of the installed schema, relative to the workspace: what `ipybox init` writes into
the `#:schema` line (as `./.ipybox/ipybox.schema.json`, relative to `ipybox.toml`, as Taplo resolves it),
so that a committed `ipybox.toml` names no path of one machine. `.ipybox/` is never committed; every
workspace start and `ipybox init` (re)write the copy from the installed ipybox
(`ipybox.running.state.prepare_state_dir`)."""

_SECTION = re.compile(r"[A-Z][a-z]+( [a-z]+)*:")
_ENTRY = re.compile(r"    (\w+): (.*)")


def workspace_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of `ipybox.toml`, with keys as they are written in the file."""
    schema: dict[str, Any] = _without_null(WorkspaceConfig.model_json_schema(by_alias=True))
    for table in [schema, *schema.get("$defs", {}).values()]:
        _describe_keys(table)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = SCHEMA_ID
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


def packaged_file(*parts: str) -> Path:
    """The file (or directory) `ipybox/data/<parts>` of the installed package, as an absolute path.

    Raises:
        IpyboxError: ipybox is installed without files on disk (imported from a zip archive), or the
            file is missing from the installation.
    """
    path = _data_path(*parts)
    if not path.exists():
        raise IpyboxError(f"{path} is missing from the installed ipybox: reinstall ipybox")
    return path


def _data_path(*parts: str) -> Path:
    resource = files("ipybox").joinpath(DATA_DIR, *parts)
    # A package imported from files gives a `Path`; a zip archive, a `zipfile.Path` that editors
    # (and `#:schema` lines) can't open.
    if not isinstance(resource, Path):
        raise IpyboxError(
            f"ipybox's data files are inside {resource}, not on disk: install ipybox with pip "
            "(not from a zip archive) to use them"
        )
    return resource.resolve()


def schema_path(*, sandbox_policy: bool = False) -> Path:
    """The installed JSON Schema of `ipybox.toml` (or, with `sandbox_policy`, of sandbox policy files)."""
    return packaged_file(SCHEMAS_DIR, SANDBOX_POLICY_SCHEMA_FILE if sandbox_policy else SCHEMA_FILE)


def example_path() -> Path:
    """The installed `ipybox.toml.example`: every option of `ipybox.toml`, with its default, explained."""
    return packaged_file(EXAMPLE_FILE)


if __name__ == "__main__":
    target = _data_path(SCHEMAS_DIR, SCHEMA_FILE)  # the source tree's copy in an editable install
    target.write_text(render())
    print(f"wrote {target}")
