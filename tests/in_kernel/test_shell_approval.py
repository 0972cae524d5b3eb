"""Shell commands in the kernel ask the application first (`approve_shell_cmds=True`), and with
`require_shell_escape=True` nothing starts a process but the `!` form: the `shell_approval` extension that
`kernel_main` loads, run through real `CodeExecutor`s and real kernels."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ipybox import (
    ApprovalRequest,
    CodeExecutionError,
    CodeExecutionResult,
    CodeExecutor,
    generate_mcp_sources,
)
from ipybox.in_kernel import shell_approval
from tests.servers import params

pytestmark = pytest.mark.integration

Request = tuple[str, str, dict[str, Any]]


async def decide(
    executor: CodeExecutor, code: str, accept: bool | None = True
) -> tuple[list[Request], CodeExecutionResult | CodeExecutionError]:
    """Run `code` with `stream()`, answering each approval request (`None`: leave it unanswered); return the
    requests as (server, tool, args) and the result, or the error the code raised."""
    requests: list[Request] = []
    try:
        async for item in executor.stream(code, timeout=30):
            if isinstance(item, ApprovalRequest):
                requests.append((item.server_name, item.tool_name, item.tool_args))
                if accept is not None:
                    await (item.accept() if accept else item.reject())
            elif isinstance(item, CodeExecutionResult):
                return requests, item
    except CodeExecutionError as e:
        return requests, e
    raise AssertionError("stream() ended without a result")


def text(outcome: CodeExecutionResult | CodeExecutionError) -> str:
    assert isinstance(outcome, CodeExecutionResult), f"the code failed: {outcome}"
    return outcome.text or ""


def error(outcome: CodeExecutionResult | CodeExecutionError) -> CodeExecutionError:
    assert isinstance(outcome, CodeExecutionError), f"the code did not fail: {outcome.text!r}"
    return outcome


@pytest.fixture(scope="module")
async def asking(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[CodeExecutor]:
    workspace = tmp_path_factory.mktemp("shell-approval")
    async with CodeExecutor(working_dir=workspace, approve_shell_cmds=True, spare_kernel=False) as executor:
        yield executor


@pytest.fixture(scope="module")
async def escaping(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[CodeExecutor]:
    workspace = tmp_path_factory.mktemp("shell-escape")
    async with CodeExecutor(
        working_dir=workspace, approve_shell_cmds=True, require_shell_escape=True, spare_kernel=False
    ) as executor:
        yield executor


# --- approve_shell_cmds=True


async def test_an_accepted_command_runs_after_the_approver_saw_it(asking: CodeExecutor) -> None:
    requests, outcome = await decide(asking, "!echo approved")
    assert requests == [("ipybox", "shell", {"cmd": "echo approved"})]
    assert text(outcome) == "approved"


async def test_a_rejected_command_never_runs_and_raises_in_the_cell(asking: CodeExecutor) -> None:
    target = asking.working_dir / "rejected.txt"
    requests, outcome = await decide(asking, f"!touch {target}", accept=False)
    assert requests == [("ipybox", "shell", {"cmd": f"touch {target}"})]
    assert error(outcome).ename == "ApprovalRejectedError"
    assert not target.exists()


async def test_a_command_nobody_decides_on_times_out_and_never_runs(tmp_path: Path) -> None:
    target = tmp_path / "undecided.txt"
    async with CodeExecutor(
        working_dir=tmp_path, approve_shell_cmds=True, approval_timeout=0.5, spare_kernel=False
    ) as executor:
        requests, outcome = await decide(executor, f"!touch {target}", accept=None)
    assert requests == [("ipybox", "shell", {"cmd": f"touch {target}"})]
    assert error(outcome).ename == "ApprovalTimeoutError"
    assert not target.exists()


@pytest.mark.parametrize("magic", ["bash", "sh"])
async def test_bash_and_sh_cells_ask_with_the_cell_as_ipybox_0_9_did(
    asking: CodeExecutor, magic: str
) -> None:
    requests, outcome = await decide(asking, f"%%{magic}\necho from {magic}\n")
    assert requests == [("ipybox", "shell_magic", {"cmd": f"echo from {magic}\n"})]
    assert text(outcome) == f"from {magic}"


async def test_a_rejected_bash_cell_never_runs(asking: CodeExecutor) -> None:
    target = asking.working_dir / "rejected-bash.txt"
    _, outcome = await decide(asking, f"%%bash\ntouch {target}\n", accept=False)
    assert error(outcome).ename == "ApprovalRejectedError"
    assert not target.exists()


@pytest.mark.parametrize(
    ("first_line", "magic"), [("%%python3", "python3"), ("%%script bash", "script bash"), ("%%perl", "perl")]
)
async def test_other_script_magics_also_say_which_program_gets_the_cell(
    asking: CodeExecutor, first_line: str, magic: str
) -> None:
    cell = "print 'x'\n" if magic == "perl" else "echo x\n" if magic == "script bash" else "print('x')\n"
    requests, outcome = await decide(asking, f"{first_line}\n{cell}", accept=False)
    assert requests == [("ipybox", "shell_magic", {"cmd": cell, "magic": magic})]
    assert error(outcome).ename == "ApprovalRejectedError"


async def test_captured_output_is_asked_about_and_assigned(asking: CodeExecutor) -> None:
    requests, outcome = await decide(asking, "lines = !echo a; echo b\nprint(lines)")
    assert requests == [("ipybox", "shell", {"cmd": "echo a; echo b"})]
    assert text(outcome) == "['a', 'b']"


async def test_double_bang_is_asked_about(asking: CodeExecutor) -> None:
    requests, outcome = await decide(asking, "!!echo bang")
    assert requests == [("ipybox", "shell", {"cmd": "echo bang"})]
    assert text(outcome) == "['bang']"


async def test_the_approver_sees_braces_and_dollar_names_expanded(asking: CodeExecutor) -> None:
    requests, outcome = await decide(asking, "n = 3\n!echo {n * 2} $n")
    assert requests == [("ipybox", "shell", {"cmd": "echo 6 3"})]
    assert text(outcome) == "6 3"


async def test_a_function_s_locals_are_expanded(asking: CodeExecutor) -> None:
    requests, outcome = await decide(asking, "def f(a):\n    !echo local {a}\nf(42)")
    assert requests == [("ipybox", "shell", {"cmd": "echo local 42"})]
    assert text(outcome) == "local 42"


async def test_an_expression_in_a_command_is_evaluated_once(asking: CodeExecutor) -> None:
    code = "calls = []\ndef f():\n    calls.append(1)\n    return 'x'\n!echo {f()}\nprint(len(calls))"
    requests, outcome = await decide(asking, code)
    assert requests == [("ipybox", "shell", {"cmd": "echo x"})]
    assert text(outcome).splitlines() == ["x", "1"]


async def test_escaped_braces_and_dollars_run_as_the_approver_saw_them(asking: CodeExecutor) -> None:
    # IPython turns `{{x}}` into `{x}` and `$$x` into `$x`, once: the shell gets `echo {x} $x` (and `$x` is
    # an unset shell variable); a second expansion would run `echo 5 5`.
    requests, outcome = await decide(asking, "x = 5\n!echo {{x}} $$x")
    assert requests == [("ipybox", "shell", {"cmd": "echo {x} $x"})]
    assert text(outcome) == "{x}"


async def test_line_magics_still_expand_variables(asking: CodeExecutor) -> None:
    code = "v = 'abc'\n%set_env IPYBOX_SHELL_TEST={v}\nimport os\nprint(os.environ['IPYBOX_SHELL_TEST'])"
    requests, outcome = await decide(asking, code)
    assert requests == []
    assert text(outcome).splitlines()[-1] == "abc"


async def test_execute_approves_shell_commands(asking: CodeExecutor) -> None:
    assert (await asking.execute("!echo auto")).text == "auto"


async def test_a_rejected_command_s_traceback_shows_the_bang_line_and_no_ipybox_frames(
    asking: CodeExecutor,
) -> None:
    _, outcome = await decide(asking, "x = 1\n!rm -rf {x}-dir", accept=False)
    traceback = error(outcome).traceback
    assert "----> 2 !rm -rf {x}-dir" in traceback
    assert "get_ipython()" not in traceback
    assert "ipybox/in_kernel" not in traceback and "skipping hidden" not in traceback

    _, outcome = await decide(asking, "%%bash\nrm -rf nothing\n", accept=False)
    traceback = error(outcome).traceback
    assert "----> 1 %%bash" in traceback
    assert "ipybox/in_kernel" not in traceback and "run_cell_magic" not in traceback


# --- require_shell_escape=True

GUARDED = {
    "subprocess.run": "import subprocess\nsubprocess.run(['touch', {target!r}])",
    "subprocess.call": "import subprocess\nsubprocess.call(['touch', {target!r}])",
    "subprocess.check_output": "import subprocess\nsubprocess.check_output(['touch', {target!r}])",
    "subprocess.Popen": "from subprocess import Popen\nPopen(['touch', {target!r}]).wait()",
    "os.system": "import os\nos.system('touch {target}')",
    "os.popen": "import os\nos.popen('touch {target}').read()",
    "os.execv": "import os, shutil\nos.execv(shutil.which('touch'), ['touch', {target!r}])",
    "os.execvp": "import os\nos.execvp('touch', ['touch', {target!r}])",
    "os.execl": "import os, shutil\nos.execl(shutil.which('touch'), 'touch', {target!r})",
    "os.execlpe": "import os\nos.execlpe('touch', 'touch', {target!r}, dict(os.environ))",
    "os.spawnv": "import os, shutil\nos.spawnv(os.P_WAIT, shutil.which('touch'), ['touch', {target!r}])",
    "os.spawnlp": "import os\nos.spawnlp(os.P_WAIT, 'touch', 'touch', {target!r})",
    "os.posix_spawn": "import os, shutil\nos.waitpid(os.posix_spawn(shutil.which('touch'), ['touch', {target!r}], os.environ), 0)",
    "os.posix_spawnp": "import os\nos.waitpid(os.posix_spawnp('touch', ['touch', {target!r}], os.environ), 0)",
    "pty.spawn": "import pty\npty.spawn(['touch', {target!r}])",
}


@pytest.mark.parametrize("api", list(GUARDED))
async def test_starting_a_process_directly_raises_and_names_the_bang_form(
    escaping: CodeExecutor, api: str
) -> None:
    target = escaping.working_dir / f"direct-{api}.txt"
    with pytest.raises(CodeExecutionError) as caught:
        await escaping.execute(GUARDED[api].format(target=str(target)))
    assert caught.value.ename == "RuntimeError"
    # ipybox 0.9.2's text first (callers match on it), then how to ask.
    named = "subprocess" if api.startswith("subprocess") or api == "os.popen" else f"{api}()"
    assert caught.value.evalue.startswith(f"Direct {named} calls are not allowed. Use ! syntax.")
    assert "`!cmd`" in caught.value.evalue
    assert "ipybox/in_kernel" not in caught.value.traceback
    assert not target.exists()


async def test_approved_commands_still_start_processes(escaping: CodeExecutor) -> None:
    workspace = escaping.working_dir
    code = f"""
