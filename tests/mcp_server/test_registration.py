"""`register_mcp_server` over MCP is a host command on the client's say-so: in a sandboxed workspace the
server is registered sandboxed, exactly what was parsed is written, and the registration itself is decided
by the workspace's approval rules (pseudo tool call `ipybox.register_mcp_server`, asked when no rule
applies, whatever `[approval] default` says). Real MCP sessions over streamable HTTP against a running
workspace whose kernels are sandboxed."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import tomllib
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from pathlib import Path
from typing import Any

import httpx2
import mcp
import mcp_types as types
import pytest
from mcp import ClientSession
from mcp.client.session import ElicitationFnT
from mcp.client.streamable_http import streamable_http_client

from ipybox.approval.asks import AskAnswer
from ipybox.config import load_config
from ipybox.rules import AuditLog
from ipybox.running.state import StatePaths
from ipybox.supervisor import Supervisor, read_state
from tests.mcp_server.sessions import ALLOW_REGISTRATION, owned_session, text
from tests.servers.params import EDGE_SERVER, edge_http_server
from tests.supervisor.workspaces import make_workspace

pytestmark = pytest.mark.integration

# api.github.com with request rules: a registered server may ask no more of it than kernels may.
BOUND_DOMAINS = (
    'network = { allowedDomains = ["*.example.com", { host = "api.github.com", methods = ["GET", "HEAD"] }] }'
)
GITHUB_WRITES = "allowedDomains 'api.github.com': may send methods that the workspace's entry"


@pytest.fixture(scope="module")
async def supervisor(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Supervisor]:
    directory = tmp_path_factory.mktemp("mcp-register")
    # Sandboxed kernels; none kept warm: registering starts no kernel.
    make_workspace(directory, "mcp-register", sandbox=True, warm_pool=0, ask_timeout=3)
    # Kernels may reach these hosts and write `out/`, which bound what a registered server may.
    (directory / "out").mkdir()
    config = directory / "ipybox.toml"
    config.write_text(config.read_text().replace("[sandbox]\n", f"[sandbox]\n{BOUND_DOMAINS}\n", 1))
    supervisor = Supervisor(directory)
    await supervisor.start()
    yield supervisor
    await supervisor.stop()


@pytest.fixture
def config(supervisor: Supervisor) -> Iterator[Path]:
    """The workspace's `ipybox.toml`, put back as it was after the test."""
    path = supervisor.workspace / "ipybox.toml"
    original = path.read_bytes()
    yield path
    replace(path, original)


def replace(path: Path, content: bytes) -> None:
    # Atomically, as editors save: the reconciler never sees half a file.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".test-")
    with os.fdopen(fd, "wb") as file:
        file.write(content)
    os.replace(tmp, path)


def add_to(path: Path, toml: str) -> bytes:
    """Append `toml` to the file; returns the file's new content."""
    replace(path, path.read_bytes() + toml.encode())
    return path.read_bytes()


class Client:
    """What the MCP client was asked, and how it answers: allow, reject, or never."""

    def __init__(self, answer: bool | None) -> None:
        self.answer = answer
        self.asked: list[str] = []

    async def elicit(self, context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        self.asked.append(params.message)
        if self.answer is None:
            await asyncio.sleep(60)
        return types.ElicitResult(action="accept", content={"allow": bool(self.answer)})


def session(
    supervisor: Supervisor, elicitation_callback: ElicitationFnT | None
) -> AbstractAsyncContextManager[ClientSession]:
    state = read_state(supervisor.workspace)
    assert state.mcp_url is not None and state.mcp_token is not None
    url, token = state.mcp_url, state.mcp_token

    async def open_session(stack: AsyncExitStack) -> ClientSession:
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120)
        await stack.enter_async_context(http)
        read, write = await stack.enter_async_context(streamable_http_client(url, http_client=http))
        return await stack.enter_async_context(
            ClientSession(read, write, elicitation_callback=elicitation_callback)
        )

    return owned_session(open_session)


async def register(
    supervisor: Supervisor,
    name: str,
    params: dict[str, Any],
    answer: bool | None = True,
    *,
    elicit: bool = True,
) -> tuple[types.CallToolResult, list[str]]:
    """Register `name` from a client that answers `answer` when asked; the result and what it was asked."""
    client = Client(answer)
    async with session(supervisor, client.elicit if elicit else None) as mcp:
        result = await mcp.call_tool("register_mcp_server", {"server_name": name, "server_params": params})
    return result, client.asked


def edge(**extra: Any) -> dict[str, Any]:
    return {"command": sys.executable, "args": [str(EDGE_SERVER)], **extra}


def written(path: Path, name: str) -> dict[str, Any]:
    server: dict[str, Any] = tomllib.loads(path.read_text())["servers"][name]
    return server


