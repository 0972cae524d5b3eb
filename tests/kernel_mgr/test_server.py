"""`ipybox.kernel_mgr.server.KernelGateway`, ipybox 0.9's gateway class: constructed with host and port as
0.9 documents, its token published for this user only while it runs, loopback only, and `sandbox=True`
running kernels in ipybox's sandbox (never unsandboxed)."""

from __future__ import annotations

import json
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

from ipybox.kernel_mgr.client import KernelClient
from ipybox.kernel_mgr.server import KernelGateway

pytestmark = pytest.mark.integration


def test_a_gateway_binds_loopback_only() -> None:
    with pytest.raises(ValueError, match="loopback only"):
        KernelGateway(host="0.0.0.0", port=8888)


async def test_the_token_is_published_for_this_user_while_the_gateway_runs() -> None:
    async with KernelGateway(host="localhost", port=0) as gateway:
        path = gateway.token_file
        assert path is not None and path.name == f"127.0.0.1-{gateway.port}.json"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        published = json.loads(path.read_text())
        assert published["token"] == gateway.endpoint.token and published["url"] == gateway.endpoint.url
        with pytest.raises(RuntimeError, match="already running"):
            await gateway.start()
    assert not path.exists()
    await gateway.stop()  # stopping again is harmless


async def test_join_returns_once_the_gateway_stopped() -> None:
    gateway = KernelGateway(port=0)
    await gateway.start()
    await gateway.stop()
    await gateway.join()  # not running: returns at once


async def test_a_sandboxed_gateway_runs_its_kernels_in_the_sandbox() -> None:
    # Outside /tmp, which the sandbox replaces with its own.
    workspace = Path(tempfile.mkdtemp(prefix="ipybox-kernel-mgr-", dir="/var/tmp"))
    outside = Path(tempfile.mkdtemp(prefix="ipybox-kernel-mgr-outside-", dir="/var/tmp"))
    secret = outside / "secret.txt"
    secret.write_text("hidden by the policy\n")
    (workspace / "out").mkdir()  # the sandbox keeps the top level as it was: new files go below it
    policy = workspace.parent / f"{workspace.name}-policy.json"
    policy.write_text(json.dumps({"filesystem": {"denyRead": [str(outside)]}}))
    try:
        async with (
            KernelGateway(port=0, working_dir=workspace, sandbox=True, sandbox_config=policy) as gateway,
            KernelClient(port=gateway.port) as client,
        ):
            code = f"""
import os, socket
print(os.getcwd())
for attempt in ("write", "read", "connect"):
    try:
        if attempt == "write":
            open({str(outside / "written")!r}, "w")
        elif attempt == "read":
            open({str(secret)!r}).read()
        else:
            socket.create_connection(("127.0.0.1", {gateway.port}), timeout=5)
        print(attempt, "allowed")
    except OSError:
        print(attempt, "refused")
_ = open("out/in-workspace.txt", "w").write("ok")
"""
            result = await client.execute(code, timeout=60)
        assert result.text == f"{workspace}\nwrite refused\nread refused\nconnect refused"
        assert (workspace / "out" / "in-workspace.txt").read_text() == "ok"
        assert not (outside / "written").exists()
    finally:
        policy.unlink(missing_ok=True)
        shutil.rmtree(workspace)
        shutil.rmtree(outside)


async def test_a_bad_sandbox_policy_fails_before_anything_starts(tmp_path: Path) -> None:
    policy = tmp_path / "policy.json"
    policy.write_text('{"filesystem": {"denyReed": []}}')
    gateway = KernelGateway(port=0, sandbox=True, sandbox_config=policy)
    with pytest.raises(ValueError, match="denyReed"):
        await gateway.start()
    assert gateway.token_file is None
