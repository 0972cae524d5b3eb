"""Turning an MCP `CallToolResult` into the value a generated tool module receives in the kernel.

The wire contract:

- `is_error` results raise [ToolCallError][ipybox.mcp_client.errors.ToolCallError] with the server's
  message.
- A tool with an output schema returns its structured content (a dict, as JSON).
- Otherwise the result is text: the text parts, joined by newlines. Nothing else is dropped: images,
  audio and binary resources are saved as files in `media_dir` (named by content hash) and referenced
  as `[image: PATH (MIME)]`, `[audio: ...]`, `[resource URI: PATH (MIME)]`; embedded text resources are
  included as `[resource URI]` followed by their text; resource links are listed as
  `[resource link: URI (name): description]`. A result with no content is `""`, or the JSON of its
  structured content if it has one.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import mimetypes
import os
import tempfile
from pathlib import Path
from typing import Any

import mcp_types as types

from ipybox.mcp_client.errors import ToolCallError


def tool_result_value(
    result: types.CallToolResult,
    *,
    server_name: str,
    tool_name: str,
    has_output_schema: bool,
    media_dir: Path,
) -> Any:
    """The value to send to the kernel for `result` (see the module docstring for the contract).

    Args:
        result: The tool's result.
        server_name: Server name, for error messages.
        tool_name: Tool name, for error messages.
        has_output_schema: Whether the tool declares an output schema (its generated module then
            validates a dict into `Result`).
        media_dir: Directory for images, audio and binary resources; created when needed.

    Returns:
        The structured content (usually a dict) for tools with an output schema, else a `str`.

    Raises:
        ToolCallError: The result is an error.
    """
    if result.is_error:
        message = "\n".join(_texts(result.content)) or _json(result.structured_content) or ""
        raise ToolCallError(server_name, tool_name, message)
    if has_output_schema and result.structured_content is not None:
        return result.structured_content
    parts = [_render(block, media_dir) for block in result.content]
    if not parts and result.structured_content is not None:
        return _json(result.structured_content)
    return "\n".join(parts)


def _texts(content: list[types.ContentBlock]) -> list[str]:
    return [block.text for block in content if isinstance(block, types.TextContent)]


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False)


def _render(block: types.ContentBlock, media_dir: Path) -> str:
    match block:
        case types.TextContent():
            return block.text
        case types.ImageContent() | types.AudioContent():
            kind = "image" if isinstance(block, types.ImageContent) else "audio"
            path = _save(block.data, block.mime_type, media_dir)
            return f"[{kind}: {path} ({block.mime_type})]"
        case types.EmbeddedResource(resource=types.TextResourceContents() as resource):
            return f"[resource {resource.uri}]\n{resource.text}"
        case types.EmbeddedResource(resource=types.BlobResourceContents() as resource):
            mime = resource.mime_type or "application/octet-stream"
            return f"[resource {resource.uri}: {_save(resource.blob, mime, media_dir)} ({mime})]"
        case types.ResourceLink():
            name = f" ({block.name})" if block.name else ""
            description = f": {block.description}" if block.description else ""
            return f"[resource link: {block.uri}{name}{description}]"
    return f"[unsupported content: {block.model_dump_json(exclude={'data', 'blob'})}]"


def _save(data_b64: str, mime_type: str, media_dir: Path) -> Path:
    try:
        data = base64.b64decode(data_b64, validate=True)
    except (binascii.Error, ValueError):
        data = data_b64.encode()
    extension = mimetypes.guess_extension(mime_type.split(";")[0].strip()) or ".bin"
    media_dir.mkdir(parents=True, exist_ok=True)
    path = (media_dir / f"{hashlib.sha256(data).hexdigest()[:32]}{extension}").absolute()
    if not path.exists():
        # Named by content, written atomically: concurrent calls returning the same file never see it
        # half-written.
        fd, tmp = tempfile.mkstemp(dir=media_dir, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    return path
