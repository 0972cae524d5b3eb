"""Files in and out of the workspace for MCP clients that don't share its filesystem: `upload_file` and
`download_file` (an agent on another machine, over streamable HTTP).

Contracts:

- Where: a path relative to the workspace (or absolute inside it), never with a `..` part, a hidden name
  (any part starting with `.`: `.env`, `.git`, `.ipybox`, dotfiles), a protected name at any depth
  (`PROTECTED_PARTS`: the sandbox's `DEFAULT_DENY_WRITE` such as `ipybox.toml`, `mcptools`, `venv`,
  `node_modules`, plus `gentools`, `mcpparse` and `__pycache__`, code the host lists, checks or runs:
  save code actions with `save_code_action`) or a control character (`workspace_path`).
- An upload writes only where a sandboxed kernel of the workspace may write (`check_upload`): the view
  its kernels get (`[sandbox]` with what the host executes protected, `ipybox.config.executables`, and the
  state directory hidden), whether kernels run sandboxed or not, and only below an existing top-level
  directory: the top level is fixed for kernels (a name added there is not seen by kernels that run
  now, and a top-level file replaced by rename is no longer the one their sandbox shows). Missing
  directories below it are made.
- A download reads only what such a kernel may read (`check_download`): nothing the view hides
  (`denyRead` included), and one regular file; a directory or a missing file is one error.
- Never through a link: a symlink anywhere on the way, or as the file itself, is refused before the
  call is decided, and the write and read reach the file without following one
  (`ipybox.safefs.open_dir`, `O_NOFOLLOW`), so a link planted between the check and the write is
  refused too. Writes are atomic (`replace_file`: a temporary file renamed over the name, so a reader
  sees the old file or the new one); an existing file is replaced only with `overwrite=true` (a file
  made between that check and the rename is replaced).
- Bounded: at most `max_bytes` (default `MAX_FILE_BYTES`, set by `add_file_tools`) in either direction;
  more is one error and nothing is written or returned.
- Decided like a tool call, before anything is read or written: `approve(ctx, call)` gets the call
  `ipybox.upload_file(path, size, overwrite)` / `ipybox.download_file(path, size)`, the path as checked
  (relative to the workspace, so a rule's `glob` sees no `..`), never the content.
- A download returns `DownloadedFile` as structured content (and, as the spec recommends, the same JSON
  as text): UTF-8 text as it is, anything else as base64, so `upload_file(path, content, encoding)` with
  its fields writes the same bytes back. Text is the one content type every client passes on, and
  structured content is validated against the declared output schema by SDK clients; an embedded blob
  resource would need a URI scheme and is dropped by many clients.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import os
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path, PurePosixPath
from typing import Literal

import mcp_types as types
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import InputRequiredResult
from pydantic import BaseModel, Field

from ipybox.codeact.layout import GENTOOLS, MCPPARSE
from ipybox.config import CONFIG_FILE, ConfigError, load_config
from ipybox.config.executables import protect, workspace_executables
from ipybox.mcp_server.registration import REGISTRATION_SERVER
from ipybox.rules import ToolCall
from ipybox.safefs import LinkInPathError, MiB, open_dir, read_file, replace_file
from ipybox.sandbox.executables import Executed, kernel_writable
from ipybox.sandbox.policy import DEFAULT_DENY_WRITE
from ipybox.sandbox.view import View

MAX_FILE_BYTES = 2 * MiB
"""The largest file `upload_file` writes and `download_file` returns, unless `add_file_tools` is given
another `max_bytes`. Its base64 (2.7 MiB) fits, with the JSON around it, in the 4 MiB request body mcp's
streamable HTTP transport accepts (a larger request is answered 413 before ipybox sees it); a download
lands in a model's context, where megabytes are rarely of use."""

SERVER = REGISTRATION_SERVER
"""The server name approval rules see for these calls (`server = "ipybox"`, as for registrations)."""
UPLOAD_TOOL = "upload_file"
DOWNLOAD_TOOL = "download_file"

