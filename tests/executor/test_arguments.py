"""Which `CodeExecutor` arguments apply to which backend: refused or warned about when constructed, before
anything starts (no processes: these are unit tests)."""

from __future__ import annotations

import inspect
import warnings
from pathlib import Path
from typing import Any

import psutil
import pytest

from ipybox import CodeExecutor, ResourceLimits
from ipybox.executor.backends import EmbeddedBackend, WorkspaceBackend
from ipybox.executor.options import (
    ApprovalOptions,
    EmbeddedGateway,
    EmbeddedOptions,
    ExternalGateway,
    KernelOptions,
    OutputOptions,
    SandboxOptions,
    ToolOptions,
    WorkspaceOptions,
)

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
    assert isinstance(executor.options, EmbeddedOptions)
    assert (executor.options.tools.server_host, executor.options.tools.server_port) == ("::1", 0)


def test_arguments_left_out_warn_about_nothing_and_are_the_default_options() -> None:
    executor = _no_warnings_from()
    assert executor.options == EmbeddedOptions()
    assert isinstance(executor.backend, EmbeddedBackend)


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


# ipybox 0.9.2's published signature, in its positional order (the reference docs' `CodeExecutor(...)`).
PUBLISHED_0_9_2 = (
    "tool_server_host",
    "tool_server_port",
    "kernel_gateway_host",
    "kernel_gateway_port",
    "kernel_env",
    "images_dir",
    "approval_timeout",
    "connect_timeout",
    "sandbox",
    "sandbox_config",
    "log_level",
)


def test_the_0_9_2_signature_still_binds_positionally_and_by_name() -> None:
    signature = inspect.signature(CodeExecutor)
    assert tuple(signature.parameters)[: len(PUBLISHED_0_9_2)] == PUBLISHED_0_9_2
    values = (
        "localhost",
        None,
        "localhost",
        None,
        {"A": "1"},
        Path("images"),
        60,
        30,
        False,
        None,
        "WARNING",
    )
    bound = signature.bind(*values)
    assert dict(bound.arguments) == dict(zip(PUBLISHED_0_9_2, values, strict=True))
    assert dict(signature.bind(**dict(zip(PUBLISHED_0_9_2, values, strict=True))).arguments) == dict(
        bound.arguments
    )


def test_an_executor_constructed_the_0_9_2_way_gets_the_options_its_arguments_stand_for(
    tmp_path: Path,
) -> None:
    with pytest.warns(DeprecationWarning, match="tool_server_host does nothing"):  # as in 0.9.2: no port
        executor = CodeExecutor(
            "localhost",
            None,
            "127.0.0.1",
            8888,
            {"A": "1"},
            tmp_path / "img",
            10,
            5,
            True,
            tmp_path / "p.json",
            "debug",
        )
    assert executor.options == EmbeddedOptions(
        kernel=KernelOptions(env={"A": "1"}, sandbox=SandboxOptions(tmp_path / "p.json")),
        gateway=EmbeddedGateway("127.0.0.1", 8888),
        tools=ToolOptions(connect_timeout=5, server_host="localhost"),
        approval=ApprovalOptions(timeout=10),
        output=OutputOptions(images_dir=tmp_path / "img"),
        log_level="DEBUG",
    )


def test_the_later_keyword_arguments_fill_their_options(tmp_path: Path) -> None:
    limits = ResourceLimits(memory="1GiB")
    executor = CodeExecutor(
        working_dir=tmp_path,
        kernel_gateway_url="http://127.0.0.1:9999",
        kernel_gateway_token="t",
        approve_tool_calls=False,
        max_output_chars=10,
        output_dir="out",
        spare_kernel=False,
        mcp_servers={"time": {"command": "uvx"}},
        mcptools_dir="tools",
        package_roots=["roots"],
        kernel_init_timeout=None,
        approval_timeout=None,
    )
    options = executor.options
    assert isinstance(options, EmbeddedOptions)
    assert options.gateway == ExternalGateway("http://127.0.0.1:9999", "t")
    assert options.kernel == KernelOptions(working_dir=tmp_path, spare_kernel=False, init_timeout=None)
    assert options.tools == ToolOptions(
        mcp_servers={"time": {"command": "uvx"}},
        mcptools_dir=Path("tools"),
        package_roots=(Path("roots").resolve(),),
    )
    assert options.approval == ApprovalOptions(tool_calls=False, timeout=None)
    assert options.output == OutputOptions(output_dir=Path("out"), max_output_chars=10)
    assert executor.working_dir == tmp_path.resolve()
    assert CodeExecutor(limits=limits).options.kernel.limits == limits  # type: ignore[union-attr]


def test_a_workspace_executor_gets_workspace_options(tmp_path: Path) -> None:
    executor = CodeExecutor(workspace=tmp_path, max_output_chars=7, execute_accepts_asks=True)
    assert executor.options == WorkspaceOptions(
        tmp_path.resolve(), output=OutputOptions(max_output_chars=7), execute_accepts_asks=True
    )
    assert isinstance(executor.backend, WorkspaceBackend)
    assert (executor.workspace, executor.execute_accepts_asks) == (tmp_path.resolve(), True)


def test_an_executor_takes_its_options_made_already(tmp_path: Path) -> None:
    options = EmbeddedOptions(
        kernel=KernelOptions(working_dir=tmp_path), approval=ApprovalOptions(shell_cmds=True)
    )
    executor = _no_warnings_from(options=options)
    assert executor.options is options
    assert executor.working_dir == tmp_path.resolve()


def test_options_with_other_arguments_are_refused_naming_them(tmp_path: Path) -> None:
    with pytest.raises(
        ValueError, match=r"^options= holds the whole configuration: drop sandbox=, workspace= "
    ):
        CodeExecutor(options=EmbeddedOptions(), sandbox=True, workspace=tmp_path)


def test_an_unknown_keyword_argument_is_a_type_error_as_before() -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'sandboxed'"):
        CodeExecutor(sandboxed=True)  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: EmbeddedOptions(
                kernel=KernelOptions(sandbox=SandboxOptions()), gateway=ExternalGateway("http://127.0.0.1:1")
            ),
            "sandbox=True sandboxes kernels of the embedded gateway",
        ),
        (
            lambda: EmbeddedOptions(
                kernel=KernelOptions(sandbox=SandboxOptions()), tools=ToolOptions(server_port=1)
            ),
            "leave tool_server_port unset",
        ),
        (
            lambda: EmbeddedOptions(
                approval=ApprovalOptions(shell_cmds=True), gateway=ExternalGateway("http://h")
            ),
            "approve_shell_cmds=True needs ipybox's own kernels",
        ),
        (lambda: ApprovalOptions(require_shell_escape=True), r"ApprovalOptions\(shell_cmds=True\)"),
        (lambda: OutputOptions(max_image_bytes=0), "max_image_bytes takes a positive number of bytes"),
        (lambda: ToolOptions(package_roots="tools"), r"pass package_roots=\[\.\.\.\]"),  # type: ignore[arg-type]
    ],
)
def test_options_that_cannot_work_together_are_refused_when_made(make: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def test_what_a_workspace_executor_does_with_asks_can_still_be_set_after_construction(tmp_path: Path) -> None:
    # The MCP server's sessions set it so; new code passes WorkspaceOptions(answers=...).
    executor = CodeExecutor(workspace=tmp_path)
    executor._ask_answers = "none"
    assert isinstance(executor.backend, WorkspaceBackend)
    assert executor.backend.answers == "none"
    assert (
        CodeExecutor(options=WorkspaceOptions(tmp_path, answers="elicitation"))._ask_answers == "elicitation"
    )
