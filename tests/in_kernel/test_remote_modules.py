"""The import hook of kernels without the host's files (`ipybox.in_kernel.remote_modules`) and the set-up that
installs it (`ipybox.in_kernel.remote.install`), in this process: a real `ToolServer` (in process, on its Unix
socket) serves a package tree written here; imports run in a thread, as a kernel's would block on the socket.
The same in a real kernel: tests/in_kernel/test_remote_kernel.py."""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import os
import shutil
import socket
import sys
import time
import traceback
import types
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ipybox.in_kernel import remote, remote_modules
from ipybox.in_kernel.call_protocol import CERT_ENV, SERVER_ENV, TOKEN_ENV
from ipybox.in_kernel.mcptools_refresh import forget_modules
from ipybox.in_kernel.remote_modules import RemoteModules
from ipybox.tool_server.module_sources import ModuleSources
from ipybox.tool_server.tool_server import ToolServer

# Unique top-level names: nothing else in this process imports them.
TOOLS, ACTIONS = "rmtools", "rmactions"


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ws = tmp_path_factory.mktemp("remote-modules")
    (ws / TOOLS / "demo").mkdir(parents=True)
    (ws / TOOLS / "demo" / "__init__.py").write_text("'''demo'''\nFROM = 'package'\n")
    (ws / TOOLS / "demo" / "tool.py").write_text(
        "import os\nPACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))\n"
        "VALUE = 1\n\ndef fail():\n    raise ValueError('raised in the served module')\n"
    )
    (ws / ACTIONS / "cat" / "act").mkdir(parents=True)
    (ws / ACTIONS / "cat" / "act" / "__init__.py").write_text(f"from {TOOLS}.demo.tool import VALUE\n")
    (ws.parent / "outside.py").write_text("SECRET = 'outside the root'\n")
    (ws / TOOLS / "leak.py").symlink_to(ws.parent / "outside.py")
    return ws


@pytest.fixture(scope="module")
async def server(tree: Path) -> AsyncIterator[ToolServer]:
    async with ToolServer(module_roots={TOOLS: tree / TOOLS, ACTIONS: tree / ACTIONS}) as server:
        # Each generation is computed anew: a change is seen by the very next check.
        server.module_sources.generation_ttl = 0
        yield server


@pytest.fixture
def hook(server: ToolServer) -> Iterator[RemoteModules]:
    finder = RemoteModules((TOOLS, ACTIONS), address=server.calls_address, token=server.call_token)
    sys.meta_path.insert(0, finder)
    try:
        yield finder
    finally:
        sys.meta_path.remove(finder)
        finder.forget()


async def imported(name: str) -> types.ModuleType:
    return await asyncio.to_thread(importlib.import_module, name)


