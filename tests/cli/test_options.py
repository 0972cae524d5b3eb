"""The `ipybox` command line's consistency, in-process (no workspace runs): every command names its
workspace with `-w/--workspace` (the old positional `DIR` still works, hidden), a usage error shows the
command's own usage, the top-level help lists no dead 0.9 flags, `status` is readable (and `--json` is
JSON), `down` of a stopped workspace succeeds, `server add -H` works, and `doctor` finds bubblewrap where
the sandbox does."""

from __future__ import annotations

import importlib
import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from ipybox.cli import workspace as workspace_cli
from ipybox.running.status import MCPServerStatus, ReconcilerStatus, WorkspaceStatus
from tests.console.targets import status_of

main_module = importlib.import_module("ipybox.cli.main")  # `ipybox.cli.main` is also the function
main = main_module.main

# command argv (with {ws} where the workspace goes after it), the module and function that gets the workspace
COMMANDS: list[tuple[list[str], str, str]] = [
    (["up"], "ipybox.cli.workspace", "up"),
    (["status"], "ipybox.cli.workspace", "status"),
    (["down"], "ipybox.cli.workspace", "down"),
    (["logs"], "ipybox.cli.workspace", "logs"),
    (["validate"], "ipybox.cli.workspace", "validate"),
    (["approve"], "ipybox.cli.approve", "approve"),
    (["console"], "ipybox.cli.approve", "console"),
    (["init"], "ipybox.cli.init", "init"),
    (["doctor"], "ipybox.cli.main", "_doctor"),
    (["policy", "check", "{ws}", "fs.read {}"], "ipybox.cli.policy", "check"),
    (["policy", "replay"], "ipybox.cli.policy", "replay"),
    (["lock", "accept"], "ipybox.cli.lock", "accept"),
    (["audit", "verify"], "ipybox.cli.audit", "verify"),
]
# Commands that never had a positional DIR: -w only.
W_ONLY: list[tuple[list[str], str, str]] = [
    (["server", "list"], "ipybox.cli.servers", "_list"),
    (["server", "remove", "x"], "ipybox.cli.servers", "_remove"),
    (["exec", "print(1)"], "ipybox.cli.main", "_exec"),
    (["mcp"], "ipybox.supervisor.mcp_stdio", "serve_stdio"),
]


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    directory = tmp_path / "ws"
    directory.mkdir()
    (directory / "ipybox.toml").write_text("")
    return directory


def recording(monkeypatch: pytest.MonkeyPatch, module: str, name: str) -> list[Path]:
    """Replace `module.name` by a function that records the workspace it is given, and succeeds."""
    seen: list[Path] = []

    def record(*args: Any, **kwargs: Any) -> int:
        found = kwargs.get("workspace", kwargs.get("directory", args[0] if args else None))
        if name == "_exec":
            found = kwargs["workspace"]
        seen.append(Path(found).resolve())
        return 0

    async def arecord(*args: Any, **kwargs: Any) -> Any:
        record(*args, **kwargs)
        return 0 if name == "_exec" else None

    is_async = name in ("_exec", "serve_stdio")
    monkeypatch.setattr(importlib.import_module(module), name, arecord if is_async else record)
    return seen


def argv_with(command: list[str], where: list[str]) -> list[str]:
    """`command` with the workspace given as `where`: in place of {ws}, else after the command's words."""
    if "{ws}" in command:
        at = command.index("{ws}")
        return [*command[:at], *where, *command[at + 1 :]]
    words = 2 if command[0] in ("policy", "lock", "audit", "server") else 1
    return [*command[:words], *where, *command[words:]]


def without_ws(command: list[str]) -> list[str]:
    return [word for word in command if word != "{ws}"]


FORMS = ["-w", "--workspace", "before the command", "positional DIR"]


