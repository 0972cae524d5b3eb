"""Which kernel a connection to the network proxy comes from (`ipybox.supervisor.proxy_clients`), and who
is asked about an unknown host because of it: a real `DomainProxy` on its Unix socket, the approver a
workspace wires (`LeaseTable`, `WorkspaceApprover.ask_host`), and real client processes: one started with
a leased kernel's tool token in its environment (as a sandboxed kernel's bridge is) has its ask put to
that lease's application; the test process itself, or a process with a token no lease holds, is asked of
the people only.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from ipybox.approval.asks import AskAnswer, AskBoard
from ipybox.approval.channel import ApprovalChannel
from ipybox.approval.request import ApprovalRequest
from ipybox.approval.rule_approver import WorkspaceApprover
from ipybox.in_kernel.call_protocol import TOKEN_ENV
from ipybox.rules import ApprovalPolicy, AuditLog
from ipybox.running.status import CallerId, CallerToken, KernelId
from ipybox.sandbox.proxy import DomainProxy
from ipybox.supervisor.leases import LeaseTable
from ipybox.supervisor.proxy_clients import caller_of_client, environ_token

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SO_PEERCRED and /proc: Linux")

# Connects to the proxy's socket, asks to CONNECT, prints the status line it gets back.
CLIENT = (
    "import socket, sys\n"
    "s = socket.socket(socket.AF_UNIX)\n"
    "s.connect(sys.argv[1])\n"
    "s.sendall(b'CONNECT localhost:9 HTTP/1.1\\r\\nHost: localhost:9\\r\\n\\r\\n')\n"
    "print(s.recv(4096).split(b'\\r\\n')[0].decode())\n"
)


class Workspace:
    """A lease holding caller k1 (token `KERNEL_TOKEN`), whose application answers through an in-process
    handler, and the proxy that asks the approver about unknown hosts."""

    KERNEL_TOKEN = "kernel-token-" + os.urandom(8).hex()

    def __init__(self, tmp_path: Path) -> None:
        self.leases = LeaseTable()
        self.leases.add_caller(CallerId("k1"), CallerToken(self.KERNEL_TOKEN))
        self.lease = self.leases.new_lease()
        self.leases.bind(self.lease, KernelId("kernel-1"), CallerId("k1"))
        self.requests: list[ApprovalRequest] = []
        self.leases.open_channel(self.lease, ApprovalChannel(True, 10, handler=self.accept))
        self.approver = WorkspaceApprover(
            ApprovalPolicy.model_validate({"ask": ["application", "console"], "ask_timeout": 10}),
            AuditLog(tmp_path / "audit.jsonl"),
            self.leases.answerer,
            board=AskBoard(),
            session_of=lambda caller: self.leases.lease_of(CallerId(caller)),
            caller_of_client=lambda pid: caller_of_client(self.leases, pid),
        )
        self.proxy = DomainProxy([], unknown="ask", ask=self.approver.ask_host)

    async def accept(self, request: ApprovalRequest) -> None:
        self.requests.append(request)
        await request.accept()

    async def connect(self, env: dict[str, str]) -> str:
        """A client process with `env` as its environment asks the proxy to CONNECT; the status line."""
        assert self.proxy.unix_socket is not None
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", CLIENT, str(self.proxy.unix_socket), env=env, stdout=asyncio.subprocess.PIPE
        )
        out, _ = await asyncio.wait_for(process.communicate(), 30)
        return out.decode().strip()


async def test_a_process_holding_a_leased_kernels_token_is_asked_of_that_leases_application(
    tmp_path: Path,
) -> None:
    workspace = Workspace(tmp_path)
    await workspace.proxy.start()
    try:
        status = await workspace.connect({**os.environ, TOKEN_ENV: Workspace.KERNEL_TOKEN})
        # Asked of the application, which accepted; the proxy then connects to localhost:9 (closed).
        assert [(r.server_name, r.tool_name, r.tool_args) for r in workspace.requests] == [
            ("ipybox", "network", {"host": "localhost", "port": 9, "method": "CONNECT"})
        ]
        assert status.startswith("HTTP/1.1 502"), status  # allowed: the proxy tried the port
    finally:
        await workspace.proxy.stop()


@pytest.mark.parametrize("token", [None, "a-token-no-kernel-was-given"], ids=["no token", "unknown token"])
async def test_a_connection_no_leased_kernel_makes_is_asked_of_the_people_only(
    tmp_path: Path, token: str | None
) -> None:
    workspace = Workspace(tmp_path)
    await workspace.proxy.start()
    env = {name: value for name, value in os.environ.items() if name != TOKEN_ENV}
    if token is not None:
        env[TOKEN_ENV] = token
    try:
        with workspace.approver.board.present("console"), workspace.approver.board.subscribe() as events:
            connecting = asyncio.ensure_future(workspace.connect(env))
            opened = await asyncio.wait_for(events.events.get(), 30)
            ask = opened.ask  # type: ignore[attr-defined]
            assert (ask.asked_of, ask.routes, ask.session, ask.call.caller) == (
                "console",
                ("console",),
                None,
                "",
            )
            why = await workspace.approver.answer(
                ask.id, AskAnswer(False, "once", "console", "console (test)")
            )
            assert why is None
            status = await connecting
        assert status.startswith("HTTP/1.1 403"), status
        assert workspace.requests == []  # the lease's application was never asked
    finally:
        await workspace.proxy.stop()


async def test_a_token_is_attributed_only_while_a_lease_holds_its_kernel(tmp_path: Path) -> None:
    workspace = Workspace(tmp_path)
    process = await asyncio.create_subprocess_exec(
        "sleep", "30", env={TOKEN_ENV: Workspace.KERNEL_TOKEN, "OTHER": "x"}
    )
    try:
        assert environ_token(process.pid) == Workspace.KERNEL_TOKEN
        assert caller_of_client(workspace.leases, process.pid) == "k1"
        assert caller_of_client(workspace.leases, os.getpid()) is None  # no token in its environment
        workspace.leases.unbind_kernels()  # a recycle: the pool's tokens are forgotten
        workspace.leases.add_caller(CallerId("k1"), CallerToken(Workspace.KERNEL_TOKEN))
        assert caller_of_client(workspace.leases, process.pid) is None  # a known token, no lease holds it
        workspace.leases.bind(workspace.lease, KernelId("kernel-1"), CallerId("k1"))
        assert caller_of_client(workspace.leases, process.pid) == "k1"
        workspace.leases.release(workspace.lease)  # the kernel's lease ended: its token is forgotten
        assert caller_of_client(workspace.leases, process.pid) is None
    finally:
        process.kill()
        await process.wait()
    assert caller_of_client(workspace.leases, process.pid) is None  # gone
