"""The control endpoint in process (starlette's `TestClient`, no gateway): it serves the typed status and
control protocol of `ipybox.running.status` for anything that implements `Controlled`, and
`ControlClient` reads it back as models.

`SmallWorkspace` is a minimal real implementation of `Controlled`: a real `LeaseTable`, kernels named by
a counter, and `apply_server` that loads a real `ipybox.toml` and reports with the supervisor's
`server_outcome`.
"""

from __future__ import annotations

import itertools
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient
from starlette.websockets import WebSocket, WebSocketDisconnect

from ipybox.asgi_server import EmbeddedServer
from ipybox.config import CONFIG_FILE, ConfigError, load_config
from ipybox.running.control_client import ControlClient
from ipybox.running.state import SupervisorState
from ipybox.running.status import (
    CallerId,
    GatewayStatus,
    KernelId,
    KernelLeased,
    LeaseId,
    MCPServerStatus,
    PoolStatus,
    ReconcilerStatus,
    ServerOutcome,
    ToolServerStatus,
    WorkspaceStatus,
)
from ipybox.supervisor.control_app import Controlled, control_app
from ipybox.supervisor.leases import LeaseTable
from ipybox.supervisor.outcome import server_outcome

TOKEN = "control-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SERVER = '[servers.{name}]\ncommand = "python"\nargs = ["-m", "server"]\n'
# What `ipybox status --json` printed before the status was typed: scripts read these keys.
STATUS_KEYS = {
    "workspace", "pid", "started_at", "uptime_s", "sandbox", "gateway", "tool_server", "pool", "leases",
    "kernel_generation", "restarts", "config_error", "reconciler", "state_dir", "mcp", "console",
    "pending_asks", "actions",
}  # fmt: skip