PROTECTED_PARTS = frozenset(
    name.casefold() for name in (*DEFAULT_DENY_WRITE, GENTOOLS, MCPPARSE, "__pycache__")
)
"""Names refused at any depth, in any case (a case-insensitive filesystem writes `IPYBOX.TOML` as
`ipybox.toml`); hidden names (a leading `.`) are refused too."""

Approve = Callable[[Context, ToolCall], Awaitable[str | InputRequiredResult | None]]
"""Decides a call by the workspace's rules (asking on `ask`) and records it: `None` to go ahead, else
why not; or, for a 2026-07-28 client asked in band, the `InputRequiredResult` to answer the call with."""


class DownloadedFile(BaseModel):
    """A file of the workspace, as `download_file` returns it."""

    path: str = Field(description="The file, relative to the workspace.")
    size: int = Field(description="Its size in bytes.")
    encoding: Literal["utf-8", "base64"] = Field(
        description="How `content` holds the bytes: the text itself (the file is UTF-8), or base64."
    )
    content: str = Field(description="The file's content; upload_file with this encoding writes it back.")


def workspace_path(path: str, workspace: Path) -> PurePosixPath:
    """`path` (relative to `workspace`, or absolute inside it) as a relative path, if its names are ones
    files may be transferred under (see the module's contracts).

    Raises:
        ToolError: It is empty, outside the workspace, or has a `..` part, a hidden or protected name or a
            control character; the message names it and what to do.
    """
    if not path.strip():
        raise ToolError("path is empty: name a file inside the workspace, such as out/data.csv")
    if any(ord(char) < 0x20 or ord(char) == 0x7F for char in path):
        raise ToolError(f"path {path!r} has a control character: name a file without one")
    given = PurePosixPath(path)
    if given.is_absolute():
        root = PurePosixPath(workspace)
        if not given.is_relative_to(root):
            raise ToolError(
                f"{path} is outside the workspace {workspace}: name a file inside it, relative to it"
            )
        given = given.relative_to(root)
    parts = [part for part in given.parts if part != "."]
    if ".." in parts:
        raise ToolError(f"{path} has a '..' part: name the file inside the workspace without one")
    if not parts:
        raise ToolError(f"{path} is the workspace itself: name a file inside it, such as out/data.csv")
    for part in parts:
        if part.startswith("."):
            raise ToolError(
                f"{path}: {part!r} is a hidden name (it starts with '.'); ipybox transfers no hidden "
                "files or directories (.env, .git, .ipybox, dotfiles)"
            )
        if part.casefold() in PROTECTED_PARTS:
            raise ToolError(
                f"{path}: {part!r} is a name the host or a developer's tools act on ({CONFIG_FILE}, "
                f"mcptools, {GENTOOLS}, {MCPPARSE}, environments such as venv and node_modules); ipybox "
                "transfers no files there (save code actions with save_code_action)"
            )
    return PurePosixPath(*parts)


def check_upload(workspace: Path, relative: PurePosixPath, view: View, *, overwrite: bool) -> bool:
    """Whether an upload to `relative` may go ahead, before it is decided: below an existing top-level
    directory, with no link on the way, where the workspace's kernels may write. `True` when it replaces
    an existing file.

    Raises:
        ToolError: It may not (the message says why and what to do).
    """
    if len(relative.parts) < 2:
        shown = ", ".join(f"{name}/" for name in _top_level_directories(workspace)) or "none yet"
        raise ToolError(
            f"{relative} would be a new name at the workspace's top level, which stays fixed for its "
            f"kernels (they would not see it): upload into one of its directories ({shown}), e.g. "
            f"out/{relative}; a directory added at the top level is seen by kernels started after that"
        )
    found = _walk(workspace, relative)
    top = workspace / relative.parts[0]
    if not top.is_dir():
        raise ToolError(
            f"the workspace has no top-level directory {relative.parts[0]!r}, and uploads make none (its "
            "kernels would not see it): upload into an existing one, or have one added on the host"
        )
    if found is not None:
        if stat.S_ISDIR(found.st_mode):
            raise ToolError(f"{relative} is a directory: name a file in it")
        if not stat.S_ISREG(found.st_mode):
            raise ToolError(f"{relative} is not a regular file, so ipybox does not replace it")
        if not overwrite:
            raise ToolError(f"{relative} exists: pass overwrite=true to replace it")
    if not kernel_writable([Executed(str(workspace / relative), "upload")], view):
        raise ToolError(
            f"{relative} is read-only or hidden to the workspace's kernels (its [sandbox] denyWrite or "
            "denyRead, or code the host runs: `ipybox doctor` lists it), so nothing is uploaded there"
        )
    return found is not None