def counting(server: ToolServer, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The times the tool server computed a generation (every `source` and `generation` request does)."""
    calls: list[float] = []
    original = server.module_sources.generation

    def generation() -> str:
        calls.append(time.monotonic())
        return original()

    monkeypatch.setattr(server.module_sources, "generation", generation)
    return calls


def test_forgetting_a_package_drops_its_submodules_and_the_parents_attribute() -> None:
    parent, child, grandchild = (types.ModuleType(n) for n in ("fgpkg", "fgpkg.sub", "fgpkg.sub.leaf"))
    other = types.ModuleType("fgpkg_other")
    parent.sub = child  # type: ignore[attr-defined]
    sys.modules.update({m.__name__: m for m in (parent, child, grandchild, other)})
    try:
        assert forget_modules(["fgpkg.sub"]) == ["fgpkg.sub", "fgpkg.sub.leaf"]
        assert "sub" not in vars(parent)
        assert forget_modules(["fgpkg"]) == ["fgpkg"]
        assert "fgpkg_other" in sys.modules  # a name that merely starts the same stays
    finally:
        for name in ("fgpkg", "fgpkg.sub", "fgpkg.sub.leaf", "fgpkg_other"):
            sys.modules.pop(name, None)


async def test_a_served_module_has_the_host_path_as_its_file_and_its_package_root(
    hook: RemoteModules, tree: Path
) -> None:
    tool = await imported(f"{TOOLS}.demo.tool")
    root = os.path.realpath(tree / TOOLS)
    assert tool.__file__ == f"{root}/demo/tool.py"
    assert root == tool.PACKAGE_ROOT  # what a generated module sends with `run`
    package = sys.modules[f"{TOOLS}.demo"]
    assert package.FROM == "package"
    assert package.__path__ == [f"{root}/demo"]
    assert sys.modules[TOOLS].__path__ == [root]  # a namespace package: no __init__.py


async def test_a_traceback_through_a_served_module_shows_its_source_line(hook: RemoteModules) -> None:
    tool = await imported(f"{TOOLS}.demo.tool")
    with pytest.raises(ValueError) as raised:
        tool.fail()
    text = "".join(traceback.format_exception(raised.value))
    assert "raise ValueError('raised in the served module')" in text


async def test_a_served_package_imports_another_served_package(hook: RemoteModules) -> None:
    action = await imported(f"{ACTIONS}.cat.act")
    assert action.VALUE == 1


async def test_a_change_on_the_host_drops_the_modules_before_the_next_cell(
    hook: RemoteModules, tree: Path
) -> None:
    path = tree / TOOLS / "demo" / "tool.py"
    original = path.read_text()
    try:
        assert (await imported(f"{TOOLS}.demo.tool")).VALUE == 1
        assert await asyncio.to_thread(hook.check_generation) == []  # nothing changed
        path.write_text(original.replace("VALUE = 1", "VALUE = 22"))
        dropped = await asyncio.to_thread(hook.check_generation)
        assert f"{TOOLS}.demo.tool" in dropped and TOOLS in dropped
        assert (await imported(f"{TOOLS}.demo.tool")).VALUE == 22
    finally:
        path.write_text(original)


async def test_a_cell_costs_no_round_trip_while_nothing_served_was_imported(
    hook: RemoteModules, server: ToolServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked = counting(server, monkeypatch)
    assert await asyncio.to_thread(hook.check_generation) == []
    assert asked == []
    await imported(f"{TOOLS}.demo")
    before = len(asked)
    await asyncio.to_thread(hook.check_generation)
    assert len(asked) == before + 1  # one round trip per cell once something was imported


async def test_a_module_missing_on_the_host_is_module_not_found(hook: RemoteModules) -> None:
    with pytest.raises(ModuleNotFoundError):
        await imported(f"{TOOLS}.demo.missing")


async def test_a_symlink_leaving_the_root_is_an_import_error_and_never_read_from_disk(
    hook: RemoteModules,
) -> None:
    # The file is readable by this process: a fallback to the path finder would import it.
    with pytest.raises(ImportError, match="leads outside") as refused:
        await imported(f"{TOOLS}.leak")
    assert f"{TOOLS}.leak" not in sys.modules
    assert "outside the root" not in str(refused.value)


async def test_an_unreachable_tool_server_fails_the_import_with_the_reason(tmp_path: Path) -> None:
    finder = RemoteModules((TOOLS,), address=f"unix:{tmp_path / 'gone.sock'}", token="t")
    sys.meta_path.insert(0, finder)
    try:
        with pytest.raises(ImportError, match="cannot reach the ipybox tool server"):
            await imported(f"{TOOLS}.demo")
    finally:
        sys.meta_path.remove(finder)


async def test_a_tool_server_that_never_answers_fails_the_import_after_the_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(remote_modules, "SOURCE_TIMEOUT", 0.5)
    with socket.socket() as silent:  # accepts connections (its backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        host, port = silent.getsockname()
        finder = RemoteModules((TOOLS,), address=f"tcp://{host}:{port}", token="t")
        sys.meta_path.insert(0, finder)
        try:
            start = time.monotonic()
            with pytest.raises(ImportError, match="timed out"):
                await imported(f"{TOOLS}.demo")
            assert time.monotonic() - start < 5
        finally:
            sys.meta_path.remove(finder)


# -- install()


class Events:
    def __init__(self) -> None:
        self.callbacks: dict[str, list[Callable[..., Any]]] = {}

    def register(self, event: str, function: Callable[..., Any]) -> None:
        self.callbacks.setdefault(event, []).append(function)

    def unregister(self, event: str, function: Callable[..., Any]) -> None:
        self.callbacks[event].remove(function)


class Shell:
    """What `install` uses of an IPython shell (shell approval needs the real one: it fails here)."""

    def __init__(self) -> None:
        self.events = Events()


@pytest.fixture
def installing() -> Iterator[None]:
    environ, cwd, meta_path = dict(os.environ), os.getcwd(), list(sys.meta_path)
    try:
        yield
    finally:
        remote.uninstall()
        os.environ.clear()
        os.environ.update(environ)
        os.chdir(cwd)
        assert sys.meta_path == meta_path


def config(**changes: Any) -> str:
    base: dict[str, Any] = {
        "protocol": remote.PROTOCOL,
        "server": "tcp://127.0.0.1:9",
        "token": "kernel-token",
        "cert": None,
        "roots": {"mcptools": "/host/ws/mcptools", "gentools": "/host/ws/gentools"},
        "extensions": {"shell_approval": False, "cwd": None},
        "env": {"IPYBOX_RM_TEST": "1"},
    }
    return json.dumps({**base, **changes})


def hooks() -> list[RemoteModules]:
    return [finder for finder in sys.meta_path if isinstance(finder, RemoteModules)]


def test_install_sets_the_channel_and_the_env_and_puts_the_hook_first(
    installing: None, tmp_path: Path
) -> None:
    shell = Shell()
    remote.install(config(cert="PEM", extensions={"cwd": str(tmp_path)}), shell)
    assert (os.environ[SERVER_ENV], os.environ[TOKEN_ENV], os.environ[CERT_ENV]) == (
        "tcp://127.0.0.1:9",
        "kernel-token",
        "PEM",
    )
    assert os.environ["IPYBOX_RM_TEST"] == "1"
    assert os.getcwd() == os.path.realpath(tmp_path)
    finder = sys.meta_path[0]
    assert isinstance(finder, RemoteModules) and finder.names == {"mcptools", "gentools"}
    assert shell.events.callbacks["pre_run_cell"] == [finder.check_generation]


def test_installing_the_same_config_again_changes_nothing(installing: None) -> None:
    shell = Shell()
    remote.install(config(), shell)
    first = hooks()
    remote.install(config(), shell)
    assert hooks() == first and len(first) == 1
    assert len(shell.events.callbacks["pre_run_cell"]) == 1


def test_installing_another_config_replaces_the_first(installing: None) -> None:
    shell = Shell()
    remote.install(config(), shell)
    remote.install(config(token="another", env={"IPYBOX_RM_OTHER": "2"}), shell)
    (finder,) = hooks()
    assert finder.token == "another" and os.environ[TOKEN_ENV] == "another"
    assert shell.events.callbacks["pre_run_cell"] == [finder.check_generation]
    assert "IPYBOX_RM_TEST" not in os.environ and os.environ["IPYBOX_RM_OTHER"] == "2"


def test_install_refuses_another_protocol_naming_what_to_install(installing: None) -> None:
    with pytest.raises(remote.ProtocolMismatchError) as refused:
        remote.install(config(protocol=remote.PROTOCOL + 1, ipybox="9.9.9"), Shell())
    message = str(refused.value)
    assert "in-kernel part" in message
    assert (
        f"the host speaks protocol {remote.PROTOCOL + 1}: install ipybox==9.9.9 in the kernel image"
        in message
    )
    assert hooks() == []


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"server": "http://host:1"}, "'server'"),
        ({"token": ""}, "'token'"),
        ({"roots": {"os": "/etc"}}, "'roots'"),
        ({"env": {"A": 1}}, "'env'"),
        ({"extensions": {"shell_approval": "always"}}, "shell approval mode"),
        ({"extensions": {"sandbox": True}}, "'extensions'"),
        ({"surprise": 1}, "unknown keys"),
    ],
)
def test_a_malformed_config_is_refused_naming_the_field_before_anything_changes(
    installing: None, changes: dict[str, Any], named: str
) -> None:
    with pytest.raises(ValueError, match=named):
        remote.install(config(**changes), Shell())
    assert hooks() == [] and os.environ.get("IPYBOX_RM_TEST") is None


@pytest.mark.parametrize("extensions", [{"shell_approval": True}, {"shell_approval": "escape"}])
def test_shell_approval_that_cannot_be_loaded_fails_the_install_and_leaves_no_hook(
    installing: None, extensions: dict[str, Any]
) -> None:
    shell = Shell()  # no IPython: the guard cannot hook it
    with pytest.raises(RuntimeError, match="must not run without it"):
        remote.install(config(extensions=extensions), shell)
    assert hooks() == [] and shell.events.callbacks["pre_run_cell"] == []
    with pytest.raises(RuntimeError, match="must not run without it"):  # tried again, never taken as done
        remote.install(config(extensions=extensions), shell)


def test_shell_approval_in_the_kernel_env_is_loaded_too(installing: None) -> None:
    with pytest.raises(RuntimeError, match="must not run without it"):
        remote.install(config(env={"IPYBOX_SHELL_APPROVAL": "ask"}), Shell())


# -- a code action's staging directory


@pytest.fixture
def staging(tree: Path, server: ToolServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A staged action `<ACTIONS>.cat.act`, its final place taken by another version (an overwrite)."""
    directory = tree / ACTIONS / "cat" / ".act.tmp-4242_0123456789ab"
    directory.mkdir()
    (directory / "__init__.py").write_text("from .api import run\nWHERE = 'staged'\n")
    (directory / "api.py").write_text("from .impl import answer\n\ndef run():\n    return answer()\n")
    (directory / "impl.py").write_text("def answer():\n    raise ValueError('raised in the staged impl')\n")
    staged_sources = ModuleSources(
        {TOOLS: tree / TOOLS, ACTIONS: tree / ACTIONS}, staged_root=ACTIONS, generation_ttl=0
    )
    monkeypatch.setattr(server, "module_sources", staged_sources)
    try:
        yield directory
    finally:
        shutil.rmtree(directory)


def register(hook: RemoteModules, name: str, directory: Path) -> types.ModuleType:
    """What `import_check` does with a staged package in a kernel without the host's files."""
    spec = hook.stage(name, str(directory))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


async def test_a_staged_package_and_its_submodules_load_from_the_hosts_staging_directory(
    hook: RemoteModules, staging: Path
) -> None:
    name = f"{ACTIONS}.cat.act"
    assert remote_modules.installed() is hook
    await imported(f"{ACTIONS}.cat.act")  # the final one, read before the staged one is registered
    package = await asyncio.to_thread(register, hook, name, staging)
    assert package.WHERE == "staged" and package.__file__ == f"{staging}/__init__.py"
    assert package.__path__ == [str(staging)]
    impl = sys.modules[f"{name}.impl"]
    assert impl.__file__ == f"{staging}/impl.py"
    with pytest.raises(ValueError) as raised:
        package.run()
    frame = traceback.extract_tb(raised.value.__traceback__)[-1]
    assert (frame.filename, frame.lineno, frame.line) == (
        f"{staging}/impl.py",
        2,
        "raise ValueError('raised in the staged impl')",
    )


async def test_forgetting_the_modules_forgets_what_was_staged(hook: RemoteModules, staging: Path) -> None:
    name = f"{ACTIONS}.cat.act"
    await asyncio.to_thread(register, hook, name, staging)
    hook.forget()
    assert not hasattr(await imported(name), "WHERE")  # the final package again


async def test_a_directory_the_tool_server_does_not_serve_as_staged_fails_the_import(
    hook: RemoteModules, staging: Path, tree: Path
) -> None:
    with pytest.raises(ImportError, match="not a code action's staging directory"):
        await asyncio.to_thread(hook.stage, f"{ACTIONS}.cat.act", str(tree / ACTIONS / "cat" / "act"))
    with pytest.raises(ValueError, match="not in a package this import hook serves"):
        hook.stage("os", str(staging))