class SmallWorkspace:
    """Implements `Controlled` with real parts and no processes."""

    def __init__(self, workspace: Path) -> None:
        self.workspace = workspace
        self.leases = LeaseTable()
        self.shutdown_requested = False
        self.fail_with: Exception | None = None
        self.console_off = False
        self._kernels = itertools.count(1)

    def status(self) -> WorkspaceStatus:
        return WorkspaceStatus(
            workspace=str(self.workspace),
            pid=1234,
            started_at="2025-01-01T00:00:00+00:00",
            uptime_s=1.5,
            sandbox=False,
            gateway=GatewayStatus(running=True, pid=99),
            tool_server=ToolServerStatus(running=True),
            pool=PoolStatus(size=2, idle=1, leased=self.leases.leased_kernels),
            leases=len(self.leases),
            kernel_generation=0,
            restarts={"gateway": 0, "tool_server": 0},
            reconciler=ReconcilerStatus(
                generation=3, servers={"fs": MCPServerStatus(state="ready", tools=2, generation=3)}
            ),
            state_dir=str(self.workspace / ".ipybox"),
        )

    def new_lease(self) -> LeaseId:
        return self.leases.new_lease()

    async def lease_kernel(self, lease: LeaseId) -> KernelLeased:
        if self.fail_with is not None:
            raise self.fail_with
        number = next(self._kernels)
        kernel = KernelId(f"kernel-{number}")
        self.leases.bind(lease, kernel, CallerId(f"caller-{number}"))
        return KernelLeased(kernel_id=kernel)

    async def release_lease(self, lease: LeaseId) -> None:
        self.leases.release(lease)

    async def serve_approvals(self, lease: LeaseId, websocket: WebSocket) -> None:
        if lease not in self.leases:
            await websocket.close(code=4404, reason="unknown lease")
            return
        await websocket.accept()
        await websocket.close()

    async def apply_server(self, name: str) -> ServerOutcome:
        path = self.workspace / CONFIG_FILE
        try:
            config, error = load_config(path), None
        except ConfigError as e:
            config, error = None, e
        servers = config.enabled_servers() if config is not None else {}
        status = ReconcilerStatus(
            generation=1, servers={n: MCPServerStatus(state="ready", tools=1, generation=1) for n in servers}
        )
        return server_outcome(name, status, error, path.read_text())

    def request_shutdown(self) -> None:
        self.shutdown_requested = True

    async def serve_approver(self, websocket: WebSocket, who: str) -> None:
        await websocket.accept()
        await websocket.send_text(who)  # what the endpoint let through of `?who=`
        await websocket.close()

    async def serve_asker(self, websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.close()

    def console_login(self) -> str:
        if self.console_off:
            raise RuntimeError("the web console is off in this workspace ([endpoints] console = false)")
        return "http://127.0.0.1:1/login?token=t"


@pytest.fixture
def target(tmp_path: Path) -> SmallWorkspace:
    (tmp_path / CONFIG_FILE).write_text(SERVER.format(name="fs"))
    return SmallWorkspace(tmp_path)


@pytest.fixture
def client(target: SmallWorkspace) -> Iterator[TestClient]:
    app: Controlled = target  # the app needs only the protocol
    with TestClient(control_app(app, TOKEN), headers=AUTH) as client:
        yield client


def test_the_status_is_served_as_its_model_with_the_keys_scripts_read(
    client: TestClient, target: SmallWorkspace
) -> None:
    response = client.get("/status")
    assert response.status_code == 200
    assert set(response.json()) == STATUS_KEYS
    assert WorkspaceStatus.model_validate(response.json()) == target.status()
    assert response.json()["reconciler"]["servers"]["fs"] == {
        "state": "ready",
        "tools": 2,
        "generation": 3,
        "error": None,
        "parsers": [],
        "parser_errors": [],
        "location": None,
    }


def test_a_request_without_the_token_is_refused(target: SmallWorkspace) -> None:
    with TestClient(control_app(target, TOKEN)) as anonymous:
        assert anonymous.get("/status").status_code == 401
        assert anonymous.post("/leases", headers={"Authorization": "Bearer wrong"}).status_code == 401


def test_a_lease_gets_kernels_and_gives_them_back(client: TestClient, target: SmallWorkspace) -> None:
    lease = client.post("/leases").json()["lease"]
    assert client.post(f"/leases/{lease}/kernels").json() == {"kernel_id": "kernel-1", "lost": None}
    assert client.post(f"/leases/{lease}/kernels").json() == {"kernel_id": "kernel-2", "lost": None}
    status = client.get("/status").json()
    # A lease holds one kernel at a time: taking the second gave the first back.
    assert status["leases"] == 1 and status["pool"]["leased"] == 1
    assert client.delete(f"/leases/{lease}").json() == {"released": True}
    assert len(target.leases) == 0


def test_an_unknown_lease_is_404_saying_what_to_do(client: TestClient) -> None:
    for response in (client.post("/leases/nope/kernels"), client.delete("/leases/nope")):
        assert response.status_code == 404
        assert response.json() == {"error": "unknown lease 'nope' (take one with POST /leases)"}


def test_a_failure_is_503_with_its_type_and_message(client: TestClient, target: SmallWorkspace) -> None:
    target.fail_with = RuntimeError("the kernel gateway is not running: stopped")
    lease = client.post("/leases").json()["lease"]
    response = client.post(f"/leases/{lease}/kernels")
    assert response.status_code == 503
    assert response.json() == {"error": "RuntimeError: the kernel gateway is not running: stopped"}


def test_applying_a_server_answers_with_that_servers_outcome(client: TestClient) -> None:
    outcome = ServerOutcome.model_validate(client.post("/servers/fs/apply").json())
    assert (outcome.name, outcome.state, outcome.generation, outcome.error) == ("fs", "ready", 1, None)
    absent = ServerOutcome.model_validate(client.post("/servers/other/apply").json())
    assert absent.state == "absent" and "no enabled server 'other'" in (absent.error or "")


def test_a_config_error_of_another_server_is_not_this_servers(
    client: TestClient, target: SmallWorkspace
) -> None:
    # `fs` is a substring of `refs`: only where the problem is decides whose it is.
    broken = SERVER.format(name="fs") + '\n[servers.refs]\ncommand = "x"\ncomand = "typo"\n'
    (target.workspace / CONFIG_FILE).write_text(broken)
    refs = ServerOutcome.model_validate(client.post("/servers/refs/apply").json())
    assert refs.state == "config_error" and refs.about_server
    assert [p.line for p in refs.problems] == [7] and "comand" in refs.problems[0].reason
    fs = ServerOutcome.model_validate(client.post("/servers/fs/apply").json())
    assert fs.state == "config_error" and not fs.about_server
    assert fs.error is not None and fs.error.startswith("it is not applied: ipybox.toml does not load")


def test_shutdown_is_requested(client: TestClient, target: SmallWorkspace) -> None:
    assert client.post("/shutdown").json() == {"stopping": True}
    assert target.shutdown_requested


def test_the_approval_websocket_of_an_unknown_lease_is_closed(client: TestClient) -> None:
    with (
        pytest.raises(WebSocketDisconnect) as closed,
        client.websocket_connect("/leases/nope/approval") as ws,
    ):
        ws.receive_text()
    assert closed.value.code == 4404


async def test_the_control_client_reads_every_answer_as_its_model(target: SmallWorkspace) -> None:
    with tempfile.TemporaryDirectory(prefix="ipybox-test-") as run_dir:  # short: a socket path
        socket = Path(run_dir) / "control.sock"
        server = EmbeddedServer(control_app(target, TOKEN), "test-control")
        await server.start(unix_socket=socket)
        state = SupervisorState(
            pid=1,
            workspace=str(target.workspace),
            started_at="",
            control_socket=str(socket),
            control_token=TOKEN,
            gateway_socket="",
            gateway_token="",
            log_file="",
        )
        try:
            async with ControlClient(state) as control:
                assert await control.status() == target.status()
                lease = await control.new_lease()
                assert await control.lease_kernel(lease) == "kernel-1"
                await control.release(lease)
                with pytest.raises(RuntimeError, match="unknown lease 'nope'"):
                    await control.lease_kernel(LeaseId("nope"))
                outcome = await control.apply_server("fs")
                assert isinstance(outcome, ServerOutcome) and outcome.state == "ready"
                await control.shutdown()
        finally:
            await server.stop()
    assert target.shutdown_requested
    assert json.loads(state.model_dump_json())["control_socket"] == str(socket)


def test_a_console_login_link_is_served_and_a_console_that_is_off_is_one_line(
    client: TestClient, target: SmallWorkspace
) -> None:
    assert client.post("/console/login").json() == {"url": "http://127.0.0.1:1/login?token=t"}
    target.console_off = True
    response = client.post("/console/login")
    assert response.status_code == 409
    assert response.json() == {
        "error": "the web console is off in this workspace ([endpoints] console = false)"
    }


def test_an_approvers_name_reaches_the_workspace_as_one_short_printable_line(client: TestClient) -> None:
    with client.websocket_connect("/approvers?who=" + "alice%1b[2J%0aon pts/3" + "x" * 200) as websocket:
        who = websocket.receive_text()
    assert who.startswith("alice[2Jon pts/3") and len(who) == 80