!touch {workspace / "bang.txt"}
lines = !echo captured
print(lines)
"""
    assert (await escaping.execute(code)).text == "['captured']"
    assert (await escaping.execute(f"%%bash\ntouch {workspace / 'bash.txt'}\necho done\n")).text == "done"
    assert (await escaping.execute("%%python3\nprint('py')\n")).text == "py"
    assert (workspace / "bang.txt").exists() and (workspace / "bash.txt").exists()


async def test_a_forked_child_that_starts_a_process_exits_instead_of_running_on(
    escaping: CodeExecutor,
) -> None:
    # Raising in the child would leave a second copy of the kernel running the cell's code.
    target = escaping.working_dir / "forked.txt"
    code = f"""
import os, shutil, warnings
warnings.simplefilter("ignore", DeprecationWarning)  # fork() in a process with threads
touch = shutil.which("touch")
pid = os.fork()
if pid == 0:
    os.execv(touch, ["touch", {str(target)!r}])
print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""
    lines = ((await escaping.execute(code)).text or "").splitlines()
    assert "127" in lines  # the child's exit status
    assert any(
        line.startswith("ipybox: Direct os.execv() calls are not allowed") for line in lines
    )  # its stderr
    assert not target.exists()


async def test_a_rejected_command_starts_nothing_in_escape_mode(escaping: CodeExecutor) -> None:
    target = escaping.working_dir / "escape-rejected.txt"
    _, outcome = await decide(escaping, f"!touch {target}", accept=False)
    assert error(outcome).ename == "ApprovalRejectedError"
    assert not target.exists()


