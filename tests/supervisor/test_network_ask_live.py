"""`[sandbox.network] unknown = "ask"` in a running workspace: a sandboxed kernel's request to a host not in
`allowedDomains` is refused at once while nobody is connected to answer; with a person at the console it
waits on the workspace's ask board, and an `always` answer lets it through, writes the host into
`ipybox.toml`'s `allowedDomains`, and reaches the running kernel's proxy (no recycle): the next request
goes through without an ask.

The origin is a plain-HTTP server on 127.0.0.1 reached as `localhost` (see `test_network_live.py`).
"""

from __future__ import annotations

import asyncio
import json
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ipybox import ApprovalRequest, CodeExecutionResult, CodeExecutor
from ipybox.approval.asks import AskAnswer, AskOpened
from ipybox.sandbox.platforms import sandbox_supported
from ipybox.supervisor import Supervisor
from tests.sandbox.tls_harness import OriginServer, start_origin
from tests.supervisor.test_network_live import request_code
from tests.supervisor.workspaces import sandboxed_kernels

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not sandbox_supported(), reason="the sandbox can't run here (ipybox doctor)"),
]


def workspace_file() -> str:
    return sandboxed_kernels('allowedDomains = []\nunknown = "ask"')


@pytest.fixture
async def origin(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[OriginServer]:
    server = await start_origin(tmp_path_factory.mktemp("ask-origin"), tls=False)
    try:
        yield server
    finally:
        server.close()


async def test_a_person_answers_always_and_the_host_joins_allowed_domains_of_the_running_kernel(
    tmp_path: Path, origin: OriginServer
) -> None:
    (tmp_path / "ipybox.toml").write_text(workspace_file())
    supervisor = Supervisor(tmp_path)
    await supervisor.start()
    try:
        board = supervisor.asks.board
        async with CodeExecutor(workspace=tmp_path) as executor:

            async def request() -> dict[str, object]:
                out = (
                    (await executor.execute(request_code(origin.origin.port), timeout=60)).text or ""
                ).strip()
                result: dict[str, object] = json.loads(out.splitlines()[-1])
                return result

            await executor.execute("kept = 'before'", timeout=60)
            generation = supervisor.kernel_generation

            # The kernel's application is asked first (its connection is attributed to its kernel), and
            # `execute()` answers no asks; nobody at the console or in `ipybox approve`: refused at once.
            alone = await asyncio.wait_for(request(), 30)
            status, body = alone["got"]  # type: ignore[misc]
            assert status == 403 and "execute() answers no asks" in body, alone
            assert "no person [approval] ask lists" in body, alone
            assert "allowedDomains" in body and board.pending == []

            with board.present("console"), board.subscribe() as events:
                asking = asyncio.ensure_future(request())
                opened = await asyncio.wait_for(events.events.get(), 30)
                assert isinstance(opened, AskOpened), opened
                ask = opened.ask
                assert ask.subject is not None
                assert ask.subject.startswith(f"connect to localhost:{origin.origin.port}"), ask.subject
                assert not asking.done()  # the connection waits for the answer
                why = await supervisor.asks.answer(
                    ask.id, AskAnswer(True, "always", "console", "console (test)")
                )
                assert why is None
                allowed = await asyncio.wait_for(asking, 30)
                assert allowed["got"] == [200, "GET /x body=0 conn=1"], allowed

                written = tomllib.loads((tmp_path / "ipybox.toml").read_text())
                assert written["sandbox"]["network"]["allowedDomains"] == ["localhost"]
                proxy = supervisor.kernels.proxy
                assert proxy is not None
                for _ in range(200):  # the reconciler applies the edit in the background
                    if proxy.hosts.allows("localhost"):
                        break
                    await asyncio.sleep(0.05)
                assert proxy.hosts.allows("localhost")

                again = await request()
                assert again["got"][0] == 200 and again["pid"] == allowed["pid"], again  # type: ignore[index]
                assert again["kept"] == "before"
                while not events.events.empty():  # the first ask's closing, and nothing else
                    assert not isinstance(events.events.get_nowait(), AskOpened)
            assert supervisor.kernel_generation == generation
    finally:
        await supervisor.stop()


async def test_the_attached_application_is_asked_about_its_own_kernels_connection_and_lets_it_through(
    tmp_path: Path, origin: OriginServer
) -> None:
    (tmp_path / "ipybox.toml").write_text(workspace_file())
    supervisor = Supervisor(tmp_path)
    await supervisor.start()
    try:
        async with CodeExecutor(workspace=tmp_path) as executor:
            await executor.execute("kept = 'before'", timeout=60)
            requests: list[ApprovalRequest] = []
            text = None
            async for item in executor.stream(request_code(origin.origin.port), timeout=60):
                if isinstance(item, ApprovalRequest):
                    requests.append(item)
                    await item.accept()
                elif isinstance(item, CodeExecutionResult):
                    text = item.text
            assert [(r.server_name, r.tool_name, r.tool_args) for r in requests] == [
                ("ipybox", "network", {"host": "localhost", "port": origin.origin.port, "method": "GET"})
            ]
            got = json.loads((text or "").strip().splitlines()[-1])["got"]
            assert got == [200, "GET /x body=0 conn=1"], got
            last = json.loads(supervisor.asks.audit_path.read_text().splitlines()[-1])
            assert (last["tool"], last["decision"], last["decided_by"]) == ("network", "allow", "application")

            # Once: the next connection is asked again, and `execute()` answers no asks, nor does anyone
            # else: refused at once (well within the ask timeout).
            out = await asyncio.wait_for(executor.execute(request_code(origin.origin.port), timeout=60), 30)
            status, body = json.loads((out.text or "").strip().splitlines()[-1])["got"]
            assert status == 403 and "execute() answers no asks" in body, body
    finally:
        await supervisor.stop()
