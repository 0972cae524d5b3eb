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
- Media types in `MEDIA_EXTENSIONS` are saved with the extension listed there; content of any other type
  is saved too, under the neutral extension `.bin`, and referenced as `[WHAT saved: PATH (MIME, N bytes)]`:
  the server names the type, and a file named `.sh` or `.py` in the workspace is one that something may
  run later, so an extension never comes from the type.
- Content larger than `max_file_bytes` (`max_image_bytes` of `CodeExecutor` and ipybox.toml), or that
  can't be saved safely, is not written; its place in the text says so: `[image not saved (MIME, N
  bytes): why]` (`[audio not saved ...]`, `[resource URI not saved ...]`).
- `media_dir` is written through `ipybox.safefs.open_dir`: when a kernel replaced it, or a directory
  above it, by a symlink, nothing is written (the notice names the symlink).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Final

import mcp_types as types

from ipybox.limits import format_bytes
from ipybox.mcp_client.errors import ToolCallError
from ipybox.safefs import DEFAULT_MAX_IMAGE_BYTES, LinkInPathError, open_dir, replace_file

MEDIA_EXTENSIONS: Final = {
    "image/png": ".png",
    "image/jpeg": ".jpg",
    "image/gif": ".gif",
    "image/webp": ".webp",
    "image/svg+xml": ".svg",
    "audio/wav": ".wav",
    "audio/x-wav": ".wav",
    "audio/mpeg": ".mp3",
    "audio/ogg": ".ogg",
    "audio/webm": ".weba",
    "audio/flac": ".flac",
    "audio/mp4": ".m4a",
}
"""The media types saved under their own extension; content of any other type is saved as `.bin`."""

NEUTRAL_EXTENSION: Final = ".bin"


def tool_result_value(
    result: types.CallToolResult,
    *,
    server_name: str,
    tool_name: str,
    has_output_schema: bool,
    media_dir: Path,
    max_file_bytes: int = DEFAULT_MAX_IMAGE_BYTES,
) -> Any:
    """The value to send to the kernel for `result` (see the module docstring for the contract).

    Args:
        result: The tool's result.
        server_name: Server name, for error messages.
        tool_name: Tool name, for error messages.
        has_output_schema: Whether the tool declares an output schema (its generated module then
            validates a dict into `Result`).
        media_dir: Directory for images, audio and binary resources; created when needed.
        max_file_bytes: The largest content saved as a file; larger content is not saved (the text says
            so).

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
    parts = [_render(block, media_dir, max_file_bytes) for block in result.content]
    if not parts and result.structured_content is not None:
        return _json(result.structured_content)
    return "\n".join(parts)


def _texts(content: list[types.ContentBlock]) -> list[str]:
    return [block.text for block in content if isinstance(block, types.TextContent)]


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False)


def _render(block: types.ContentBlock, media_dir: Path, max_file_bytes: int) -> str:
    match block:
        case types.TextContent():
            return block.text
        case types.ImageContent() | types.AudioContent():
            kind = "image" if isinstance(block, types.ImageContent) else "audio"
            return _saved(kind, block.data, block.mime_type, media_dir, max_file_bytes)
        case types.EmbeddedResource(resource=types.TextResourceContents() as resource):
            return f"[resource {resource.uri}]\n{resource.text}"
        case types.EmbeddedResource(resource=types.BlobResourceContents() as resource):
            mime = resource.mime_type or "application/octet-stream"
            return _saved(f"resource {resource.uri}", resource.blob, mime, media_dir, max_file_bytes)
        case types.ResourceLink():
            name = f" ({block.name})" if block.name else ""
            description = f": {block.description}" if block.description else ""
            return f"[resource link: {block.uri}{name}{description}]"
    return f"[unsupported content: {block.model_dump_json(exclude={'data', 'blob'})}]"


def _saved(what: str, data_b64: str, mime_type: str, media_dir: Path, max_file_bytes: int) -> str:
    """`[what: PATH (MIME)]` for media saved in `media_dir`, `[what saved: PATH (MIME, N bytes)]` for other
    content (saved as `.bin`), else `[what not saved (MIME, N bytes): why]`."""
    try:
        data = base64.b64decode(data_b64, validate=True)
    except (binascii.Error, ValueError):
        data = data_b64.encode()
    if len(data) > max_file_bytes:
        why = f"it is larger than max_image_bytes ({format_bytes(max_file_bytes)})"
        return f"[{what} not saved ({mime_type}, {len(data)} bytes): {why}]"
    extension = MEDIA_EXTENSIONS.get(mime_type.split(";")[0].strip().lower())
    name = f"{hashlib.sha256(data).hexdigest()[:32]}{extension or NEUTRAL_EXTENSION}"
    try:
        # Never through a symlink on the way (a kernel may have planted one); named by content, replaced
        # atomically: concurrent calls returning the same content never see a half-written file.
        fd = open_dir(media_dir, create_mode=0o777)
        try:
            replace_file(fd, name, data)
        finally:
            os.close(fd)
    except LinkInPathError as e:
        return f"[{what} not saved ({mime_type}, {len(data)} bytes): {e}]"
    except OSError as e:
        return f"[{what} not saved ({mime_type}, {len(data)} bytes): {media_dir} can't be written: {e}]"
    path = Path(os.path.abspath(media_dir)) / name
    if extension is None:
        return f"[{what} saved: {path} ({mime_type}, {len(data)} bytes)]"
    return f"[{what}: {path} ({mime_type})]"