# --- approve_tool_calls=False


async def test_without_tool_approval_tool_calls_run_unasked_while_shell_commands_ask(tmp_path: Path) -> None:
    await generate_mcp_sources("edge", params.edge(), tmp_path / "mcptools")
    async with CodeExecutor(
        working_dir=tmp_path,
        mcp_servers={"edge": params.edge()},
        approve_tool_calls=False,
        approve_shell_cmds=True,
        spare_kernel=False,
    ) as executor:
        code = "from mcptools.edge import echo\nprint(echo.run(echo.Params(text='tool')))\n!echo shell"
        requests, outcome = await decide(executor, code)
    assert requests == [("ipybox", "shell", {"cmd": "echo shell"})]
    assert text(outcome).splitlines() == ["tool", "shell"]


# --- loading


def test_a_kernel_whose_shell_approval_cannot_load_does_not_start(tmp_path: Path) -> None:
    env = {**os.environ, shell_approval.SHELL_APPROVAL_ENV: "bogus"}
    kernel = subprocess.run(
        [sys.executable, "-m", "ipybox.in_kernel.kernel_main", "-f", str(tmp_path / "kernel.json")],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,  # a guard against a kernel that started anyway; it exits in about a second
    )
    assert kernel.returncode != 0
    assert "shell approval mode must be one of ('ask', 'escape'), not 'bogus'" in kernel.stderr


@pytest.mark.parametrize("module", ["ipybox.in_kernel.tool_runner", "pty", "IPython.core.magics.script"])
def test_the_kernel_entry_point_imports_nothing_for_shell_approval_when_it_is_off(module: str) -> None:
    code = f"import sys, ipybox.in_kernel.kernel_main\nprint({module!r} in sys.modules)"
    imported = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert imported.stdout.strip() == "False"


def test_an_unknown_mode_is_refused_before_anything_is_hooked() -> None:
    with pytest.raises(ValueError, match="shell approval mode must be one of"):
        shell_approval.install(object(), "strict")
