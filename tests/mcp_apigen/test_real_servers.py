"""Generated APIs for the real MCP servers (npm server-everything, server-filesystem, server-memory; PyPI
mcp-server-time, mcp-server-git) and our edge server over stdio, streamable HTTP and SSE."""

from __future__ import annotations

import asyncio
import importlib
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from ipybox.in_kernel.tool_runner import ToolRunnerError
from ipybox.mcp_apigen import render_sources
from tests.mcp_apigen.conftest import Generated

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _module(server: str, module: str) -> Any:
    return importlib.import_module(f"mcptools.{server}.{module}")


def test_every_generated_module_imports_and_its_models_are_complete(generated: Generated) -> None:
    count = 0
    for server, modules in generated.modules.items():
        assert modules, f"no tools generated for {server}"
        package = importlib.import_module(f"mcptools.{server}")
        assert sorted(package.__all__) == sorted(modules)
        for name in modules:
            module = _module(server, name)
            assert callable(module.run) and asyncio.iscoroutinefunction(module.arun)
            assert issubclass(module.Params, BaseModel)
            module.Params.model_json_schema()  # fails if a forward reference is unresolved
            if generated.output_schema(server, module.TOOL_NAME) is not None:
                module.Result.model_json_schema()
            else:
                assert not hasattr(module, "Result")
            count += 1
    assert count > 80


