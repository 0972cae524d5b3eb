"""The example workspace ships one output parser and one saved code action (README, "Code as tool"): they
stay consistent with the code that reads them (parsing only, no processes)."""

from __future__ import annotations

from pathlib import Path

from ipybox.codeact.actions import read_actions
from ipybox.codeact.layout import gentools_dir
from ipybox.mcp_apigen.parsers import discover_parsers, static_problems

EXAMPLE = Path(__file__).resolve().parents[2] / "example-workspace"
MCPTOOLS = EXAMPLE / "mcptools"


def test_the_example_parser_is_found_for_list_directory_and_passes_the_static_checks() -> None:
    assert discover_parsers(MCPTOOLS, "filesystem") == {"list_directory"}
    assert static_problems(MCPTOOLS, "filesystem", "list_directory") == []


def test_the_example_action_has_a_current_manifest_and_calls_only_read_only_filesystem_tools() -> None:
    listing = read_actions(gentools_dir(MCPTOOLS))
    assert listing.stale == []
    (action,) = listing.actions
    assert (action.category, action.name, action.tool_name) == (
        "files",
        "python_overview",
        "files__python_overview",
    )
    assert action.signature == "run(params: Params) -> Overview"
    assert action.input_schema["properties"]["path"]["default"] == "."
    assert action.calls.tools == ("filesystem.list_directory", "filesystem.read_text_file")
    assert not action.calls.dynamic
