"""The kernel builder shared by `CodeExecutor`'s embedded gateway and `ipybox up`: what kernels get from each
caller's description (unit tests: no gateway, no kernel)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ipybox.config import load_config
from ipybox.executor.kernel_setup import (
    KernelSetup,
    embedded_kernel_setup,
    start_kernel_gateway,
    workspace_kernel_setup,
)
from ipybox.in_kernel.mcptools_refresh import MCPTOOLS_DIR_ENV
from ipybox.in_kernel.shell_approval import SHELL_APPROVAL_ENV
from ipybox.in_kernel.tool_runner import SERVER_ENV, TOKEN_ENV
from ipybox.in_kernel.working_dir import CWD_RESET_ENV
from ipybox.sandbox import SandboxPolicy

TOOLS = "unix:/run/ipybox-test/tools.calls.sock"


def _workspace(tmp_path: Path, toml: str, dotenv: str = "") -> Path:
    (tmp_path / "ipybox.toml").write_text(toml)
    if dotenv:
        (tmp_path / ".env").write_text(dotenv)
    return tmp_path


def _setups(workspace: Path, kernel_env: dict[str, str]) -> tuple[KernelSetup, KernelSetup]:
    """What the supervisor and an embedded executor describe for the same workspace directory."""
    config = load_config(workspace / "ipybox.toml")
    supervisor = workspace_kernel_setup(config, workspace, workspace / ".ipybox")
    embedded = embedded_kernel_setup(
        workspace,
        kernel_env,
        sandbox=SandboxPolicy() if config.sandbox.enabled else None,
        mcptools_dir=workspace / "mcptools",
    )
    return supervisor, embedded


def test_the_same_kernel_env_gives_both_callers_the_same_environment(tmp_path: Path) -> None:
    workspace = _workspace(tmp_path, '[kernel]\nenv = { API_BASE = "http://localhost:8000" }\n')
    supervisor, embedded = _setups(workspace, {"API_BASE": "http://localhost:8000"})
    environ = {"HOME": "/home/x", "SECRET": "host-only"}
    # The workspace's kernels also learn where their packages are, to re-import regenerated ones.
    assert supervisor.kernel_env(TOOLS, environ=environ) == {
        **embedded.kernel_env(TOOLS, environ=environ),
        MCPTOOLS_DIR_ENV: str(workspace / "mcptools"),
    }
    assert embedded.kernel_env(TOOLS, "call-token", environ=environ) == {
        "API_BASE": "http://localhost:8000",
        SERVER_ENV: TOOLS,
        TOKEN_ENV: "call-token",
    }


@pytest.mark.integration
def test_the_same_policy_gives_both_callers_the_same_kernelspec(tmp_path: Path) -> None:
    workspace = _workspace(tmp_path, "[sandbox]\nenabled = true\n")
    supervisor, _ = _setups(workspace, {})
    assert supervisor.sandbox is not None
    # The workspace hides its state directory; given that policy, the embedded description builds the same.
    assert str(workspace / ".ipybox") in supervisor.sandbox.filesystem.deny_read
    embedded = embedded_kernel_setup(
        workspace,
        {},
        sandbox=supervisor.sandbox,
        mcptools_dir=workspace / "mcptools",
        limits=supervisor.limits,
    )
    assert supervisor.kernel_spec(TOOLS) == embedded.kernel_spec(TOOLS)
    assert supervisor.kernel_spec(TOOLS) is not None


def test_an_unsandboxed_setup_keeps_the_default_kernelspec(tmp_path: Path) -> None:
    supervisor, embedded = _setups(_workspace(tmp_path, "[sandbox]\nenabled = false\n"), {})
    assert supervisor.kernel_spec(TOOLS) is None
    assert embedded.kernel_spec(TOOLS) is None


def test_a_workspace_fills_placeholders_and_an_embedded_executor_takes_values_literally(
    tmp_path: Path,
) -> None:
    workspace = _workspace(
        tmp_path,
        '[kernel]\nenv = { TOKEN = "${API_TOKEN}", BASE = "${API_BASE}" }\n',
        "API_BASE=from-dotenv\n",
    )
    supervisor, embedded = _setups(workspace, {"TOKEN": "${API_TOKEN}"})
    environ = {"API_TOKEN": "from-environ"}
    assert supervisor.kernel_env(TOOLS, environ=environ)["TOKEN"] == "from-environ"
    assert supervisor.kernel_env(TOOLS, environ=environ)["BASE"] == "from-dotenv"
    assert embedded.kernel_env(TOOLS, environ=environ)["TOKEN"] == "${API_TOKEN}"


def test_kernel_env_prefixed_variables_reach_workspace_kernels_only(tmp_path: Path) -> None:
    workspace = _workspace(
        tmp_path, "", "KERNEL_ENV_FROM_DOTENV=a\nKERNEL_ENV_BOTH=dotenv\nKERNEL_ENV_EMPTY=\nOTHER=b\n"
    )
    supervisor, embedded = _setups(workspace, {})
    environ = {"KERNEL_ENV_BOTH": "environ", "KERNEL_ENV_FROM_ENVIRON": "c", "SECRET": "s"}
    env = supervisor.kernel_env(TOOLS, environ=environ)
    assert {k: v for k, v in env.items() if k not in (SERVER_ENV, MCPTOOLS_DIR_ENV)} == {
        "FROM_DOTENV": "a",
        "BOTH": "environ",
        "FROM_ENVIRON": "c",
    }
    assert embedded.kernel_env(TOOLS, environ=environ) == {SERVER_ENV: TOOLS}


def test_kernel_env_beats_a_prefixed_variable_and_the_tool_variables_beat_both(tmp_path: Path) -> None:
    setup = KernelSetup(
        working_dir=tmp_path,
        env={"X": "from-env", SERVER_ENV: "unix:/elsewhere.sock"},
        prefixed_env=True,
    )
    env = setup.kernel_env(TOOLS, environ={"KERNEL_ENV_X": "prefixed", f"KERNEL_ENV_{TOKEN_ENV}": "forged"})
    assert env == {"X": "from-env", SERVER_ENV: TOOLS}
    # A call token for all kernels, when given, is the tool server's.
    assert setup.kernel_env(TOOLS, "real", environ={f"KERNEL_ENV_{TOKEN_ENV}": "forged"})[TOKEN_ENV] == "real"


def test_a_missing_placeholder_variable_fails_before_any_process_starts(tmp_path: Path) -> None:
    setup = KernelSetup(
        working_dir=tmp_path, env={"TOKEN": "${IPYBOX_TEST_UNSET_VARIABLE}"}, resolve_placeholders=True
    )
    with pytest.raises(ValueError, match="IPYBOX_TEST_UNSET_VARIABLE"):
        setup.kernel_env(TOOLS, environ={})


async def test_starting_a_gateway_with_a_missing_placeholder_starts_nothing(tmp_path: Path) -> None:
    import psutil

    before = set(psutil.Process().children(recursive=True))
    setup = KernelSetup(
        working_dir=tmp_path, env={"TOKEN": "${IPYBOX_TEST_UNSET_VARIABLE}"}, resolve_placeholders=True
    )
    with pytest.raises(ValueError, match="IPYBOX_TEST_UNSET_VARIABLE"):
        await start_kernel_gateway(setup, TOOLS)
    assert set(psutil.Process().children(recursive=True)) == before


def test_a_sandboxed_setup_refuses_a_tool_server_on_tcp(tmp_path: Path) -> None:
    setup = KernelSetup(working_dir=tmp_path, sandbox=SandboxPolicy())
    with pytest.raises(ValueError, match="Unix socket only"):
        setup.kernel_spec("tcp://127.0.0.1:8900")


def test_a_sandboxed_setup_makes_its_package_directory_before_kernels_start(tmp_path: Path) -> None:
    KernelSetup(working_dir=tmp_path, mcptools_dir=tmp_path / "mcptools").prepare_dirs()
    assert not (tmp_path / "mcptools").exists()  # unsandboxed kernels see it whenever it appears
    KernelSetup(
        working_dir=tmp_path, sandbox=SandboxPolicy(), mcptools_dir=tmp_path / "mcptools"
    ).prepare_dirs()
    assert (tmp_path / "mcptools").is_dir()


def test_only_a_policy_with_allowed_domains_needs_the_proxy(tmp_path: Path) -> None:
    allowing = SandboxPolicy.model_validate({"network": {"allowedDomains": ["pypi.org"]}})
    assert KernelSetup(working_dir=tmp_path, sandbox=allowing).needs_proxy
    assert not KernelSetup(working_dir=tmp_path, sandbox=SandboxPolicy()).needs_proxy
    assert not KernelSetup(working_dir=tmp_path).needs_proxy


def test_no_configured_variable_can_turn_shell_approval_off_or_fake_a_working_dir(tmp_path: Path) -> None:
    # `[kernel] env` (or a `KERNEL_ENV_` variable of `.env`) is what a workspace's files say: it must not
    # decide whether kernels ask before shell commands run.
    planted = {SHELL_APPROVAL_ENV: "", CWD_RESET_ENV: "/"}
    asking = KernelSetup(working_dir=tmp_path, env=planted, approve_shell=True, reset_cwd=True)
    env = asking.kernel_env("unix:/tools.sock")
    assert env[SHELL_APPROVAL_ENV] == "ask"
    assert env[CWD_RESET_ENV] == str(tmp_path)
    off = KernelSetup(working_dir=tmp_path, env=planted).kernel_env("unix:/tools.sock")
    assert SHELL_APPROVAL_ENV not in off and CWD_RESET_ENV not in off
    escape = KernelSetup(working_dir=tmp_path, approve_shell=True, require_shell_escape=True)
    assert escape.kernel_env("unix:/tools.sock")[SHELL_APPROVAL_ENV] == "escape"


def test_a_workspace_limits_its_kernels_by_default_and_an_embedded_executor_does_not(tmp_path: Path) -> None:
    supervisor, embedded = _setups(_workspace(tmp_path, "[sandbox]\nenabled = true\n"), {})
    assert supervisor.limits.set_limits() == {
        "memory": 4 * 1024**3,
        "processes": 256,
        "open_files": 4096,
        "tmp": 1024**3,
    }
    assert supervisor.limits_source == "[kernel.limits]"
    assert not embedded.limits.any


def test_an_unsandboxed_workspace_drops_the_default_tmp_size_and_keeps_the_rest(tmp_path: Path) -> None:
    toml = '[sandbox]\nenabled = false\n[kernel.limits]\nmemory = "2GiB"\n'
    supervisor, _ = _setups(_workspace(tmp_path, toml), {})
    assert supervisor.limits.tmp is None and supervisor.limits.memory == 2 * 1024**3
    assert supervisor.limits.processes == 256


def test_a_sandboxed_workspace_sizes_its_kernels_private_tmp(tmp_path: Path) -> None:
    supervisor, _ = _setups(
        _workspace(tmp_path, '[sandbox]\nenabled = true\n[kernel.limits]\ntmp = "64MiB"\n'), {}
    )
    spec = supervisor.kernel_spec(TOOLS)
    assert spec is not None and spec.sandboxed
    assert str(64 * 1024**2) in next(iter(spec.resources.values()))  # the launch plan's tmpfs size


SECRET_WORKSPACE = (
    '[sandbox]\nenabled = true\n\n[sandbox.network]\nallowedDomains = ["api.example.com"]\n\n'
    '[secrets.demo]\nvalue = "${DEMO_TOKEN}"\nenv = "DEMO_TOKEN"\nhosts = ["api.example.com"]\n'
)


def test_a_workspace_with_secrets_intercepts_and_kernels_get_placeholders_and_the_trust_bundle(
    tmp_path: Path,
) -> None:
    from ipybox.config.secrets import resolve_secrets

    workspace = _workspace(
        tmp_path, SECRET_WORKSPACE, "DEMO_TOKEN=the-real-value-123\nKERNEL_ENV_DEMO_TOKEN=x\n"
    )
    config = load_config(workspace / "ipybox.toml")
    resolved = resolve_secrets(config.secrets, environ={}, dotenv_path=workspace / ".env")
    trust_dir = tmp_path / "run" / "trust"
    setup = workspace_kernel_setup(
        config, workspace, workspace / ".ipybox", secrets=resolved, trust_dir=trust_dir
    )
    assert setup.intercepts and setup.interception_hosts == ["api.example.com"]
    interception = setup.interception()
    assert interception is not None
    # The CA's key stays in the state directory; kernels read the bundle and the CA only.
    assert (workspace / ".ipybox" / "interception" / "ca-key.pem").is_file()
    assert sorted(p.name for p in trust_dir.iterdir()) == ["ca-bundle.pem", "interception-ca.pem"]
    assert "the-real-value-123" not in "".join(p.read_text() for p in trust_dir.iterdir())
    [route] = interception.routes
    assert (route.name, route.value, route.hosts) == ("demo", "the-real-value-123", ("api.example.com",))
    env = setup.kernel_env(TOOLS, environ={}, interception=interception.env)
    # The placeholder wins over a KERNEL_ENV_ variable of the same name; the value is nowhere.
    assert env["DEMO_TOKEN"] == resolved["demo"].placeholder
    assert env["SSL_CERT_FILE"] == str(trust_dir / "ca-bundle.pem")
    assert env["NODE_EXTRA_CA_CERTS"] == str(trust_dir / "interception-ca.pem")
    assert "the-real-value-123" not in repr(setup) and "the-real-value-123" not in str(env)


def test_without_a_trust_dir_or_a_sandbox_nothing_is_intercepted(tmp_path: Path) -> None:
    from ipybox.config.secrets import resolve_secrets

    workspace = _workspace(tmp_path, SECRET_WORKSPACE, "DEMO_TOKEN=the-real-value-123\n")
    config = load_config(workspace / "ipybox.toml")
    resolved = resolve_secrets(config.secrets, environ={}, dotenv_path=workspace / ".env")
    setup = workspace_kernel_setup(config, workspace, workspace / ".ipybox", secrets=resolved)
    assert not setup.intercepts and setup.interception() is None
    assert not (workspace / ".ipybox").exists()
