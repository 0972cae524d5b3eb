"""Which `CodeExecutor` arguments apply to which backend: refused or warned about when constructed, before
anything starts (no processes: these are unit tests)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import psutil
import pytest

from ipybox import CodeExecutor, ResourceLimits

# Everything an embedded executor takes that a workspace's ipybox.toml decides instead, with a value.
WORKSPACE_DECIDES: dict[str, Any] = {
    "tool_server_host": "localhost",
    "tool_server_port": 8900,
    "kernel_gateway_host": "localhost",
    "kernel_gateway_port": 8888,
    "kernel_gateway_url": "http://127.0.0.1:8888",
    "kernel_gateway_token": "secret",
    "kernel_env": {"A": "1"},
    "approval_timeout": 10,
    "connect_timeout": 10,
    "sandbox": True,
    "sandbox_config": "policy.json",
    "spare_kernel": False,
    "mcp_servers": {"time": {"command": "uvx", "args": ["mcp-server-time"]}},
    "mcptools_dir": "tools",
    "package_roots": ["tools"],
    "working_dir": ".",
    "limits": ResourceLimits(memory="1GiB"),
}


def _no_warnings_from(**kwargs: Any) -> CodeExecutor:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return CodeExecutor(**kwargs)


@pytest.mark.parametrize("name", sorted(WORKSPACE_DECIDES))
def test_an_argument_the_workspace_decides_is_refused_with_what_to_do(name: str, tmp_path: Path) -> None:
    with pytest.raises(
        ValueError, match=rf"^{name} does not apply to CodeExecutor\(workspace=\.\.\.\): .*; drop {name}=$"
    ):
        CodeExecutor(workspace=tmp_path, **{name: WORKSPACE_DECIDES[name]})


@pytest.mark.parametrize("name", ["sandbox", "spare_kernel", "kernel_env"])
def test_passing_the_default_to_a_workspace_is_refused_too(name: str, tmp_path: Path) -> None:
    # The workspace decides, whatever the value: `sandbox=False` must not read as "unsandboxed".
    default = {"sandbox": False, "spare_kernel": True, "kernel_env": None}[name]
    with pytest.raises(ValueError, match=f"drop {name}="):
        CodeExecutor(workspace=tmp_path, **{name: default})


def test_the_sandbox_error_names_the_toml_table(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"sandbox is set by the workspace's ipybox.toml \(\[sandbox\]\)"):
        CodeExecutor(workspace=tmp_path, sandbox=True)


def test_a_workspace_executor_takes_the_arguments_about_its_own_results(tmp_path: Path) -> None:
    executor = _no_warnings_from(
        workspace=tmp_path,
        images_dir=tmp_path / "images",
        output_dir=tmp_path / "outputs",
        max_output_chars=100,
        max_output_file_bytes=1000,
        max_image_bytes=10,
        log_level="info",
    )
    assert (executor.images_dir, executor.max_output_chars, executor.log_level) == (
        tmp_path / "images",
        100,
        "INFO",
    )
    assert (executor.max_output_file_bytes, executor.max_image_bytes) == (1000, 10)
    assert executor.working_dir == tmp_path.resolve()


@pytest.mark.parametrize("name", ["max_output_file_bytes", "max_image_bytes"])
@pytest.mark.parametrize("value", [0, -1, True, 1.5, "1MiB"])
def test_a_file_limit_that_is_not_a_positive_number_of_bytes_is_refused(name: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"{name} takes a positive number of bytes, not "):
        CodeExecutor(**{name: value})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sandbox": True, "kernel_gateway_url": "http://127.0.0.1:8888"}, "drop one of the two"),
        ({"sandbox": True, "tool_server_port": 8900}, "leave tool_server_port unset"),
        ({"sandbox_config": "policy.json"}, "pass sandbox=True or drop sandbox_config="),
        ({"sandbox": False, "sandbox_config": "policy.json"}, "pass sandbox=True or drop sandbox_config="),
        (
            {"kernel_gateway_url": "http://127.0.0.1:8888", "kernel_gateway_host": "::1"},
            "drop kernel_gateway_host=",
        ),
        (
            {"kernel_gateway_url": "http://127.0.0.1:8888", "kernel_gateway_port": 8888},
            "drop kernel_gateway_port=",
        ),
        ({"kernel_gateway_token": "secret"}, "pass kernel_gateway_url= or drop kernel_gateway_token="),
        (
            {"kernel_gateway_url": "http://127.0.0.1:8888", "limits": ResourceLimits(processes=10)},
            "limits= applies to kernels of the embedded gateway",
        ),
        ({"execute_accepts_asks": True}, r"execute_accepts_asks applies to CodeExecutor\(workspace=\.\.\.\)"),
    ],
)
def test_embedded_arguments_that_exclude_each_other_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CodeExecutor(**kwargs)


def test_the_tool_server_host_without_a_port_warns_at_the_caller() -> None:
    with pytest.warns(
        DeprecationWarning, match=r"tool_server_host does nothing without tool_server_port"
    ) as caught:
        CodeExecutor(tool_server_host="localhost")
    assert [Path(w.filename).name for w in caught] == [Path(__file__).name]


def test_the_tool_server_host_with_a_port_does_not_warn() -> None:
    executor = _no_warnings_from(tool_server_host="::1", tool_server_port=0)
    assert (executor.tool_server_host, executor.tool_server_port) == ("::1", 0)


def test_arguments_left_out_warn_about_nothing() -> None:
    executor = _no_warnings_from()
    assert (executor.tool_server_host, executor.approval_timeout, executor.sandbox) == (
        "localhost",
        60,
        False,
    )


def test_the_0_9_arguments_that_do_something_are_taken_without_a_warning(tmp_path: Path) -> None:
    _no_warnings_from(
        kernel_gateway_host="localhost",
        kernel_gateway_port=None,
        kernel_env={"A": "1"},
        images_dir=tmp_path,
        approval_timeout=10,
        connect_timeout=10,
        sandbox=True,
        sandbox_config=tmp_path / "policy.json",
        log_level="DEBUG",
    )


def test_constructing_an_executor_starts_nothing(tmp_path: Path) -> None:
    before = set(psutil.Process().children(recursive=True))
    embedded = CodeExecutor(working_dir=tmp_path, sandbox=True)
    attached = CodeExecutor(workspace=tmp_path)  # no workspace runs there: found out by start()
    assert set(psutil.Process().children(recursive=True)) == before
    for executor in (embedded, attached):
        assert executor.kernel_gateway is None
        with pytest.raises(RuntimeError, match="not running"):
            _ = executor.kernel_client
    assert not (tmp_path / "mcptools").exists()


@pytest.mark.parametrize("roots", ["tools", Path("tools")])
def test_package_roots_is_a_list_of_directories(roots: str | Path) -> None:
    with pytest.raises(
        ValueError, match=r"package_roots takes a list of directories: pass package_roots=\[\.\.\.\]"
    ):
        CodeExecutor(package_roots=roots)  # type: ignore[arg-type]