def test_generated_code_passes_ruff_check(generated: Generated) -> None:
    result = subprocess.run(
        [
            Path(sys.executable).parent / "ruff",
            "check",
            "--no-cache",
            "--config",
            ROOT / "pyproject.toml",
            ".",
        ],
        cwd=generated.root,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_package_index_lists_every_tool_with_its_description(generated: Generated) -> None:
    index = (generated.root / "everything" / "__init__.py").read_text()
    assert "- get_sum (tool 'get-sum'): " in index
    assert "- echo: Echoes back the input string" in index
    module_doc = _module("everything", "get_sum").__doc__
    assert module_doc.startswith("Returns the sum of two numbers")


def test_generation_is_deterministic(generated: Generated) -> None:
    # The same tool schemas, in any order, give byte-identical files.
    for server in ("everything", "filesystem", "edge"):
        files = {path.name: path.read_text() for path in (generated.root / server).glob("*.py")}
        tools = generated.tools[server]
        assert render_sources(server, tools) == files
        assert render_sources(server, list(reversed(tools))) == files


def _read(path: str | Path) -> bytes:
    return Path(path).read_bytes()


async def _run(server: str, module: str, **arguments: Any) -> Any:
    tool = _module(server, module)
    return await tool.arun(tool.Params(**arguments))


async def _run_sync(server: str, module: str, **arguments: Any) -> Any:
    tool = _module(server, module)
    return await asyncio.to_thread(tool.run, tool.Params(**arguments))


async def test_time_server(generated: Generated) -> None:
    result = await _run("time", "get_current_time", timezone="Europe/Vienna")
    assert type(result).__name__ == "Result" and result.timezone == "Europe/Vienna"
    converted = await _run_sync(
        "time", "convert_time", source_timezone="UTC", time="12:00", target_timezone="UTC"
    )
    assert converted.target.datetime.startswith(converted.source.datetime[:10])


async def test_filesystem_server(generated: Generated) -> None:
    listing = await _run("filesystem", "list_directory", path=str(generated.workdir))
    assert "notes.txt" in listing.content
    text = await _run("filesystem", "read_text_file", path=str(generated.workdir / "notes.txt"), head=1)
    assert text.content.strip() == "hello from the filesystem server"
    await _run("filesystem", "write_file", path=str(generated.workdir / "new.txt"), content="written")
    assert (generated.workdir / "new.txt").read_text() == "written"


async def test_memory_server(generated: Generated) -> None:
    entity = {"name": "ipybox", "entityType": "project", "observations": ["generates tool APIs"]}
    created = await _run("memory", "create_entities", entities=[entity])
    assert created.entities[0].name == "ipybox"
    graph = await _run("memory", "read_graph")
    assert [e.entityType for e in graph.entities] == ["project"]


async def test_git_server(generated: Generated) -> None:
    status = await _run("git", "git_status", repo_path=str(generated.servers["git"]["args"][-1]))
    assert isinstance(status, str) and "main" in status


async def test_everything_server(generated: Generated) -> None:
    assert await _run("everything", "echo", message="hi") == "Echo: hi"
    assert "3" in await _run("everything", "get_sum", a=1, b=2)
    structured = await _run("everything", "get_structured_content", location="New York")
    assert type(structured).__name__ == "Result" and structured.temperature is not None
    image = await _run("everything", "get_tiny_image")
    assert _read(image.split("[image: ")[1].split(" (")[0]).startswith(b"\x89PNG")


@pytest.mark.parametrize("server", ["edge", "edge_http", "edge_sse"])
async def test_edge_server_over_every_transport(generated: Generated, server: str) -> None:
    assert await _run(server, "echo", text="über") == "über"
    total = await _run(server, "add", a=2, b=40)
    assert total.total == 42 and total.operands == [2, 40]
    with pytest.raises(ToolRunnerError, match="out of paper"):
        await _run(server, "fail", message="out of paper")


async def test_edge_kitchen_sink_round_trip(generated: Generated) -> None:
    tool = _module("edge", "kitchen_sink")
    arguments = {
        "name": "abc",
        "color": "red",
        "ratio": 0.5,
        "step": 10,
        "level": 2,
        "kind": "sink",
        "tags": ["x"],
        "pair": ["a", 1],
        "legacy_pair": [True, None],
        "point": {"x": 1.5, "y": 2},
        "shape": {"kind": "square", "side": 3},
        "id": "8c5fa3b6-1f7c-4c8c-9d6c-1c2b3a4d5e6f",
        "merged": {"a": "x", "b": 2},
        "maybe": None,
        "scores": {"a": 1.5},
        "labels": {"main": "m", "other": "o"},
        "when": "2024-05-01T12:00:00Z",
        "day": "2024-05-01",
        "nested": {"inner": {"deep": [{"x": 0, "y": 0}]}},
    }
    params = tool.Params.model_validate(arguments)
    sent = params.model_dump(mode="json", by_alias=True, exclude_unset=True)
    assert sent == arguments
    result = await tool.arun(
        tool.Params.model_validate({k: v for k, v in arguments.items() if k != "legacy_pair"})
    )
    assert result.shape.side == 3 and result.labels.other == "o" and result.count == 10
    for invalid in ({"name": "ABC"}, {"color": "pink"}, {"ratio": 1}, {"step": 7}, {"tags": []}, {"typo": 1}):
        with pytest.raises(ValidationError):
            tool.Params.model_validate({**arguments, **invalid})


async def test_edge_weird_names(generated: Generated) -> None:
    tool = _module("edge", "weird_properties")
    # "first_name" keeps its name, so "first-name" gets another one: no name is also another field's alias.
    params = tool.Params(
        class_="c", first_name_2="f", from_=1, private=True, model_config_="m", json_="j", l_=1
    )
    params = tool.Params.model_validate({**params.model_dump(by_alias=True, exclude_unset=True), "a b": "s"})
    result = await tool.arun(params)
    assert (result.class_, result.first_name_2, result.from_, result.a_b, result.private) == (
        "c",
        "f",
        1,
        "s",
        True,
    )
    sent = params.model_dump(mode="json", by_alias=True, exclude_unset=True)
    assert sent == {"class": "c", "first-name": "f", "from": 1, "_private": True, "model_config": "m",
                    "json": "j", "l": 1, "a b": "s"}  # fmt: skip
    modules = generated.modules["edge"]
    assert {"get_user", "get_user_2", "get_user_3", "class_", "tool_3d_render", "unicode_tool"} <= set(
        modules
    )
    assert _module("edge", "get_user_2").TOOL_NAME == "get-user"
    assert _module("edge", "class_").TOOL_NAME == "class"


async def test_edge_recursive_and_media(generated: Generated) -> None:
    tool = _module("edge", "tree")
    tree = {
        "root": {"name": "a", "children": [{"name": "b", "children": [{"name": "c"}]}]},
        "pair": {"b": {"a": None}},
    }
    result = await tool.arun(tool.Params.model_validate(tree))
    assert result.root.children[0].children[0].name == "c"
    media = await _run("edge", "media")
    assert media.startswith("all media\n[image: ") and "[resource link: memo://linked" in media


async def test_optional_none_is_not_sent_but_required_none_is(generated: Generated) -> None:
    tool = _module("edge", "kitchen_sink")
    params = tool.Params(name="a", color="red", ratio=None, maybe=None)
    assert params.model_dump(mode="json", by_alias=True, exclude_unset=True) == {
        "name": "a",
        "color": "red",
        "maybe": None,
    }
