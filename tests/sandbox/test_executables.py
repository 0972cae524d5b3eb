"""What the host executes from a workspace, derived from how a server is started (no process runs)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from ipybox.sandbox.executables import (
    Derived,
    deny_write_entries,
    interpreter_executables,
    kernel_writable,
    server_executables,
)
from ipybox.sandbox.policy import SandboxPolicy

ENV = {"PATH": "/usr/bin:/bin"}


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    workspace = tmp_path / "ws"
    (workspace / "env" / "bin").mkdir(parents=True)
    (workspace / "env" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (workspace / "env" / "bin" / "python").write_text("")
    (workspace / "tools" / "sub").mkdir(parents=True)
    (workspace / "tools" / "sub" / "server.js").write_text("require('left-pad')\n")
    (workspace / "tools" / "server.py").write_text("")
    (workspace / "server.py").write_text("import helpers\nfrom lib.x import y\nimport json\n")
    (workspace / "helpers.py").write_text("")
    (workspace / "lib").mkdir()
    (workspace / "data").mkdir()
    (workspace / "data" / "config.yaml").write_text("")
    return workspace


def derive(ws: Path, command: str, *args: str, cwd: str = ".", env: dict[str, str] = ENV) -> Derived:
    return server_executables("s", command, list(args), env, str(ws / cwd), str(ws))


def protected(derived: Derived, ws: Path) -> set[str]:
    return {
        os.path.relpath(item.path, ws) + (f"/{item.pattern}" if item.pattern else "")
        for item in derived.protected
    }


def test_a_command_in_a_virtualenv_protects_the_whole_environment(ws: Path) -> None:
    assert protected(derive(ws, "env/bin/python", "tools/server.py"), ws) == {"env", "tools"}


def test_a_script_at_the_top_level_protects_it_its_bytecode_its_siblings_and_its_packages(ws: Path) -> None:
    derived = derive(ws, "python3", "-u", "server.py")
    assert protected(derived, ws) == {"server.py", "__pycache__", "./*.py", "lib"}
    assert any("move server.py into a directory of its own" in line for line in derived.unprotected)


def test_a_javascript_file_protects_node_modules_between_it_and_the_workspace(ws: Path) -> None:
    derived = derive(ws, "node", "tools/sub/server.js")
    assert protected(derived, ws) == {"tools/sub", "tools/node_modules"}


def test_a_module_run_with_dash_m_and_a_working_directory_below_the_workspace(ws: Path) -> None:
    assert protected(derive(ws, "python", "-m", "lib.server"), ws) >= {"lib", "__pycache__", "lib.py"}
    assert protected(derive(ws, "python", "-m", "server", cwd="tools"), ws) == {"tools"}


def test_a_package_runner_protects_its_project_files_up_to_the_workspace(ws: Path) -> None:
    found = protected(derive(ws, "npx", "-y", "some-server", cwd="data"), ws)
    assert {"data", "data/package.json", "package.json", ".npmrc", "pyproject.toml"} <= found


def test_a_data_file_argument_protects_the_file_not_its_directory(ws: Path) -> None:
    assert protected(derive(ws, "/usr/bin/some-server", "--config=data/config.yaml", "."), ws) == {
        "data/config.yaml"
    }


def test_search_paths_of_the_environment_in_the_workspace(ws: Path) -> None:
    env = {"PATH": f"{ws / 'tools'}:/usr/bin", "PYTHONPATH": "lib", "LD_PRELOAD": "data/config.yaml"}
    assert protected(derive(ws, "some-server", env=env), ws) == {"tools", "lib", "data/config.yaml"}


def test_a_search_path_that_is_the_workspace_itself_is_reported(ws: Path) -> None:
    derived = derive(ws, "/usr/bin/true", env={"PATH": "/usr/bin", "PYTHONPATH": "."})
    assert protected(derived, ws) == {"__pycache__", "./*.py", "lib"}
    assert any("is the workspace itself" in line for line in derived.unprotected)


def test_ipybox_running_from_the_workspace_protects_its_environment(tmp_path: Path) -> None:
    prefix = Path(sys.prefix).resolve()
    derived = interpreter_executables(str(prefix.parent))
    assert str(prefix) in {item.path for item in derived.protected}
    assert not interpreter_executables(str(tmp_path)).protected


def test_what_a_kernel_could_still_write(ws: Path, tmp_path: Path) -> None:
    outside = tmp_path / "allowed"
    outside.mkdir()
    (outside / "server").write_text("")
    derived = derive(ws, str(outside / "server"), "server.py")
    policy = SandboxPolicy.model_validate({"filesystem": {"allowWrite": [str(outside)]}})
    view = policy.view(ws, tmp_path / "home")
    # The command in allowWrite, the top-level script, its siblings and its package: all writable.
    assert set(kernel_writable(derived.executed, view)) == {
        str(outside / "server"),
        str(ws / "server.py"),
        str(ws / "*.py"),
        str(ws / "lib"),
    }
    entries = deny_write_entries(derived.protected)
    protected_view = policy.model_copy(
        update={"filesystem": policy.filesystem.model_copy(update={"deny_write": entries})}
    ).view(ws, tmp_path / "home")
    # Protected: only the allowWrite command is left; a missing top-level name can't be created at all.
    assert kernel_writable(derived.executed, protected_view) == [str(outside / "server")]
    missing = derive(ws, "python", "-m", "missing")
    assert str(ws / "missing") in {item.path for item in missing.executed}
    assert not {str(ws / "missing"), str(ws / "missing.py")} & set(kernel_writable(missing.executed, view))