def audited(supervisor: Supervisor, name: str) -> list[dict[str, Any]]:
    entries = AuditLog(StatePaths.of(supervisor.workspace).audit).read()
    return [
        {"decision": e.decision, "decided_by": e.decided_by, "rule_id": e.rule_id, "reason": e.reason}
        for e in entries
        if e.server == "ipybox" and e.tool == "register_mcp_server" and e.args.get("server_name") == name
    ]


# Sandboxed by default, and written as parsed


async def test_a_stdio_server_registered_in_a_sandboxed_workspace_is_written_sandboxed(
    supervisor: Supervisor, config: Path
) -> None:
    result, _ = await register(supervisor, "boxed", edge())
    assert not result.is_error, text(result)
    assert text(result).startswith("mcptools.boxed: ")
    assert written(config, "boxed")["sandbox"] is True


async def test_a_sandbox_policy_given_by_the_client_is_written_not_dropped(
    supervisor: Supervisor, config: Path
) -> None:
    policy = {"filesystem": {"denyRead": ["private"]}, "network": {"allowedDomains": []}}
    result, _ = await register(supervisor, "own_policy", edge(sandbox=policy))
    assert not result.is_error, text(result)
    assert written(config, "own_policy")["sandbox"] == policy


async def test_turning_the_sandbox_off_in_a_sandboxed_workspace_is_refused_and_writes_nothing(
    supervisor: Supervisor, config: Path
) -> None:
    before = config.read_bytes()
    for sandbox in (False, {"enabled": False}):
        result, asked = await register(supervisor, "unboxed", edge(sandbox=sandbox))
        assert result.is_error and "sandbox" in text(result) and "[sandbox] enabled = true" in text(result)
        assert asked == []  # refused before anybody is asked
    assert config.read_bytes() == before


async def test_a_transport_spelt_http_is_registered_as_streamable_http_and_the_file_still_loads(
    supervisor: Supervisor, config: Path
) -> None:
    # Once written as `type = "http"`, which ipybox.toml did not load: now normalised, as ipybox 0.9 took it.
    with edge_http_server("streamable-http") as url:
        result, _ = await register(supervisor, "remote", {"url": url, "type": "http"})
        assert not result.is_error, text(result)
    assert written(config, "remote") == {"url": url, "type": "streamable_http"}
    assert load_config(config).servers["remote"].transport == "streamable_http"


async def test_a_transport_nobody_knows_is_refused_naming_the_key_and_what_is_accepted(
    supervisor: Supervisor, config: Path
) -> None:
    before = config.read_bytes()
    result, asked = await register(
        supervisor, "remote", {"url": "http://127.0.0.1:9/mcp", "type": "websocket"}
    )
    assert result.is_error
    assert (
        "server_params.type" in text(result)
        and "'streamable_http'" in text(result)
        and "'sse'" in text(result)
    )
    assert asked == [] and config.read_bytes() == before


async def test_an_unknown_key_is_refused_naming_it_and_the_keys_accepted(
    supervisor: Supervisor, config: Path
) -> None:
    before = config.read_bytes()
    result, asked = await register(supervisor, "typo", edge(cmd_args=["-v"]))
    assert result.is_error and "'cmd_args'" in text(result)
    assert "command, args, env, cwd, sandbox" in text(result)
    assert asked == [] and config.read_bytes() == before


# Decided by the approval rules


async def test_a_registration_no_rule_covers_is_asked_and_written_when_the_client_accepts(
    supervisor: Supervisor, config: Path
) -> None:
    result, asked = await register(supervisor, "asked_yes", edge(), answer=True)
    assert not result.is_error, text(result)
    assert len(asked) == 1 and "asked_yes" in asked[0] and str(EDGE_SERVER) in asked[0]
    assert written(config, "asked_yes")["command"] == sys.executable
    assert audited(supervisor, "asked_yes") == [
        {
            "decision": "allow",
            "decided_by": "elicitation",
            "rule_id": None,
            "reason": "no rule applies; registering an MCP server is asked by default; "
            "the MCP client answered allow",
        }
    ]


async def test_a_registration_the_client_rejects_leaves_the_file_unchanged_byte_for_byte(
    supervisor: Supervisor, config: Path
) -> None:
    before = config.read_bytes()
    result, asked = await register(supervisor, "asked_no", edge(), answer=False)
    assert result.is_error and "rejected" in text(result)
    assert len(asked) == 1
    assert config.read_bytes() == before
    assert not (supervisor.workspace / "mcptools" / "asked_no").exists()
    assert [e["decision"] for e in audited(supervisor, "asked_no")] == ["deny"]