def check_download(workspace: Path, relative: PurePosixPath, view: View) -> os.stat_result:
    """The `lstat` of the file a download of `relative` reads, before it is decided: one regular file,
    no link on the way, not hidden from the workspace's kernels.

    Raises:
        ToolError: It is missing, a directory, not a regular file, reached through a link, or hidden.
    """
    found = _walk(workspace, relative)
    if found is None:
        raise ToolError(f"{relative}: no such file in the workspace")
    if stat.S_ISDIR(found.st_mode):
        raise ToolError(
            f"{relative} is a directory: download its files one at a time (list them with "
            "execute_ipython_cell)"
        )
    if not stat.S_ISREG(found.st_mode):
        raise ToolError(f"{relative} is not a regular file, so ipybox does not read it")
    readable = View(view.workspace, writable=view.writable, hidden=view.hidden)  # read-only is readable
    if not kernel_writable([Executed(str(workspace / relative), "download")], readable):
        raise ToolError(
            f"{relative} is hidden from the workspace's kernels ([sandbox] denyRead), so it is not read"
        )
    return found


def write_file(workspace: Path, relative: PurePosixPath, data: bytes, *, overwrite: bool) -> None:
    """Write `data` to `relative` atomically, making missing directories below its top-level one, never
    through a link.

    Raises:
        ToolError: A link, a directory or (without `overwrite`) a file is there now.
        OSError: Writing failed (no space, permissions).
    """
    try:
        dir_fd = open_dir(workspace / relative.parent, create_mode=0o777)  # less the umask, as any program
    except OSError as e:
        raise ToolError(f"{relative} was not written: {_reason(e)}") from None
    try:
        try:
            found: os.stat_result | None = os.lstat(relative.name, dir_fd=dir_fd)
        except FileNotFoundError:
            found = None
        if found is not None and stat.S_ISLNK(found.st_mode):
            raise ToolError(f"{relative} is a symlink: ipybox writes through no links; nothing was written")
        if found is not None and not stat.S_ISREG(found.st_mode):
            raise ToolError(f"{relative} is not a regular file; nothing was written")
        if found is not None and not overwrite:
            raise ToolError(f"{relative} exists: pass overwrite=true to replace it")
        replace_file(dir_fd, relative.name, data, mode=0o666)
    finally:
        os.close(dir_fd)


def read_back(workspace: Path, relative: PurePosixPath, max_bytes: int) -> bytes:
    """The content of `relative`, read without following a link, at most `max_bytes`.

    Raises:
        ToolError: It is over `max_bytes` now, or became a link, a directory or a missing file.
    """
    try:
        data = read_file(workspace / relative, max_bytes=max_bytes)
    except OSError as e:
        raise ToolError(f"{relative} was not read: {_reason(e)}") from None
    if len(data) > max_bytes:
        raise ToolError(f"{relative} grew over max_bytes ({max_bytes} bytes) while it was being downloaded")
    return data


def kernels_view(workspace: Path) -> View:
    """What the workspace's sandboxed kernels see, as `ipybox up` starts them: `[sandbox]` with its state
    directory hidden and what the host executes read-only (whether or not kernels run sandboxed now).

    Raises:
        ToolError: `ipybox.toml` does not load.
    """
    try:
        config = load_config(workspace / CONFIG_FILE)
    except ConfigError as e:
        raise ToolError(
            f"{CONFIG_FILE} does not load, so no file is transferred until it is fixed:\n{e}"
        ) from None
    state_dir = config.resolve(config.workspace.state_dir)
    policy = config.sandbox.policy().guarding(workspace, state_dir, cwd=workspace)
    return protect(policy, workspace_executables(config, workspace)).view(workspace, Path.home())


