"""The tool server from an attacker's side: code in a kernel holds a call token and nothing else.

Each test tries what such code could try (issue 12, classes 6 and 8): use its token on the application's
endpoints, approve its own calls, name a server the host never configured, get a server started before
anyone approved the call, or plant entries in the host's server registry; and what a server's result could
try (issue 30, finding 4): get a script saved under an image's name.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from ipybox import process
from ipybox.approval import Approval, ApprovalClient, ApprovalRequest, Approved, FunctionApprover, Rejected
from ipybox.in_kernel.tool_runner import TOKEN_ENV, ApprovalRejectedError, ToolRunner, ToolRunnerError
from ipybox.mcp_client.registry import ServerRegistry
from ipybox.rules import ToolCall
from ipybox.tool_server.tool_server import ToolServer
from tests.servers import params
from tests.servers.edge_server import DISGUISED_SCRIPT, PNG_BYTES

pytestmark = pytest.mark.integration


def kernel_tokens(server: ToolServer) -> dict[str, str]:
    """What code in a kernel can hold: the token `kernel_env` hands out, and one from `add_caller`."""
    return {"kernel_env": server.kernel_env[TOKEN_ENV], "add_caller": server.add_caller("kernel-1")}


def runner(server: ToolServer, name: str, token: str | None = None) -> ToolRunner:
    return ToolRunner(name, address=server.calls_address, token=token or server.kernel_env[TOKEN_ENV])


async def call(
    server: ToolServer, name: str, tool: str, args: dict[str, Any], token: str | None = None
) -> Any:
    return await asyncio.to_thread(runner(server, name, token).run_sync, tool, args)


def marked(marker: Path) -> dict[str, Any]:
    """The real `everything` server, started through a shell that first creates `marker`."""
    everything = params.everything()
    return {
        "command": "sh",
        "args": ["-c", 'touch "$0" && exec "$@"', str(marker), everything["command"], *everything["args"]],
    }


@pytest.fixture
async def server() -> AsyncIterator[ToolServer]:
    async with ToolServer(approval_required=True, approval_timeout=5) as s:
        yield s


# --- class 8: the kernel's credentials are not the application's ------------------------------------------


@pytest.mark.parametrize("kind", ["kernel_env", "add_caller"])
async def test_a_kernel_token_cannot_reset_the_tool_server_or_open_its_approval_channel(
    server: ToolServer, kind: str
) -> None:
    token = kernel_tokens(server)[kind]
    headers = {"Authorization": f"Bearer {token}"}
    connector = aiohttp.UnixConnector(path=str(server.unix_socket))
    async with aiohttp.ClientSession(connector=connector) as http:
        async with http.put("http://localhost/reset", headers=headers) as response:
            assert response.status in (401, 403)
        ws = None
        try:
            ws = await http.ws_connect("http://localhost/approval", headers=headers)
            # Some servers accept the handshake and close at once: then nothing can be read or decided.
            frame = await asyncio.wait_for(ws.receive(), 5)
            assert frame.type in (
                aiohttp.WSMsgType.CLOSE,
                aiohttp.WSMsgType.CLOSED,
                aiohttp.WSMsgType.CLOSING,
            )
            assert ws.close_code in (4401, 4403)
        except aiohttp.WSServerHandshakeError as e:
            assert e.status in (401, 403)
        finally:
            if ws is not None:
                await ws.close()


async def test_code_with_the_kernel_token_cannot_approve_its_own_calls(
    server: ToolServer, tmp_path: Path
) -> None:
    marker = tmp_path / "started"
    server.servers.register("everything", marked(marker))
    kernel_token = server.kernel_env[TOKEN_ENV]

    async def approve_everything(request: ApprovalRequest) -> None:
        await request.accept()

    # What the kernel would do: connect as the approver with the only token it has, then call.
    rogue = ApprovalClient(approve_everything, address=server.address, token=kernel_token)
    with contextlib.suppress(aiohttp.WSServerHandshakeError):  # refused: then it can only call
        await rogue.connect()
    try:
        with pytest.raises(ApprovalRejectedError):
            await call(server, "everything", "echo", {"message": "self-approved"})
    finally:
        await rogue.disconnect()
    assert not marker.exists()


async def test_an_approval_client_with_the_application_token_decides_the_kernels_calls(
    server: ToolServer, tmp_path: Path
) -> None:
    server.servers.register("everything", params.everything())
    seen: list[ApprovalRequest] = []

    async def decide(request: ApprovalRequest) -> None:
        seen.append(request)
        await (request.accept() if request.tool_args["message"] == "yes" else request.reject())

    async with ApprovalClient(decide, address=server.address, token=server.token):
        assert await call(server, "everything", "echo", {"message": "yes"}) == "Echo: yes"
        with pytest.raises(ApprovalRejectedError):
            await call(server, "everything", "echo", {"message": "no"})
    assert [r.tool_args["message"] for r in seen] == ["yes", "no"]


async def test_the_application_token_is_no_call_token() -> None:
    async with ToolServer(servers={"everything": params.everything()}) as server:  # approves every call
        with pytest.raises(ToolRunnerError, match="rejected this kernel's token"):
            await call(server, "everything", "echo", {"message": "x"}, token=server.token)


async def test_each_kernel_token_names_one_caller_and_dies_when_revoked() -> None:
    seen: list[str] = []

    async def approver(call: ToolCall) -> Approval:
        seen.append(call.caller)
        return Approved()

    async with ToolServer(
        servers={"everything": params.everything()}, approver=FunctionApprover(approver)
    ) as server:
        first, second = server.add_caller("a"), server.add_caller("b")
        assert len({first, second, server.kernel_env[TOKEN_ENV], server.token}) == 4
        for token in (first, second, server.kernel_env[TOKEN_ENV]):
            await call(server, "everything", "echo", {"message": "x"}, token=token)
        assert seen == ["a", "b", ""]
        server.remove_caller(first)
        with pytest.raises(ToolRunnerError, match="rejected this kernel's token"):
            await call(server, "everything", "echo", {"message": "x"}, token=first)


# --- class 6: nothing starts before the host knows the name and the call is approved --------------------


async def test_a_call_for_an_unregistered_name_reaches_no_approver_and_starts_nothing(tmp_path: Path) -> None:
    registry = ServerRegistry(tmp_path / "state" / "ipybox" / "mcp_servers.json")
    root = tmp_path / "mcptools"
    registry.register(root, "known", params.everything())
    asked: list[str] = []

    async def approver(call: ToolCall) -> Approval:
        asked.append(call.server)
        return Approved()

    async def approval_client(request: ApprovalRequest) -> None:
        asked.append(request.server_name)
        await request.accept()

    def lookup(name: str) -> dict[str, Any] | None:
        return registry.servers(root).get(name)

    before = set(process.descendants(os.getpid()))
    # Decided over the approval channel by an application, then by an approver given to the server.
    async with ToolServer(approval_required=True, lookup=lookup) as server:
        async with ApprovalClient(approval_client, address=server.address, token=server.token):
            with pytest.raises(ToolRunnerError, match="no MCP server named 'evil'"):
                await call(server, "evil", "run", {"command": "id"})
        assert server.servers.started("evil") is None
    async with ToolServer(lookup=lookup, approver=FunctionApprover(approver)) as server:
        with pytest.raises(ToolRunnerError, match="no MCP server named 'evil'"):
            await call(server, "evil", "run", {"command": "id"})
        assert server.servers.started("evil") is None
        assert set(process.descendants(os.getpid())) - before == set()
    assert asked == []


@pytest.mark.parametrize("via", ["approver", "approval_client"])
async def test_a_rejected_call_never_starts_its_server(tmp_path: Path, via: str) -> None:
    marker = tmp_path / "started"
    seen: list[dict[str, Any]] = []

    async def reject(call: ToolCall) -> Approval:
        seen.append(dict(call.annotations))
        return Rejected("not today")

    async def reject_client(request: ApprovalRequest) -> None:
        seen.append(request.annotations)
        await request.reject()

    approver = FunctionApprover(reject) if via == "approver" else None
    async with ToolServer(
        servers={"everything": marked(marker)}, approval_required=True, approver=approver
    ) as server:
        if via == "approver":
            with pytest.raises(ApprovalRejectedError):
                await call(server, "everything", "echo", {"message": "x"})
        else:
            async with ApprovalClient(reject_client, address=server.address, token=server.token):
                with pytest.raises(ApprovalRejectedError):
                    await call(server, "everything", "echo", {"message": "x"})
        assert len(seen) == 1
        assert server.servers.started("everything") is None
        assert not marker.exists()


async def test_a_server_named_only_in_the_registry_is_not_started_before_a_decision(tmp_path: Path) -> None:
    # What a kernel that could write the registry would plant: the tool server must ask before it runs it.
    marker = tmp_path / "started"
    registry = ServerRegistry(tmp_path / "state" / "ipybox" / "mcp_servers.json")
    root = tmp_path / "mcptools"
    registry.register(root, "planted", marked(marker))
    asked: list[str] = []

    async def reject(call: ToolCall) -> Approval:
        asked.append(f"{call.server}.{call.tool}")
        return Rejected("unknown to me")

    async with ToolServer(
        lookup=lambda name: registry.servers(root).get(name), approver=FunctionApprover(reject)
    ) as server:
        with pytest.raises(ApprovalRejectedError, match="unknown to me"):
            await call(server, "planted", "echo", {"message": "x"})
        assert server.servers.started("planted") is None
    assert asked == ["planted.echo"]
    assert not marker.exists()


async def test_an_accepted_call_starts_its_server_after_the_decision(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    started_when_asked: list[bool] = []

    async def accept(call: ToolCall) -> Approval:
        started_when_asked.append(marker.exists())
        return Approved()

    async with ToolServer(
        servers={"everything": marked(marker)}, approver=FunctionApprover(accept)
    ) as server:
        assert await call(server, "everything", "echo", {"message": "x"}) == "Echo: x"
        assert marker.exists()
    assert started_when_asked == [False]


async def test_annotations_of_an_earlier_listing_decide_later_calls_without_starting_the_server(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "started"
    asked: list[tuple[dict[str, Any], bool]] = []

    async def approver(call: ToolCall) -> Approval:
        asked.append((dict(call.annotations), tools.servers.started("everything") is not None))
        return Approved() if call.annotations.get("readOnlyHint") else Rejected("not known to be read-only")

    tools = ToolServer(servers={"everything": marked(marker)}, approver=FunctionApprover(approver))
    async with tools as server:
        # The first call: no listing yet, so no annotations (treated as "none declared": rejected here).
        with pytest.raises(ApprovalRejectedError):
            await call(server, "everything", "echo", {"message": "x"})
        assert not marker.exists()
        await server.servers.connection("everything")  # the host lists the tools (as generation does)
        await server.reset()
        assert await call(server, "everything", "echo", {"message": "y"}) == "Echo: y"
    assert asked[0] == ({}, False)
    assert asked[1][0].get("readOnlyHint") is True and asked[1][1] is False


# --- class 6: the registry is host-only state -------------------------------------------------------------


# --- a server's result: content is saved as data, never as a script by another name ----------------------


async def test_a_result_whose_media_type_makes_it_a_script_is_not_saved_as_one(tmp_path: Path) -> None:
    media = tmp_path / "workspace" / "images"
    async with ToolServer(
        servers={"edge": params.edge()}, media_dir=media, approval_required=False
    ) as server:
        value = await call(server, "edge", "disguised", {})
    # The script is kept (nothing is lost), as data: under `.bin`, never an extension its claimed type
    # names (no `.sh` or `.py` file that something may run later).
    files = {path.suffix: path for path in media.iterdir()}
    assert sorted(files) == [".bin", ".png"]
    script, image = files[".bin"], files[".png"]
    assert script.read_bytes() == DISGUISED_SCRIPT and image.read_bytes() == PNG_BYTES
    size = len(DISGUISED_SCRIPT)
    assert value.splitlines() == [
        f"[image saved: {script} (text/x-shellscript, {size} bytes)]",
        f"[image saved: {script} (application/x-python, {size} bytes)]",
        f"[audio saved: {script} (application/x-sh, {size} bytes)]",
        f"[resource memo://run saved: {script} (text/x-python, {size} bytes)]",
        # Its type, spelt in upper case with a parameter, is still an image type.
        f"[image: {image} (IMAGE/PNG; x=y)]",
    ]


def planted(root: Path) -> dict[str, Any]:
    return {str(root.resolve()): {"evil": {"command": "sh", "args": ["-c", "touch /tmp/pwned"]}}}


def test_a_registry_file_that_is_a_symlink_is_not_followed(tmp_path: Path) -> None:
    root = tmp_path / "mcptools"
    state = tmp_path / "state" / "ipybox"
    state.mkdir(parents=True, mode=0o700)
    target = tmp_path / "attacker.json"
    target.write_text(json.dumps(planted(root)))
    (state / "mcp_servers.json").symlink_to(target)
    registry = ServerRegistry(state / "mcp_servers.json")
    assert registry.servers(root) == {}
    with pytest.raises(PermissionError, match="symlink"):
        registry.register(root, "good", {"command": "true"})
    assert json.loads(target.read_text()) == planted(root)


def test_a_registry_directory_that_is_a_symlink_is_not_followed(tmp_path: Path) -> None:
    root = tmp_path / "mcptools"
    elsewhere = tmp_path / "attacker"
    elsewhere.mkdir(mode=0o700)
    (elsewhere / "mcp_servers.json").write_text(json.dumps(planted(root)))
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "ipybox").symlink_to(elsewhere)
    registry = ServerRegistry(tmp_path / "state" / "ipybox" / "mcp_servers.json")
    assert registry.servers(root) == {}
    with pytest.raises(PermissionError, match="symlink"):
        registry.register(root, "good", {"command": "true"})
    assert sorted(p.name for p in elsewhere.iterdir()) == ["mcp_servers.json"]


@pytest.mark.root_only
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand the directory to another user")
def test_a_registry_directory_owned_by_another_user_is_not_trusted(tmp_path: Path) -> None:
    root = tmp_path / "mcptools"
    state = tmp_path / "state" / "ipybox"
    state.mkdir(parents=True, mode=0o700)
    (state / "mcp_servers.json").write_text(json.dumps(planted(root)))
    os.chown(state, 65534, 65534)
    registry = ServerRegistry(state / "mcp_servers.json")
    assert registry.servers(root) == {}
    with pytest.raises(PermissionError, match="owned by"):
        registry.register(root, "good", {"command": "true"})


def test_malformed_registry_entries_are_skipped_and_never_used(tmp_path: Path) -> None:
    root = tmp_path / "mcptools"
    path = tmp_path / "state" / "ipybox" / "mcp_servers.json"
    registry = ServerRegistry(path)
    registry.register(root, "good", {"command": "node", "args": ["server.js"], "env": {"KEY": "${KEY}"}})
    data = json.loads(path.read_text())
    data[str(root.resolve())].update(
        {
            "not_a_dict": "sh -c 'touch /tmp/pwned'",
            "both": {"command": "sh", "url": "http://127.0.0.1:1/mcp"},
            "neither": {"args": ["-c", "id"]},
            "bad_args": {"command": "sh", "args": "-c id"},
            "extra_key": {"command": "sh", "shell": True},
            "bad_url": {"url": "file:///etc/passwd"},
        }
    )
    path.write_text(json.dumps(data))
    assert registry.servers(root) == {
        "good": {"command": "node", "args": ["server.js"], "env": {"KEY": "${KEY}"}}
    }
    path.write_text(json.dumps({str(root.resolve()): ["not", "a", "mapping"]}))
    assert registry.servers(root) == {}


def test_the_registry_is_created_private(tmp_path: Path) -> None:
    path = tmp_path / "state" / "ipybox" / "mcp_servers.json"
    ServerRegistry(path).register(tmp_path / "mcptools", "good", {"command": "true"})
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    for file in path.parent.iterdir():
        assert stat.S_IMODE(file.lstat().st_mode) == 0o600, file.name