async def test_a_registration_nobody_answers_is_denied_after_the_ask_timeout(
    supervisor: Supervisor, config: Path
) -> None:
    before = config.read_bytes()
    result, asked = await register(supervisor, "unanswered", edge(), answer=None)
    assert result.is_error and "no answer within 3 s" in text(result)
    assert len(asked) == 1 and config.read_bytes() == before
    assert [e["decided_by"] for e in audited(supervisor, "unanswered")] == ["timeout"]


async def test_a_client_that_cannot_be_asked_is_refused_with_the_rule_to_add(
    supervisor: Supervisor, config: Path
) -> None:
    before = config.read_bytes()
    result, _ = await register(supervisor, "no_elicitation", edge(), elicit=False)
    assert result.is_error
    assert 'server = "ipybox"' in text(result) and 'tool = "register_mcp_server"' in text(result)
    assert config.read_bytes() == before


async def _person_answers(supervisor: Supervisor, accept: bool, scope: str = "once") -> str | None:
    """Answer the first ask on the workspace's board as a person at the console; returns why not, if so."""
    for _ in range(2000):
        if supervisor.board.pending:
            ask = supervisor.board.pending[0]
            return await supervisor.answer(ask.id, AskAnswer(accept, scope, "console", "console (test)"))  # type: ignore[arg-type]
        await asyncio.sleep(0.01)
    raise AssertionError("the registration was not asked at the console")


async def test_a_client_that_cannot_elicit_has_its_registration_answered_at_the_console(
    supervisor: Supervisor, config: Path
) -> None:
    with supervisor.board.present("console"):
        person = asyncio.create_task(_person_answers(supervisor, True))
        result, _ = await register(supervisor, "by_console", edge(), elicit=False)
        assert await person is None
    assert not result.is_error, text(result)
    assert written(config, "by_console")["command"] == sys.executable
    [entry] = [
        e
        for e in AuditLog(StatePaths.of(supervisor.workspace).audit).read()
        if e.args.get("server_name") == "by_console"
    ]
    assert (entry.decision, entry.decided_by, entry.scope, entry.by) == (
        "allow",
        "console",
        "once",
        "console (test)",
    )


async def test_a_person_answering_first_withdraws_the_clients_registration_question(
    supervisor: Supervisor, config: Path
) -> None:
    before = config.read_bytes()
    with supervisor.board.present("console"):
        # The client would never answer; the person refuses first, and "always" is not offered.
        async def person() -> str | None:
            for _ in range(2000):
                if supervisor.board.pending:
                    ask = supervisor.board.pending[0]
                    assert ask.asked_of == "elicitation"
                    refused = await supervisor.answer(ask.id, AskAnswer(True, "always", "console", "c"))
                    assert refused is not None and "always is not offered" in refused
                    return await supervisor.answer(
                        ask.id, AskAnswer(False, "once", "console", "console (test)")
                    )
                await asyncio.sleep(0.01)
            raise AssertionError("not asked")

        answering = asyncio.create_task(person())
        result, asked = await register(supervisor, "withdrawn", edge(), answer=None)
        assert await answering is None
    assert result.is_error and "rejected by console (test)" in text(result)
    assert len(asked) == 1 and config.read_bytes() == before


async def test_a_deny_rule_refuses_a_registration_without_asking(
    supervisor: Supervisor, config: Path
) -> None:
    before = add_to(
        config,
        '\n[[approval.rules]]\nid = "no-new-servers"\nserver = "ipybox"\ntool = "register_mcp_server"\n'
        'decision = "deny"\n',
    )
    result, asked = await register(supervisor, "denied", edge())
    assert result.is_error and "no-new-servers" in text(result)
    assert asked == [] and config.read_bytes() == before
    assert audited(supervisor, "denied")[0]["rule_id"] == "no-new-servers"


async def test_an_allow_rule_lets_a_registration_through_without_asking(
    supervisor: Supervisor, config: Path
) -> None:
    add_to(config, ALLOW_REGISTRATION)
    result, asked = await register(supervisor, "allowed", edge())
    assert not result.is_error, text(result)
    assert asked == [] and "[servers.allowed]" in config.read_text()
    assert audited(supervisor, "allowed")[0] == {
        "decision": "allow",
        "decided_by": "rule",
        "rule_id": "registrations",
        "reason": "rule 'registrations' applies",
    }


async def test_an_allow_default_does_not_allow_a_registration(supervisor: Supervisor, config: Path) -> None:
    replace(config, config.read_bytes().replace(b'default = "ask"', b'default = "allow"', 1))
    result, asked = await register(supervisor, "default_allow", edge(), answer=False)
    assert result.is_error and len(asked) == 1