def add_file_tools(
    server: MCPServer, workspace: Path, approve: Approve, *, max_bytes: int = MAX_FILE_BYTES
) -> None:
    """Register `upload_file` and `download_file` on the workspace's MCP server (see the module).

    Args:
        server: The workspace's MCP server.
        workspace: The workspace directory.
        approve: Decides each call by the workspace's rules, before anything is read or written.
        max_bytes: The largest file transferred either way.
    """
    workspace = workspace.resolve()
    bound = max_bytes  # `download_file` has a parameter of that name

    async def decide(ctx: Context, call: ToolCall, done: str) -> InputRequiredResult | None:
        """`None` when the call may go ahead; the question for the client when it is asked in band
        (2026-07-28: its retry runs the checks again, which have no effects, and gets the answer)."""
        try:
            denied = await approve(ctx, call)
        except OSError as e:  # the decision could not be recorded: never act on an unrecorded decision
            raise ToolError(f"the audit log could not be written ({e}); {done}") from None
        if isinstance(denied, InputRequiredResult):
            return denied
        if denied is not None:
            raise ToolError(f"{call.tool} of {call.args['path']} was denied: {denied}. {done}")
        return None

    @server.tool(
        annotations=types.ToolAnnotations(
            read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=False
        )
    )
    async def upload_file(
        path: str,
        content: str,
        ctx: Context,
        encoding: Literal["utf-8", "base64"] = "utf-8",
        overwrite: bool = False,
    ) -> str | InputRequiredResult:
        """Put a file into the workspace (for clients that don't share its filesystem), where kernels can
        then read it. Approved by the workspace's rules like a tool call.

        Args:
            path: Relative to the workspace, inside one of its top-level directories (e.g. "out/data.csv";
                missing directories below it are made). Never a hidden name (".env", dotfiles) or one
                ipybox protects ("ipybox.toml", "mcptools", "gentools", "venv", ...).
            content: The file's content: text, or base64 for binary files.
            encoding: "utf-8" (content is the text) or "base64".
            overwrite: Replace an existing file.

        Returns what was written. A file over the server's bound (2 MiB by default) is refused.
        """
        data = _decode(content, encoding, bound)
        relative = workspace_path(path, workspace)
        view = await asyncio.to_thread(kernels_view, workspace)
        replaces = await asyncio.to_thread(check_upload, workspace, relative, view, overwrite=overwrite)
        annotations = {
            "readOnlyHint": False,
            "destructiveHint": replaces,
            "idempotentHint": True,
            "openWorldHint": False,
        }
        args = {"path": str(relative), "size": len(data), "overwrite": overwrite}
        asked = await decide(ctx, ToolCall(SERVER, UPLOAD_TOOL, args, annotations), "Nothing was written.")
        if asked is not None:
            return asked
        try:
            await asyncio.to_thread(write_file, workspace, relative, data, overwrite=overwrite)
        except OSError as e:
            raise ToolError(f"{relative} was not written: {_reason(e)}") from None
        return f"uploaded {relative} ({len(data)} bytes)"

    @server.tool(annotations=types.ToolAnnotations(read_only_hint=True, open_world_hint=False))
    async def download_file(
        path: str, ctx: Context, max_bytes: int | None = None
    ) -> DownloadedFile | InputRequiredResult:
        """Fetch a file of the workspace (for clients that don't share its filesystem): UTF-8 text as it
        is, other files as base64. Approved by the workspace's rules like a tool call.

        Args:
            path: Relative to the workspace (e.g. "out/report.csv"). Never a hidden name (".env",
                dotfiles) or one ipybox protects ("ipybox.toml", "mcptools", "venv", ...).
            max_bytes: Refuse a file larger than this (default, and at most: the server's bound, 2 MiB
                by default).
        """
        limit = _limit(max_bytes, bound)
        relative = workspace_path(path, workspace)
        view = await asyncio.to_thread(kernels_view, workspace)
        found = await asyncio.to_thread(check_download, workspace, relative, view)
        if found.st_size > limit:
            raise ToolError(
                f"{relative} is {found.st_size} bytes, over max_bytes ({limit}): read the part you need "
                "with execute_ipython_cell, or write a smaller file and download that"
            )
        call = ToolCall(
            SERVER, DOWNLOAD_TOOL, {"path": str(relative), "size": found.st_size}, {"readOnlyHint": True}
        )
        asked = await decide(ctx, call, "Nothing was read.")
        if asked is not None:
            return asked
        data = await asyncio.to_thread(read_back, workspace, relative, limit)
        try:
            return DownloadedFile(path=str(relative), size=len(data), encoding="utf-8", content=data.decode())
        except UnicodeDecodeError:
            encoded = base64.b64encode(data).decode()
            return DownloadedFile(path=str(relative), size=len(data), encoding="base64", content=encoded)


