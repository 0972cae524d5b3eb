from __future__ import annotations

from pathlib import Path

import mcp_types as types
import pytest

from ipybox.mcp_client import MCPConnection, ToolCallError, tool_result_value
from tests.servers.edge_server import PNG_BYTES, WAV_BYTES


def _value(result: types.CallToolResult, media_dir: Path, has_output_schema: bool = False) -> object:
    return tool_result_value(
        result, server_name="edge", tool_name="t", has_output_schema=has_output_schema, media_dir=media_dir
    )


def _read(path: str | Path) -> bytes:
    return Path(path).read_bytes()


def _listing(directory: Path) -> list[Path]:
    return list(directory.iterdir())


@pytest.mark.integration
async def test_structured_content_for_tools_with_output_schema(edge: MCPConnection, tmp_path: Path) -> None:
    result = await edge.call_tool("add", {"a": 1, "b": 2})
    assert _value(result, tmp_path, has_output_schema=True) == {"total": 3, "operands": [1, 2]}
    # Without an output schema the text is the value.
    assert isinstance(_value(result, tmp_path), str)


@pytest.mark.integration
async def test_text_content(edge: MCPConnection, tmp_path: Path) -> None:
    assert _value(await edge.call_tool("echo", {"text": "héllo\nworld"}), tmp_path) == "héllo\nworld"


@pytest.mark.integration
async def test_non_text_content_is_never_dropped(edge: MCPConnection, tmp_path: Path) -> None:
    value = _value(await edge.call_tool("media", {}), tmp_path / "media")
    assert isinstance(value, str)
    lines = value.splitlines()
    assert lines[0] == "all media"
    image = next(line for line in lines if line.startswith("[image: "))
    image_path = Path(image.removeprefix("[image: ").split(" (")[0])
    assert image_path.suffix == ".png" and _read(image_path) == PNG_BYTES
    audio = next(line for line in lines if line.startswith("[audio: "))
    assert _read(audio.removeprefix("[audio: ").split(" (")[0]) == WAV_BYTES
    assert "[resource memo://notes]\nnote text" in value
    blob = next(line for line in lines if line.startswith("[resource memo://blob: "))
    assert _read(blob.split(": ", 1)[1].split(" (")[0]) == b"\x00\x01binary"
    assert "[resource link: memo://linked (linked): a linked resource]" in value
    # Same content, same file: nothing accumulates on repeated calls.
    _value(await edge.call_tool("media", {}), tmp_path / "media")
    assert len(_listing(tmp_path / "media")) == 3


@pytest.mark.integration
async def test_error_results_raise_with_the_servers_message(edge: MCPConnection, tmp_path: Path) -> None:
    with pytest.raises(ToolCallError) as info:
        _value(await edge.call_tool("fail", {"message": "quota exceeded\nretry later"}), tmp_path)
    assert "quota exceeded\nretry later" in info.value.message
    assert "\n" not in str(info.value) and "'t'" in str(info.value)


def test_empty_results(tmp_path: Path) -> None:
    assert _value(types.CallToolResult(content=[]), tmp_path) == ""
    assert _value(types.CallToolResult(content=[], structured_content={"a": 1}), tmp_path) == '{"a": 1}'
