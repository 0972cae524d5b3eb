"""The control endpoint in process (starlette's `TestClient`, no gateway): it serves the typed status and
control protocol of `ipybox.running.status` for anything that implements `Controlled`, and
`ControlClient` reads it back as models.

`SmallWorkspace` is a minimal real implementation of `Controlled`: a real `LeaseTable`, kernels named by
a counter, and `apply_server` that loads a real `ipybox.toml` and reports with the supervisor's
`server_outcome` (passing a listener the steps of the server it applies, as the reconciler does).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient
from starlette.websockets import WebSocket, WebSocketDisconnect

from ipybox.asgi_server import EmbeddedServer
from ipybox.config import CONFIG_FILE, ConfigError, load_config
from ipybox.progress import PartTimer, Progress, ProgressEvent, ProgressStep, server_part
from ipybox.running.control_client import ControlClient, ControlRequestError
from ipybox.running.state import NotRunningError, SupervisorState
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
    TokenRotated,
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
    "kernels",  # added with resource limits: each kernel's usage
    "policy",  # added with issue 35: admin tiers, tool pins, lint mode
}  # fmt: skip


class SmallWorkspace:
    """Implements `Controlled` with real parts and no processes."""

    def __init__(self, workspace: Path) -> None:
        self.workspace = workspace
        self.leases = LeaseTable()
        self.shutdown_requested = False
        self.fail_with: Exception | None = None
        self.console_off = False
        self.hold: asyncio.Event | None = None
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

    async def status_with_kernels(self) -> WorkspaceStatus:
        return self.status()  # no gateway here: `kernels` stays unset

    def new_lease(self, check: bool = False, client: str | None = None) -> LeaseId:
        return self.leases.new_lease("checking asks nobody" if check else None, client)

    def register_cell(self, lease: LeaseId, code: str) -> str:
        return self.leases.register_cell(lease, code)

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

    async def apply_server(self, name: str, progress: Progress | None = None) -> ServerOutcome:
        path = self.workspace / CONFIG_FILE
        try:
            config, error = load_config(path), None
        except ConfigError as e:
            config, error = None, e
        servers = config.enabled_servers() if config is not None else {}
        if progress is not None and name in servers:
            timer = PartTimer()
            steps: tuple[ProgressStep, ...] = ("connecting", "listing tools", "generating")
            for step in steps:
                progress(timer.event(server_part(name), step))
                await asyncio.sleep(0)  # each reaches the client as the workspace gets there
                if self.hold is not None:  # until the test saw the event arrive
                    await self.hold.wait()
            if self.fail_with is not None:
                raise self.fail_with
            progress(timer.event(server_part(name), "ready", "1 tool"))
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

    def rotate_mcp_token(self) -> TokenRotated:
        return TokenRotated(live=False)


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
        "checking": [],
        "location": None,
        "stopped": None,
    }


def test_a_request_without_the_token_is_refused(target: SmallWorkspace) -> None:
    with TestClient(control_app(target, TOKEN)) as anonymous:
        assert anonymous.get("/status").status_code == 401
        assert anonymous.post("/leases", headers={"Authorization": "Bearer wrong"}).status_code == 401


def test_a_check_lease_refuses_its_kernels_asks(client: TestClient, target: SmallWorkspace) -> None:
    check = client.post("/leases", json={"check": True}).json()["lease"]
    ordinary = client.post("/leases").json()["lease"]
    client.post(f"/leases/{check}/kernels")
    client.post(f"/leases/{ordinary}/kernels")
    assert target.leases.refusal("caller-1") == "checking asks nobody"
    assert target.leases.refusal("caller-2") is None
    assert client.post("/leases", content=b'{"check": "yes please"}').status_code == 503


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
                named = await control.new_lease(client="Claude Code\x1b[2J 2.1")
                code = "import mcptools\nmcptools.fs.write_file.run(path='a')\n"
                sha = await control.register_cell(named, code)
                assert target.leases.info(named)[0] == "Claude Code [2J 2.1"  # printable, one line
                assert target.leases.cell_text(named, sha) == code.rstrip("\n")  # as IPython keeps it
                assert target.leases.cell_text(lease, sha) is None  # another lease's cell is not this one's
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


NDJSON = {"Accept": "application/x-ndjson"}


def test_applying_with_ndjson_streams_the_servers_events_then_its_outcome(client: TestClient) -> None:
    response = client.post("/servers/fs/apply", headers=NDJSON)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in response.text.splitlines()]
    assert [line["kind"] for line in lines] == ["progress"] * 4 + ["outcome"]
    events = [ProgressEvent.from_dict(line) for line in lines[:-1]]
    assert [(e.what, e.step, e.done) for e in events] == [
        ("server fs", "connecting", False),
        ("server fs", "listing tools", False),
        ("server fs", "generating", False),
        ("server fs", "ready", True),
    ]
    outcome = ServerOutcome.model_validate(lines[-1])
    assert (outcome.name, outcome.state, outcome.generation) == ("fs", "ready", 1)


def test_without_ndjson_applying_answers_with_the_outcome_alone(client: TestClient) -> None:
    response = client.post("/servers/fs/apply", headers={"Accept": "application/json"})
    assert response.headers["content-type"] == "application/json"
    assert ServerOutcome.model_validate(response.json()).state == "ready"


def test_a_streamed_apply_that_fails_ends_with_an_error_line(
    client: TestClient, target: SmallWorkspace
) -> None:
    target.fail_with = RuntimeError("the workspace is still starting")
    lines = [json.loads(line) for line in client.post("/servers/fs/apply", headers=NDJSON).text.splitlines()]
    assert [line["kind"] for line in lines] == ["progress"] * 3 + ["error"]
    assert lines[-1]["error"] == "RuntimeError: the workspace is still starting"


@pytest.fixture
async def control(target: SmallWorkspace) -> AsyncIterator[ControlClient]:
    """A `ControlClient` talking to the control app of `target` over a real Unix socket."""
    with tempfile.TemporaryDirectory(prefix="ipybox-test-") as run_dir:  # short: a socket path
        socket = Path(run_dir) / "control.sock"
        server = EmbeddedServer(control_app(target, TOKEN), "test-control")
        await server.start(unix_socket=socket)
        try:
            async with ControlClient(state_of(target.workspace, socket)) as client:
                yield client
        finally:
            await server.stop()


def state_of(workspace: Path, socket: Path) -> SupervisorState:
    return SupervisorState(
        pid=1,
        workspace=str(workspace),
        started_at="",
        control_socket=str(socket),
        control_token=TOKEN,
        gateway_socket="",
        gateway_token="",
        log_file="",
    )


async def test_the_control_client_passes_each_event_to_progress_and_returns_the_outcome(
    control: ControlClient,
) -> None:
    seen: list[ProgressEvent] = []
    outcome = await control.apply_server("fs", progress=seen.append)
    assert [e.step for e in seen] == ["connecting", "listing tools", "generating", "ready"]
    assert isinstance(outcome, ServerOutcome) and outcome.state == "ready"
    # An absent server has no steps: the outcome alone.
    assert (await control.apply_server("other", progress=seen.append)).state == "absent"
    assert len(seen) == 4


async def test_each_event_reaches_the_client_while_the_server_is_still_being_applied(
    control: ControlClient, target: SmallWorkspace
) -> None:
    # The apply waits after its first event until the client has that event: a buffered answer would
    # never finish (the guard below turns that into a failure).
    target.hold = asyncio.Event()
    seen: list[str] = []

    def arrived(event: ProgressEvent) -> None:
        seen.append(event.step)
        assert target.hold is not None
        target.hold.set()

    outcome = await asyncio.wait_for(control.apply_server("fs", progress=arrived), 60)
    assert outcome.state == "ready" and seen[0] == "connecting"


async def test_a_failed_streamed_apply_is_a_control_request_error(
    control: ControlClient, target: SmallWorkspace
) -> None:
    target.fail_with = RuntimeError("the workspace is still starting")
    seen: list[ProgressEvent] = []
    with pytest.raises(ControlRequestError, match="RuntimeError: the workspace is still starting"):
        await control.apply_server("fs", progress=seen.append)
    assert [e.step for e in seen] == ["connecting", "listing tools", "generating"]


CHUNKED = b"HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\ntransfer-encoding: chunked\r\n\r\n"


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


async def answering(answer: bytes, tmp: Path) -> tuple[asyncio.Server, Path]:
    """A Unix socket server that reads a request, writes `answer` and hangs up: a stream cut short."""
    socket = tmp / "control.sock"

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)
        await writer.drain()
        writer.close()

    return await asyncio.start_unix_server(handle, path=str(socket)), socket


@pytest.mark.parametrize(
    ("answer", "error", "message"),
    [
        # The workspace went away mid-stream (the chunked body never ends).
        (
            CHUNKED + chunk(b'{"kind":"progress","what":"server fs","step":"connecting"}\n'),
            NotRunningError,
            "lost",
        ),
        # The stream ended properly, but without the outcome.
        (
            CHUNKED + chunk(b'{"kind":"progress","what":"server fs","step":"connecting"}\n') + b"0\r\n\r\n",
            ControlRequestError,
            "before the outcome",
        ),
        # A line this version does not know.
        (CHUNKED + chunk(b'{"kind":"surprise"}\n') + b"0\r\n\r\n", ControlRequestError, "unexpected body"),
    ],
    ids=["cut-off", "no-outcome", "unknown-line"],
)
async def test_a_broken_stream_is_one_clear_error(
    answer: bytes, error: type[Exception], message: str
) -> None:
    with tempfile.TemporaryDirectory(prefix="ipybox-test-") as run_dir:
        server, socket = await answering(answer, Path(run_dir))
        seen: list[ProgressEvent] = []
        try:
            async with ControlClient(state_of(Path(run_dir), socket)) as control:
                with pytest.raises(error, match=message):
                    await control.apply_server("fs", progress=seen.append)
        finally:
            server.close()
            await server.wait_closed()
    if message != "unexpected body":
        assert [e.step for e in seen] == ["connecting"]