@pytest.mark.parametrize(("command", "module", "name"), COMMANDS + W_ONLY, ids=lambda v: str(v))
def test_every_command_takes_the_workspace_as_w_and_the_old_positional_dir_still_works(
    command: list[str],
    module: str,
    name: str,
    ws: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    seen = recording(monkeypatch, module, name)
    monkeypatch.chdir(ws.parent)  # not the workspace: the default would be wrong
    forms = FORMS if (command, module, name) in COMMANDS else FORMS[:3]  # W_ONLY never had a DIR
    for form in forms:
        if form == "before the command":
            argv = ["-w", str(ws), *without_ws(command)]
        elif form == "positional DIR":
            argv = argv_with(command, [str(ws)])
        else:
            argv = argv_with(command, [form, str(ws)])
        assert main(argv) == 0, argv
    assert seen == [ws] * len(forms)
    # Only -w is documented: the positional DIR is in neither the usage nor the help.
    words = 2 if command[0] in ("policy", "lock", "audit", "server") else 1
    with pytest.raises(SystemExit):
        main([*command[:words], "-h"])
    shown = capsys.readouterr().out
    assert "-w DIR, --workspace DIR" in shown
    assert "legacy_dir" not in shown and not re.search(r"[\[ ]dir\]?(\s|$)", shown.split("\n\n")[0]), shown


@pytest.mark.parametrize(("command", "module", "name"), COMMANDS[:7], ids=lambda v: str(v))
def test_without_a_workspace_the_current_directory_is_it(
    command: list[str], module: str, name: str, ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = recording(monkeypatch, module, name)
    monkeypatch.chdir(ws)
    assert main(command) == 0
    assert seen == [ws]


def test_the_workspace_given_twice_differently_is_a_usage_error(
    ws: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["status", str(ws), "-w", str(tmp_path)])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: ipybox status ")
    assert f"the workspace is given twice (-w {tmp_path} and DIR {ws}): give it once, with -w DIR" in err


@pytest.mark.parametrize(
    ("argv", "usage", "error"),
    [
        (
            ["up", "--bogus"],
            "usage: ipybox up [-h] [-w DIR] [-d]",
            "ipybox up: error: unrecognized arguments: --bogus",
        ),
        (
            ["audit", "verify", "--bogus"],
            "usage: ipybox audit verify [-h] [-w DIR] [--json]",
            "ipybox audit verify: error: unrecognized arguments: --bogus",
        ),
        (
            ["status", "-w"],
            "usage: ipybox status [-h] [-w DIR] [--json]",
            "ipybox status: error: argument -w/--workspace: expected one argument",
        ),
    ],
)
def test_a_usage_error_shows_the_commands_usage_and_one_line_saying_what_was_wrong(
    argv: list[str], usage: str, error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert capsys.readouterr().err == f"{usage}\n{error}\n"


def test_a_directory_that_is_not_a_workspace_is_named_under_the_commands_usage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main(["status", "-w", str(tmp_path)])
    assert capsys.readouterr().err == (
        "usage: ipybox status [-h] [-w DIR] [--json]\n"
        f"ipybox status: error: {tmp_path} is not a workspace: it has no ipybox.toml (`ipybox init -w {tmp_path}` "
        "writes one)\n"
    )


@pytest.mark.parametrize("argv", [["-h"], ["mcp", "-h"]])
def test_the_help_lists_none_of_ipybox_09s_dead_endpoint_flags(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main(argv)
    shown = capsys.readouterr().out
    assert "-w DIR, --workspace DIR" in shown
    for flag in (
        "--tool-server-host",
        "--tool-server-port",
        "--kernel-gateway-host",
        "--kernel-gateway-port",
    ):
        assert flag not in shown


def test_the_dead_flags_are_still_accepted_and_said_unused(
    ws: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen = recording(monkeypatch, "ipybox.supervisor.mcp_stdio", "serve_stdio")
    assert main(["--workspace", str(ws), "--tool-server-port", "8900", "--kernel-gateway-host", "h"]) == 0
    assert seen == [ws]
    assert "ignoring --tool-server-port 8900, --kernel-gateway-host h" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (["{ws}"], ("{ws}", None)),
        (["{ws}", "edge"], ("{ws}", "edge")),
        (["-w", "{ws}", "edge"], ("{ws}", "edge")),
        (["edge"], (".", "edge")),  # from inside the workspace
    ],
)
def test_lock_accept_takes_an_optional_server_and_its_old_dir_first_form(
    given: list[str], expected: tuple[str, str | None], ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[Path, str | None]] = []
    lock = importlib.import_module("ipybox.cli.lock")
    monkeypatch.setattr(lock, "accept", lambda d, s, as_json: seen.append((d, s)) or 0)
    monkeypatch.chdir(ws)
    assert main(["lock", "accept", *(str(ws) if word == "{ws}" else word for word in given)]) == 0
    directory = ws if expected[0] == "{ws}" else Path(expected[0]).resolve()
    assert seen == [(directory, expected[1])]


def readable_status(capsys: pytest.CaptureFixture[str], status: WorkspaceStatus) -> str:
    async def answer(workspace: Path) -> WorkspaceStatus:
        del workspace
        return status

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(workspace_cli, "_status", answer)
        assert workspace_cli.status(Path("/home/me/project"), as_json=False) == 0
    return capsys.readouterr().out


def test_status_is_aligned_lines_with_state_endpoints_kernels_and_each_servers_state(
    capsys: pytest.CaptureFixture[str],
) -> None:
    shown = readable_status(capsys, status_of())
    lines = shown.splitlines()
    assert lines[0] == "ipybox is running in /home/me/project"
    fields = {m[1]: m[2] for line in lines if (m := re.fullmatch(r"  (\w+):( *)(.*)", line))}
    labelled = [line for line in lines if re.match(r"  \w+:", line)]
    assert {line.index(line.split(":", 1)[1].strip()) for line in labelled} == {13}, (
        labelled
    )  # values aligned
    assert {"state", "mcp", "console", "gateway", "restarts", "kernels", "limits", "servers"} <= set(fields)
    assert "  state:     up 62 min (since 2026-11-24 07:00:00 UTC), pid 4242, kernels sandboxed" in lines
    assert "  gateway:   running (pid 4243)" in lines and "  restarts:  gateway 1" in lines
    assert "  servers:   2 (1 ready, 1 failed)" in lines
    assert "    broken      failed (ipybox.toml:12:1): could not start: npx: command not found" in lines
    assert "    filesystem  ready, 14 tools" in lines
    assert "{" not in shown and "'" not in shown  # no Python dict or repr anywhere


def test_status_with_no_servers_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    shown = readable_status(capsys, status_of(reconciler=ReconcilerStatus(), restarts={"gateway": 0}))
    assert "  servers:   none" in shown.splitlines() and "restarts" not in shown


def test_status_json_is_json_of_the_whole_status(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    status = status_of()

    async def answer(workspace: Path) -> WorkspaceStatus:
        del workspace
        return status

    monkeypatch.setattr(workspace_cli, "_status", answer)
    assert workspace_cli.status(Path("/home/me/project"), as_json=True) == 0
    assert json.loads(capsys.readouterr().out) == {"running": True, **status.model_dump(mode="json")}


def test_failed_servers_are_the_declared_ones_that_could_not_start() -> None:
    servers = {
        "a": MCPServerStatus(state="ready", tools=1),
        "b": MCPServerStatus(state="failed", error="exited"),
        "c": MCPServerStatus(state="starting"),
    }
    status = status_of(reconciler=ReconcilerStatus(servers=servers))
    assert [name for name, _ in workspace_cli.failed_servers(status)] == ["b"]


@pytest.mark.parametrize("config", ["", None], ids=["a workspace", "no ipybox.toml"])
def test_down_of_a_stopped_workspace_exits_0_and_says_it_was_not_running(
    config: str | None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if config is not None:
        (tmp_path / "ipybox.toml").write_text(config)
    assert main(["down", "-w", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"ipybox is not running in {tmp_path}: nothing to stop\n"


def test_server_add_takes_h_for_a_header(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["server", "add", "remote", "-w", str(ws), "--url", "https://example.com/mcp"]
    assert main([*argv, "-H", "Authorization: Bearer ${T}", "-H", "X-A: b"]) == 0
    table = tomllib.loads((ws / "ipybox.toml").read_text())["servers"]["remote"]
    assert table["headers"] == {"Authorization": "Bearer ${T}", "X-A": "b"}
    capsys.readouterr()


def test_doctor_finds_bubblewrap_where_the_sandbox_does_even_off_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ipybox.sandbox import bwrap, doctor

    system = tmp_path / "system-bin"
    system.mkdir()
    fake = system / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bubblewrap 0.11.0'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # as an MCP client or a service may cut it down
    monkeypatch.setattr(bwrap, "BWRAP_SYSTEM_DIRS", (str(system),))
    assert bwrap.bwrap_path() == str(fake)
    check = doctor._bwrap()
    assert (check.ok, check.detail) == (True, f"{fake} (bubblewrap 0.11.0)")
