from __future__ import annotations

import base64
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
    # A type that is neither image nor audio is saved too, under a neutral extension, never the type's.
    blob = next(line for line in lines if line.startswith("[resource memo://blob saved: "))
    blob_path = Path(blob.removeprefix("[resource memo://blob saved: ").split(" (")[0])
    assert blob.endswith(" (application/pdf, 8 bytes)]")
    assert blob_path.suffix == ".bin" and _read(blob_path) == b"\x00\x01binary"
    assert "[resource link: memo://linked (linked): a linked resource]" in value
    # Same content, same file: nothing accumulates on repeated calls.
    _value(await edge.call_tool("media", {}), tmp_path / "media")
    assert len(_listing(tmp_path / "media")) == 3


def test_content_larger_than_the_limit_is_not_saved_and_the_text_says_so(tmp_path: Path) -> None:
    data = base64.b64encode(PNG_BYTES).decode()
    result = types.CallToolResult(
        content=[
            types.ImageContent(data=data, mime_type="image/png"),
            types.EmbeddedResource(
                resource=types.BlobResourceContents(uri="memo://big", blob=data, mime_type="application/pdf")
            ),
        ]
    )
    value = tool_result_value(
        result,
        server_name="edge",
        tool_name="t",
        has_output_schema=False,
        media_dir=tmp_path / "media",
        max_file_bytes=len(PNG_BYTES) - 1,
    )
    size = len(PNG_BYTES)
    assert value == (
        f"[image not saved (image/png, {size} bytes): it is larger than max_image_bytes ({size - 1} B)]\n"
        f"[resource memo://big not saved (application/pdf, {size} bytes): it is larger than "
        f"max_image_bytes ({size - 1} B)]"
    )
    assert not (tmp_path / "media").exists()


@pytest.mark.integration
async def test_error_results_raise_with_the_servers_message(edge: MCPConnection, tmp_path: Path) -> None:
    with pytest.raises(ToolCallError) as info:
        _value(await edge.call_tool("fail", {"message": "quota exceeded\nretry later"}), tmp_path)
    assert "quota exceeded\nretry later" in info.value.message
    assert "\n" not in str(info.value) and "'t'" in str(info.value)


def test_empty_results(tmp_path: Path) -> None:
    assert _value(types.CallToolResult(content=[]), tmp_path) == ""
    assert _value(types.CallToolResult(content=[], structured_content={"a": 1}), tmp_path) == '{"a": 1}'