async def test_a_catch_all_allow_rule_does_not_allow_a_registration(
    supervisor: Supervisor, config: Path
) -> None:
    add_to(config, '\n[[approval.rules]]\nid = "everything"\ndecision = "allow"\n')
    result, asked = await register(supervisor, "catch_all", edge(), answer=False)
    assert result.is_error and len(asked) == 1


# Bounded by the workspace's sandbox


def allow_by_command() -> str:
    """A rule shaped like the README's: registrations of servers run by one command are allowed."""
    return (
        '\n[[approval.rules]]\nid = "by-command"\nserver = "ipybox"\ntool = "register_mcp_server"\n'
        f'args = {{ "server_params.command" = {json.dumps(sys.executable)} }}\ndecision = "allow"\n'
    )


async def test_a_registration_beyond_the_workspaces_sandbox_is_asked_with_its_policy_under_an_allow_rule(
    supervisor: Supervisor, config: Path
) -> None:
    before = add_to(config, allow_by_command())
    sandbox = {"filesystem": {"allowWrite": ["/etc"]}}
    result, asked = await register(supervisor, "etc", edge(sandbox=sandbox), answer=False)
    assert result.is_error and "rejected" in text(result)
    # Asked, with the policy and what goes beyond the workspace's shown.
    [question] = asked
    assert json.dumps(sandbox) in question and "allowWrite '/etc': /etc is outside the workspace" in question
    assert "its sandbox goes beyond the workspace's ([sandbox] in ipybox.toml)" in question
    [entry] = audited(supervisor, "etc")
    assert entry["rule_id"] == "by-command" and entry["decision"] == "deny"
    assert entry["reason"].startswith("rule 'by-command' would allow it, but its sandbox goes beyond")
    assert config.read_bytes() == before
    assert not (supervisor.workspace / "mcptools" / "etc").exists()


async def test_a_registration_beyond_the_workspaces_sandbox_that_nobody_can_answer_is_refused_saying_why(
    supervisor: Supervisor, config: Path, tmp_path: Path
) -> None:
    before = add_to(config, allow_by_command())
    beyond = [
        ({"cwd": str(tmp_path)}, f"cwd {str(tmp_path)!r}: {tmp_path} is outside the workspace"),
        ({"sandbox": {"network": {"allowedDomains": ["*.com"]}}}, "allowedDomains '*.com': not covered"),
        ({"sandbox": {"network": {"allowedDomains": ["api.github.com"]}}}, GITHUB_WRITES),
    ]
    for params, why in beyond:
        result, _ = await register(supervisor, "unasked", edge(**params), elicit=False)
        assert result.is_error
        message = text(result)
        assert "registering MCP server 'unasked' was denied: " in message and why in message
        assert "a person must approve it (at the workspace's web console" in message
        assert 'decision = "allow"' not in message  # no rule can let it through: none is suggested
    assert config.read_bytes() == before
    assert list(tmp_path.iterdir()) == []  # the server never ran there


async def test_a_current_revision_client_gets_a_registration_beyond_the_bound_refused_saying_why(
    supervisor: Supervisor, config: Path
) -> None:
    # MCP 2026-07-28 (the SDK's `mcp.Client` in its default mode) has no elicitation from inside a tool: the
    # ask can't reach this client, and an allow rule still does not let a policy beyond the bound through.
    before = add_to(config, allow_by_command())
    state = read_state(supervisor.workspace)
    assert state.mcp_url is not None and state.mcp_token is not None
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {state.mcp_token}"}, timeout=120)
    async with http, mcp.Client(streamable_http_client(state.mcp_url, http_client=http)) as client:
        assert client.protocol_version == "2026-07-28"
        sandbox = {"filesystem": {"allowWrite": ["/etc"]}}
        result = await client.call_tool(
            "register_mcp_server", {"server_name": "current", "server_params": edge(sandbox=sandbox)}
        )
        writes = {"network": {"allowedDomains": ["api.github.com"]}}  # all methods, where kernels may GET
        writing = await client.call_tool(
            "register_mcp_server", {"server_name": "current", "server_params": edge(sandbox=writes)}
        )
    assert result.is_error
    assert "allowWrite '/etc': /etc is outside the workspace" in text(result)
    assert writing.is_error and GITHUB_WRITES in text(writing)
    assert config.read_bytes() == before


async def test_a_registration_within_the_workspaces_sandbox_registers_without_asking_under_that_rule(
    supervisor: Supervisor, config: Path
) -> None:
    add_to(config, allow_by_command())
    sandbox = {"filesystem": {"allowWrite": ["out"]}, "network": {"allowedDomains": ["*.api.example.com"]}}
    result, asked = await register(supervisor, "within", edge(sandbox=sandbox), answer=False)
    assert not result.is_error, text(result)
    assert asked == [] and written(config, "within")["sandbox"] == sandbox
    assert audited(supervisor, "within")[0]["decision"] == "allow"
