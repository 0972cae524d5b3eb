"""Attacks on what the host reads later: files a kernel plants, rewrites or reads after the host made them.

Each test is an attacker's attempt from agent code in a sandboxed kernel (issue classes 1-7 in the
README's threat model). The workspace lies outside `/tmp`, so its parents are host directories a kernel
could otherwise see, and starts with none of the files the host or a developer's tools act on.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ipybox import CodeExecutionError, CodeExecutor
from ipybox.paths import user_policy_path, user_state_dir
from tests.sandbox.conftest import OUTSIDE_PARENT

pytestmark = pytest.mark.integration

ADMIN_POLICY = '[[approval.rules]]\nid = "no-shell"\nserver = "shell"\ndecision = "deny"\n'


def attempt(action: str) -> str:
    """Code that prints `ok: <result>` when `action` (an expression) works, else `denied: <error type>`."""
    return f"try:\n    print('ok:', {action})\nexcept Exception as e:\n    print('denied:', type(e).__name__)"


@dataclass
class Planted:
    executor: CodeExecutor
    parent: Path  # a host directory above the workspace
    workspace: Path
    state_dir: Path  # the host's ipybox state (server registry), inside the workspace here

    async def run(self, code: str) -> str:
        result = await self.executor.execute(code, timeout=60)
        return (result.text or "").strip()


@pytest.fixture(scope="module")
async def planted(monkeymodule: pytest.MonkeyPatch) -> AsyncIterator[Planted]:
    parent = Path(tempfile.mkdtemp(prefix="ipybox-host-reads-", dir=OUTSIDE_PARENT))
    workspace = parent / "ws"
    (workspace / "work").mkdir(parents=True)
    (workspace / "ipybox.toml").write_text("# the workspace's configuration\n")
    # The host's state directory inside the workspace, as when the workspace is the home directory.
    monkeymodule.setenv("XDG_STATE_HOME", str(workspace / "state"))
    state_dir = user_state_dir()
    state_dir.mkdir(parents=True)
    (state_dir / "mcp_servers.json").write_text("{}")
    # The admin policy's user tier inside the workspace too (its ~/.config, the workspace being the home).
    monkeymodule.setenv("XDG_CONFIG_HOME", str(workspace / "config"))
    user_policy_path().parent.mkdir(parents=True)
    user_policy_path().write_text(ADMIN_POLICY)
    try:
        async with CodeExecutor(working_dir=workspace, sandbox=True) as executor:
            yield Planted(executor, parent, workspace, state_dir)
    finally:
        shutil.rmtree(parent)


# -- class 1 and 4: names the host acts on can't be created


@pytest.mark.parametrize(
    "name",
    [
        ".env",  # IPYBOX_* settings: servers to start, approval default
        ".env.local",
        ".envrc",  # direnv
        ".mcp.json",  # Claude Code's project MCP servers
        "ipybox.lock",
        ".gitmodules",
        ".pre-commit-config.yaml",
    ],
)
async def test_a_kernel_cannot_plant_a_file_the_host_reads(planted: Planted, name: str) -> None:
    out = await planted.run(attempt(f"open({name!r}, 'w').write('IPYBOX_APPROVAL__DEFAULT=allow')"))
    assert out == "denied: OSError"
    assert not (planted.workspace / name).exists()


@pytest.mark.parametrize(
    "path", [".git/config", ".git/hooks/pre-commit", ".ipybox/state.json", ".vscode/tasks.json", ".claude/x"]
)
async def test_a_kernel_cannot_plant_a_directory_the_host_reads(planted: Planted, path: str) -> None:
    code = f"import os\nos.makedirs(os.path.dirname({path!r}))\nopen({path!r}, 'w').write('x')"
    out = await planted.run(attempt(f"exec({code!r})"))
    assert out == "denied: OSError"
    assert not (planted.workspace / path.split("/")[0]).exists()


async def test_a_kernel_cannot_plant_symlinks_in_ipybox_state(planted: Planted) -> None:
    out = await planted.run(attempt("__import__('os').symlink('/etc/passwd', '.ipybox')"))
    assert out == "denied: OSError"
    assert not os.path.lexists(planted.workspace / ".ipybox")


# -- class 2: a file the host replaced by rename stays read-only


async def test_ipybox_toml_replaced_by_rename_stays_read_only(planted: Planted) -> None:
    toml = planted.workspace / "ipybox.toml"
    assert await planted.run(attempt("open('ipybox.toml', 'a')")) == "denied: OSError"
    new = planted.workspace / "ipybox.toml.new"
    new.write_text("# saved by an editor, by rename\n")
    os.replace(new, toml)  # what register_mcp_server, `sed -i` and many editors do
    out = await planted.run(attempt("open('ipybox.toml', 'a').write('[servers.evil]')"))
    assert out == "denied: OSError"
    out = await planted.run(attempt("__import__('os').replace('work', 'ipybox.toml')"))
    assert out == "denied: OSError"
    assert toml.read_text() == "# saved by an editor, by rename\n"


# -- class 5: secrets created or rotated after the kernel started stay hidden


async def test_a_dotenv_created_after_the_kernel_started_is_hidden(planted: Planted) -> None:
    env = planted.workspace / ".env"
    try:
        env.write_text("API_KEY=created-later\n")
        assert await planted.run(attempt("open('.env').read()")) == "denied: FileNotFoundError"
        assert "created-later" not in await planted.run(attempt("__import__('os').listdir('.')"))
        # The spare kernel a reset swaps in was started before the file existed too.
        await planted.executor.reset()
        assert await planted.run(attempt("open('.env').read()")) == "denied: FileNotFoundError"
    finally:
        env.unlink()


async def test_a_parents_dotenv_created_or_rotated_later_is_hidden(planted: Planted) -> None:
    env = planted.parent / ".env"
    try:
        env.write_text("API_KEY=parent-created-later\n")
        out = await planted.run(attempt(f"open({str(env)!r}).read()"))
        assert out == "denied: FileNotFoundError"
        rotated = planted.parent / ".env.next"
        rotated.write_text("API_KEY=parent-rotated\n")
        os.replace(rotated, env)
        out = await planted.run(attempt(f"open({str(env)!r}).read()"))
        assert "parent-rotated" not in out and out.startswith("denied")
    finally:
        env.unlink()


# -- class 6: the host's server registry


async def test_a_kernel_cannot_write_the_hosts_server_registry(planted: Planted) -> None:
    registry = planted.state_dir / "mcp_servers.json"
    entry = json.dumps({str(planted.workspace / "mcptools"): {"evil": {"command": "sh"}}})
    out = await planted.run(attempt(f"open({str(registry)!r}, 'w').write({entry!r})"))
    assert out == "denied: OSError"
    out = await planted.run(attempt(f"open({str(planted.state_dir / 'other.json')!r}, 'w')"))
    assert out == "denied: OSError"
    assert registry.read_text() == "{}"


async def test_a_kernel_cannot_loosen_the_users_admin_policy_or_plant_one(planted: Planted) -> None:
    policy = user_policy_path()
    out = await planted.run(attempt(f"open({str(policy)!r}, 'w').write('')"))
    assert out == "denied: OSError"
    out = await planted.run(attempt(f"__import__('os').rename({str(policy)!r}, {str(policy)!r} + '.old')"))
    assert out == "denied: OSError"
    out = await planted.run(attempt(f"open({str(policy.parent / 'other.toml')!r}, 'w')"))
    assert out == "denied: OSError"
    assert policy.read_text() == ADMIN_POLICY


async def test_a_kernel_cannot_rewrite_the_tool_pins(planted: Planted) -> None:
    out = await planted.run(attempt("open('ipybox.lock', 'w').write('[servers]')"))
    assert out == "denied: OSError"
    assert not (planted.workspace / "ipybox.lock").exists()


# -- class 7: the generated packages and their marker


async def test_a_kernel_cannot_replace_or_write_the_generated_packages(planted: Planted) -> None:
    assert (planted.workspace / "mcptools").is_dir()  # made before the kernels started
    out = await planted.run(attempt("__import__('os').rename('mcptools', 'work/mcptools')"))
    assert out == "denied: OSError"
    marker = "mcptools/.ipybox-generation"
    out = await planted.run(attempt(f"open({marker!r}, 'w').write('{{\"servers\": [\"../../.env\"]}}')"))
    assert out == "denied: OSError"
    assert not (planted.workspace / marker).exists()


# -- what stays possible


async def test_below_the_top_level_the_workspace_is_the_kernels(planted: Planted) -> None:
    code = "import os\nos.makedirs('work/a/b')\nopen('work/a/b/c.txt', 'w').write('c')\nos.rename('work/a', 'work/z')"
    await planted.run(code)
    assert (planted.workspace / "work" / "z" / "b" / "c.txt").read_text() == "c"


# -- class 3: other kernels of the same gateway


async def test_a_kernel_sees_and_reaches_no_other_kernel(planted: Planted) -> None:
    gateway = planted.executor.kernel_gateway
    assert gateway is not None and gateway._runtime_dir is not None
    runtime = gateway._runtime_dir / "runtime"
    listing = "import glob, json\nprint(json.dumps(sorted(glob.glob('/tmp/ipybox-gateway-*/{}/*'))))"
    own = json.loads(await planted.run(listing.format("runtime")))
    assert len(own) == 1 and own[0].endswith(".json")  # its own connection file, nothing else
    assert len(json.loads(await planted.run(listing.format("ipc")))) == 1  # its own socket directory
    for _ in range(100):  # the spare kernel, started in the background
        others = [path for path in runtime.glob("kernel-*.json") if str(path) not in own]
        if others:
            break
        await asyncio.sleep(0.1)
    assert others, "no spare kernel to attack"
    assert await planted.run(attempt(f"open({str(others[0])!r}).read()")) == "denied: FileNotFoundError"
    # Even with the other kernel's key and socket names (handed over by the host), it is out of reach.
    code = (
        "import json\nfrom jupyter_client import BlockingKernelClient\nc = BlockingKernelClient()\n"
        f"c.load_connection_info(json.loads({others[0].read_text()!r}))\nc.start_channels()\n"
        "try:\n    c.wait_for_ready(timeout=3)\n    print('reached')\nexcept RuntimeError:\n    print('unreachable')"
    )
    assert await planted.run(code) == "unreachable"


async def test_a_refused_top_level_write_says_why_and_what_works(planted: Planted) -> None:
    with pytest.raises(CodeExecutionError) as caught:
        await planted.executor.execute("df_csv = open('report.csv', 'w')")
    assert caught.value.ename == "OSError"
    assert "write new files into a subdirectory" in str(caught.value)
    with pytest.raises(CodeExecutionError) as caught:
        await planted.executor.execute("open('/etc/ipybox-probe', 'w')")
    assert "ipybox sandbox" not in str(caught.value)  # other refusals are shown as they are


async def test_a_workspaces_state_and_tokens_are_hidden(tmp_path: Path) -> None:
    state = tmp_path / ".ipybox"
    state.mkdir()
    (state / "state.json").write_text('{"control_token": "secret-token"}')
    (state / "mcp_token").write_text("the-http-endpoints-bearer-token\n")  # `ipybox.running.mcp_token`
    async with CodeExecutor(working_dir=tmp_path, sandbox=True, spare_kernel=False) as executor:
        result = await executor.execute(attempt("open('.ipybox/state.json').read()"))
        assert (result.text or "").strip() == "denied: FileNotFoundError"
        # The endpoint's token can be neither read nor replaced (a kernel's own token would let it in).
        for action in ("open('.ipybox/mcp_token').read()", "open('.ipybox/mcp_token', 'w').write('mine')"):
            result = await executor.execute(attempt(action))
            assert (result.text or "").strip().startswith("denied: "), action
    assert (state / "mcp_token").read_text() == "the-http-endpoints-bearer-token\n"
