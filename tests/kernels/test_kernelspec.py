"""The gateway's kernelspec, plain and sandboxed: what the sandbox describes, in the gateway's format.

Pure logic: the sandbox's availability check is replaced, so nothing here starts bubblewrap or
`sandbox-exec`.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from ipybox.kernels.kernelspec import RUNTIME_DIR, KernelSpec, default_kernel_argv, sandboxed_kernel_spec
from ipybox.sandbox import SandboxPolicy, SandboxUnavailableError, bwrap, seatbelt
from ipybox.sandbox.launch import PLAN_FILE

RUNTIME = Path("/var/folders/xy/T/ipybox-gateway-1")


def written(spec: KernelSpec, data_dir: Path) -> tuple[Path, dict[str, object]]:
    spec_dir = spec.write(data_dir, runtime_dir=RUNTIME)
    return spec_dir, json.loads((spec_dir / "kernel.json").read_text())


def test_a_plain_kernelspec_runs_ipybox_s_kernel_on_this_interpreter(tmp_path: Path) -> None:
    _, kernel_json = written(KernelSpec(), tmp_path)
    assert kernel_json["argv"] == default_kernel_argv()
    assert kernel_json["interrupt_mode"] == "signal"


def test_a_sandboxed_kernelspec_on_linux_starts_the_kernel_through_the_launcher(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(platform, "system", lambda: "Linux")
    monkeypatch.setattr(bwrap, "check_sandbox", lambda: "/usr/bin/bwrap")
    spec = sandboxed_kernel_spec(SandboxPolicy(), tmp_path)
    spec_dir, kernel_json = written(spec, tmp_path / "data")
    assert kernel_json["argv"] == [
        sys.executable,
        "-P",
        "-m",
        "ipybox.sandbox.launch",
        f"{{resource_dir}}/{PLAN_FILE}",
        "{connection_file}",
        "--",
        *default_kernel_argv(),
    ]
    # bubblewrap forks the kernel: SIGINT would reach bwrap, so interrupts go as messages.
    assert kernel_json["interrupt_mode"] == "message"
    assert kernel_json["display_name"] == "Python 3 (ipybox, sandboxed)"
    plan = json.loads((spec_dir / PLAN_FILE).read_text())
    assert plan["bwrap"] == "/usr/bin/bwrap"


def test_a_sandboxed_kernelspec_on_macos_confines_the_kernel_to_the_gateway_s_runtime_dirs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(platform, "system", lambda: "Darwin")
    monkeypatch.setattr(seatbelt, "check_seatbelt", lambda: seatbelt.SANDBOX_EXEC)
    tools = tmp_path / "tools"
    spec = sandboxed_kernel_spec(SandboxPolicy(), tmp_path, tool_socket=tools / "t.calls.sock")
    assert spec.interrupt_mode == "signal"  # sandbox-exec and its launcher exec: the kernel has the pid
    profile = spec.argv[spec.argv.index("-p") + 1]
    # The runtime dir is known when the gateway writes the kernelspec: the profile names it by a
    # parameter, and its ipc and temp dirs (where the gateway puts kernel sockets) are writable.
    assert RUNTIME_DIR not in profile
    assert '(subpath (string-append (param "IPYBOX_RUNTIME_DIR") "/ipc"))' in profile
    assert '(subpath (string-append (param "IPYBOX_RUNTIME_DIR") "/tmp"))' in profile
    _, kernel_json = written(spec, tmp_path / "data")
    argv = kernel_json["argv"]
    assert isinstance(argv, list)
    assert argv[:3] == [seatbelt.SANDBOX_EXEC, "-D", f"IPYBOX_RUNTIME_DIR={RUNTIME}"]
    assert argv[argv.index("ipybox-sandbox") + 1] == f"{RUNTIME}/tmp"
    assert argv[-len(default_kernel_argv()) :] == default_kernel_argv()


def test_a_sandboxed_kernelspec_fails_closed_where_there_is_no_sandbox(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(platform, "system", lambda: "Windows")
    with pytest.raises(SandboxUnavailableError, match="this is Windows"):
        sandboxed_kernel_spec(SandboxPolicy(), tmp_path)


@pytest.mark.integration
def test_importing_the_kernelspec_does_not_import_the_sandbox() -> None:
    # A gateway without a sandbox must not pay for the sandbox's imports (pydantic among them).
    code = "import sys, ipybox.kernels.kernelspec; print(sorted(m for m in sys.modules if 'sandbox' in m))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
