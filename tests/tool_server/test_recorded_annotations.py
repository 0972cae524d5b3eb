"""Tool annotations recorded in the host's registry: written beside the server's parameters, read back only
for those parameters and only in their valid shape, and what the approver sees for a call decided before
its server first starts."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from ipybox.approval import Approval, Approved, Approver, FunctionApprover, Rejected
from ipybox.in_kernel.tool_runner import ApprovalRejectedError, ToolRunner
from ipybox.mcp_apigen.sources import generate_mcp_sources, wait_for_stopped_servers
from ipybox.mcp_client.registry import (
    ANNOTATIONS_KEY,
    MAX_ANNOTATIONS,
    MAX_TOOLS,
    MAX_VALUE_CHARS,
    ServerRegistry,
)
from ipybox.rules import ToolCall
from ipybox.tool_server.tool_server import ToolServer
from tests.servers import params

PARAMS = {"command": "node", "args": ["server.js"], "env": {"KEY": "${KEY}"}}
HINTS: dict[str, dict[str, Any]] = {
    "read": {"readOnlyHint": True, "title": "Read"},
    "write": {"destructiveHint": True},
    "plain": {},
}


@pytest.fixture
def registry(tmp_path: Path) -> ServerRegistry:
    return ServerRegistry(tmp_path / "state" / "ipybox" / "mcp_servers.json")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "mcptools"


def raw(registry: ServerRegistry) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(registry.path.read_text())
    return data


def rewrite(registry: ServerRegistry, data: dict[str, Any]) -> None:
    registry.path.write_text(json.dumps(data))


# --- the registry -----------------------------------------------------------------------------------------


def test_annotations_are_recorded_beside_the_parameters_and_read_back_for_them(
    registry: ServerRegistry, root: Path
) -> None:
    registry.register(root, "fs", PARAMS, HINTS)
    data = raw(registry)
    assert data[str(root.resolve())] == {"fs": PARAMS}  # the entry itself is as before
    entry = data[ANNOTATIONS_KEY][str(root.resolve())]["fs"]
    assert set(entry) == {"params_sha256", "tools"} and len(entry["params_sha256"]) == 64
    assert entry["tools"] == HINTS
    assert registry.servers(root) == {"fs": PARAMS}  # the annotations section is no package root
    assert registry.recorded_annotations(root, "fs", PARAMS) == HINTS
    # The same parameters, as a caller may spell them (a tuple, another key order), are the same.
    same = {"env": {"KEY": "${KEY}"}, "args": ("server.js",), "command": "node"}
    assert registry.recorded_annotations(root / ".", "fs", same) == HINTS


def test_recorded_annotations_are_not_used_for_other_parameters(registry: ServerRegistry, root: Path) -> None:
    registry.register(root, "fs", PARAMS, HINTS)
    assert registry.recorded_annotations(root, "fs", {**PARAMS, "args": ["other.js"]}) is None
    assert registry.recorded_annotations(root, "other", PARAMS) is None
    assert registry.recorded_annotations(root.parent / "elsewhere", "fs", PARAMS) is None
    assert registry.recorded_annotations(root, "fs", {"command": object()}) is None  # not JSON: no match


def test_an_entry_written_without_annotations_still_loads_and_has_none(
    registry: ServerRegistry, root: Path
) -> None:
    # What earlier versions wrote: parameters only.
    registry.path.parent.mkdir(parents=True, mode=0o700)
    registry.path.write_text(json.dumps({str(root.resolve()): {"old": PARAMS}}))
    registry.path.chmod(0o600)
    assert registry.servers(root) == {"old": PARAMS}
    assert registry.recorded_annotations(root, "old", PARAMS) is None
    registry.register(root, "new", {"command": "t"}, {"tick": {"readOnlyHint": True}})
    assert registry.servers(root) == {"old": PARAMS, "new": {"command": "t"}}
    assert registry.recorded_annotations(root, "old", PARAMS) is None
    assert registry.recorded_annotations(root, "new", {"command": "t"}) == {"tick": {"readOnlyHint": True}}


def test_registering_without_annotations_or_unregistering_forgets_recorded_ones(
    registry: ServerRegistry, root: Path
) -> None:
    registry.register(root, "fs", PARAMS, HINTS)
    registry.register(root, "fs", PARAMS)
    assert registry.recorded_annotations(root, "fs", PARAMS) is None
    assert ANNOTATIONS_KEY not in raw(registry)  # no empty sections left behind
    registry.register(root, "fs", PARAMS, HINTS)
    registry.unregister(root, "fs")
    assert registry.servers(root) == {} and registry.recorded_annotations(root, "fs", PARAMS) is None
    assert ANNOTATIONS_KEY not in raw(registry)


def test_only_small_str_to_bool_or_str_annotations_are_recorded(registry: ServerRegistry, root: Path) -> None:
    many = {f"hint{i}": True for i in range(MAX_ANNOTATIONS + 10)}
    registry.register(
        root,
        "fs",
        PARAMS,
        {
            "odd": {"readOnlyHint": True, "count": 3, "nested": {"a": 1}, "list": [1], "none": None},
            "str_hint": {"destructiveHint": "false", "title": "Str"},
            "long_title": {"title": "x" * (MAX_VALUE_CHARS + 1), "destructiveHint": False},
            "many": {"title": "Many", **many},
            "x" * 1000: {"readOnlyHint": True},
        },
    )
    recorded = registry.recorded_annotations(root, "fs", PARAMS)
    assert recorded is not None
    assert recorded["odd"] == {"readOnlyHint": True}
    assert recorded["str_hint"] == {"title": "Str"}
    assert recorded["long_title"] == {"destructiveHint": False}
    assert len(recorded["many"]) == MAX_ANNOTATIONS and "title" not in recorded["many"]  # hints kept first
    assert "x" * 1000 not in recorded


def test_a_listing_of_more_tools_than_the_limit_is_recorded_up_to_it(
    registry: ServerRegistry, root: Path
) -> None:
    registry.register(root, "big", PARAMS, {f"t{i}": {"readOnlyHint": True} for i in range(MAX_TOOLS + 5)})
    recorded = registry.recorded_annotations(root, "big", PARAMS)
    assert recorded is not None and len(recorded) == MAX_TOOLS and f"t{MAX_TOOLS}" not in recorded


def _server_entry(data: dict[str, Any], root: Path) -> dict[str, Any]:
    entry: dict[str, Any] = data[ANNOTATIONS_KEY][str(root.resolve())]["fs"]
    return entry


def _set_section(value: Any) -> Any:
    return lambda data, root: data.__setitem__(ANNOTATIONS_KEY, value)


def _set_root(value: Any) -> Any:
    return lambda data, root: data[ANNOTATIONS_KEY].__setitem__(str(root.resolve()), value)


def _set_server(value: Any) -> Any:
    return lambda data, root: data[ANNOTATIONS_KEY][str(root.resolve())].__setitem__("fs", value)


def _set_field(name: str, value: Any) -> Any:
    return lambda data, root: _server_entry(data, root).__setitem__(name, value)


@pytest.mark.parametrize(
    "corrupt",
    [
        _set_section(["not", "a", "mapping"]),
        _set_root("readOnlyHint"),
        _set_server({"readOnlyHint": True}),
        _set_server(True),
        _set_field("params_sha256", 1),
        _set_field("tools", [["read", {"readOnlyHint": True}]]),
        _set_field("tools", {f"t{i}": {"readOnlyHint": True} for i in range(MAX_TOOLS + 1)}),
    ],
    ids=["section", "root", "server-shape", "server-bool", "digest", "tools-list", "too-many-tools"],
)
def test_a_malformed_server_entry_is_ignored_with_a_warning(
    registry: ServerRegistry, root: Path, caplog: pytest.LogCaptureFixture, corrupt: Any
) -> None:
    registry.register(root, "fs", PARAMS, HINTS)
    data = raw(registry)
    corrupt(data, root)
    rewrite(registry, data)
    with caplog.at_level(logging.WARNING, logger="ipybox.mcp_client.registry"):
        assert registry.recorded_annotations(root, "fs", PARAMS) is None
    assert any("annotations" in r.getMessage() for r in caplog.records)
    assert registry.servers(root) == {"fs": PARAMS}  # the server itself is still known


@pytest.mark.parametrize(
    "bad",
    [
        "readOnlyHint",
        ["readOnlyHint"],
        {"readOnlyHint": 1},
        {"readOnlyHint": "false"},
        {"destructiveHint": None},
        {"readOnlyHint": [True]},
        {"readOnlyHint": {"value": True}},
        {"title": "x" * (MAX_VALUE_CHARS + 1), "readOnlyHint": True},
        {f"hint{i}": True for i in range(MAX_ANNOTATIONS + 1)},
        {"": True},
    ],
    ids=[
        "str",
        "list",
        "int",
        "hint-as-str",
        "null",
        "list-value",
        "dict-value",
        "long-title",
        "too-many",
        "empty-name",
    ],
)
def test_a_tools_malformed_annotations_are_ignored_with_a_warning_and_the_others_kept(
    registry: ServerRegistry, root: Path, caplog: pytest.LogCaptureFixture, bad: Any
) -> None:
    registry.register(root, "fs", PARAMS, HINTS)
    data = raw(registry)
    _server_entry(data, root)["tools"]["bad"] = bad
    rewrite(registry, data)
    with caplog.at_level(logging.WARNING, logger="ipybox.mcp_client.registry"):
        assert registry.recorded_annotations(root, "fs", PARAMS) == HINTS
    assert any("'bad'" in r.getMessage() for r in caplog.records)


# --- the tool server: a call decided before its server starts ---------------------------------------------


def marked(marker: Path, server: dict[str, Any] | None = None) -> dict[str, Any]:
    """A real server (`everything` unless given), started through a shell that first creates `marker`."""
    server = params.everything() if server is None else server
    return {
        "command": "sh",
        "args": ["-c", 'touch "$0" && exec "$@"', str(marker), server["command"], *server["args"]],
    }


async def call(server: ToolServer, name: str, tool: str, args: dict[str, Any]) -> Any:
    runner = ToolRunner(name, address=server.calls_address, token=server.call_token)
    return await asyncio.to_thread(runner.run_sync, tool, args)


def read_only(asked: list[tuple[str, dict[str, Any], bool]], marker: Path) -> FunctionApprover:
    """An approver that accepts what is declared read-only, noting what it saw and whether the server ran."""

    async def approver(call: ToolCall) -> Approval:
        asked.append((call.tool, dict(call.annotations), marker.exists()))
        return Approved() if call.annotations.get("readOnlyHint") else Rejected("not declared read-only")

    return FunctionApprover(approver)


def tool_server(
    registry: ServerRegistry, root: Path, approver: Approver, servers: dict[str, Any] | None = None
) -> ToolServer:
    """A tool server wired to the registry as `CodeExecutor` wires it, every call decided by `approver`."""
    return ToolServer(
        servers=registry.servers(root) if servers is None else servers,
        lookup=lambda name: registry.servers(root).get(name),
        annotations_lookup=lambda name, p: registry.recorded_annotations(root, name, p),
        approver=approver,
    )


@pytest.mark.integration
async def test_annotations_recorded_at_generation_decide_the_first_calls_before_the_server_starts(
    tmp_path: Path, registry: ServerRegistry, root: Path
) -> None:
    marker = tmp_path / "started"
    await generate_mcp_sources("everything", marked(marker), root, registry=registry)
    await wait_for_stopped_servers()
    marker.unlink()  # generation ran the server; from here on, the marker says whether a call started it
    asked: list[tuple[str, dict[str, Any], bool]] = []
    async with tool_server(registry, root, read_only(asked, marker)) as server:
        with pytest.raises(ApprovalRejectedError, match="not declared read-only"):
            await call(server, "everything", "toggle-simulated-logging", {})
        assert not marker.exists()
        assert await call(server, "everything", "echo", {"message": "x"}) == "Echo: x"
        assert marker.exists()
    assert [(tool, hints.get("readOnlyHint"), ran) for tool, hints, ran in asked] == [
        ("toggle-simulated-logging", False, False),
        ("echo", True, False),
    ]


@pytest.mark.integration
async def test_a_server_found_in_the_registry_only_later_gets_its_recorded_annotations(
    tmp_path: Path, registry: ServerRegistry, root: Path
) -> None:
    marker = tmp_path / "started"
    asked: list[tuple[str, dict[str, Any], bool]] = []
    # Started before the sources are generated.
    async with tool_server(registry, root, read_only(asked, marker)) as server:
        await generate_mcp_sources("everything", marked(marker), root, registry=registry)
        await wait_for_stopped_servers()
        marker.unlink()
        assert await call(server, "everything", "echo", {"message": "x"}) == "Echo: x"
    assert asked[0][1].get("readOnlyHint") is True and asked[0][2] is False


async def test_a_server_given_with_other_parameters_than_recorded_gets_no_recorded_annotations(
    tmp_path: Path, registry: ServerRegistry, root: Path
) -> None:
    # The server never starts: the edge server, which needs nothing installed (the fast tier needs nothing).
    marker = tmp_path / "started"
    registry.register(root, "edge", params.edge(), {"echo": {"readOnlyHint": True}})
    asked: list[tuple[str, dict[str, Any], bool]] = []
    edge = {"edge": marked(marker, params.edge())}
    async with tool_server(registry, root, read_only(asked, marker), servers=edge) as server:
        with pytest.raises(ApprovalRejectedError):
            await call(server, "edge", "echo", {"text": "x"})
    assert asked == [("echo", {}, False)]
    assert not marker.exists()


@pytest.mark.integration
async def test_a_listing_in_this_process_takes_precedence_over_recorded_annotations(
    tmp_path: Path, registry: ServerRegistry, root: Path
) -> None:
    marker = tmp_path / "started"
    registry.register(root, "everything", marked(marker), {"echo": {"readOnlyHint": False, "title": "stale"}})
    seen: list[dict[str, Any]] = []

    async def accept(call: ToolCall) -> Approval:
        seen.append(dict(call.annotations))
        return Approved()

    async with tool_server(registry, root, FunctionApprover(accept)) as server:
        await call(server, "everything", "echo", {"message": "x"})  # starts the server: it lists its tools
        await server.reset()
        await call(server, "everything", "echo", {"message": "y"})
    assert seen[0] == {"readOnlyHint": False, "title": "stale"}
    assert seen[1].get("readOnlyHint") is True and "title" not in seen[1]


async def test_a_failing_annotations_lookup_leaves_the_call_without_hints_and_still_decided(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    marker = tmp_path / "started"

    def broken(name: str, server_params: Any) -> None:
        raise RuntimeError("broken lookup")

    asked: list[tuple[str, dict[str, Any], bool]] = []
    servers = {"edge": marked(marker, params.edge())}  # never started: needs nothing installed
    async with ToolServer(
        servers=servers, annotations_lookup=broken, approver=read_only(asked, marker)
    ) as server:
        with (
            caplog.at_level(logging.ERROR, logger="ipybox.mcp_client.pool"),
            pytest.raises(ApprovalRejectedError),
        ):
            await call(server, "edge", "echo", {"text": "x"})
    assert asked == [("echo", {}, False)]
    assert any(r.exc_info and "broken lookup" in str(r.exc_info[1]) for r in caplog.records)