def _decode(content: str, encoding: str, max_bytes: int) -> bytes:
    if encoding == "base64":
        # Line breaks and spaces, as `base64` tools wrap their output, are no part of the data.
        compact = "".join(content.split())
        size = len(compact) * 3 // 4 - (len(compact) - len(compact.rstrip("=")))
        if size > max_bytes:  # refused before it is decoded
            raise ToolError(_too_large(size, max_bytes))
        try:
            data = base64.b64decode(compact, validate=True)
        except (binascii.Error, ValueError) as e:
            raise ToolError(f"content is not valid base64 ({e}): send the bytes base64-encoded") from None
    else:
        try:
            data = content.encode("utf-8")
        except UnicodeEncodeError:
            raise ToolError(
                "content has a lone surrogate, which UTF-8 can't hold: send the bytes as base64"
            ) from None
    if len(data) > max_bytes:
        raise ToolError(_too_large(len(data), max_bytes))
    return data


def _too_large(size: int, max_bytes: int) -> str:
    return (
        f"the file is {size} bytes, over the {max_bytes} bytes the workspace takes in one upload: send a "
        "smaller file (or compress it)"
    )


def _limit(max_bytes: int | None, bound: int) -> int:
    if max_bytes is None:
        return bound
    if isinstance(max_bytes, bool) or not 1 <= max_bytes <= bound:
        raise ToolError(f"max_bytes must be a number of bytes from 1 to {bound}, not {max_bytes!r}")
    return max_bytes


def _walk(workspace: Path, relative: PurePosixPath) -> os.stat_result | None:
    """The `lstat` of `relative`, or `None` when it (or a directory on its way) is missing.

    Raises:
        ToolError: A part on the way is a symlink or not a directory, or the file itself is a symlink.
    """
    path = workspace
    parts = relative.parts
    found: os.stat_result | None = None
    for index, part in enumerate(parts):
        path = path / part
        try:
            found = os.lstat(path)
        except FileNotFoundError:
            return None
        shown = PurePosixPath(*parts[: index + 1])
        if stat.S_ISLNK(found.st_mode):
            raise ToolError(f"{shown} is a symlink: ipybox reads and writes through no links")
        if index < len(parts) - 1 and not stat.S_ISDIR(found.st_mode):
            raise ToolError(f"{shown} is not a directory")
    return found


def _top_level_directories(workspace: Path, limit: int = 8) -> list[str]:
    """Some of the workspace's top-level directories an upload may go into, for the error."""
    try:
        entries = sorted(os.scandir(workspace), key=lambda entry: entry.name)
    except OSError:
        return []
    names = [
        entry.name
        for entry in entries
        if entry.is_dir(follow_symlinks=False)
        and not entry.name.startswith(".")
        and entry.name.casefold() not in PROTECTED_PARTS
    ]
    return names[:limit]


def _reason(error: OSError) -> str:
    # `LinkInPathError` names the link; others say what failed (no space, permissions).
    return str(error) if isinstance(error, LinkInPathError) else error.strerror or str(error)
