"""`DomainProxy` with `unknown = "ask"`: a host no entry covers is asked about (a `HostAsker` that the tests
script), the connection waiting for the answer; once / session / always / denied / nobody; concurrent
connections to one host share one ask; denied hosts and `unknown = "deny"` are never asked about.

The origin is the host's `127.0.0.1` (`host_http_server`), reached as `localhost`: an internal address,
which the question shows and an allowing answer lets the connection reach.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ipybox.sandbox.host_asks import HostAnswer, HostQuestion
from ipybox.sandbox.proxy import DomainProxy


class Asker:
    """Answers each question with the next scripted answer, after `release` is set (if it is not yet)."""

    def __init__(self, *answers: HostAnswer) -> None:
        self.answers = list(answers)
        self.questions: list[HostQuestion] = []
        self.release = asyncio.Event()
        self.release.set()

    async def __call__(self, question: HostQuestion) -> HostAnswer:
        self.questions.append(question)
        await self.release.wait()
        return self.answers.pop(0)


@pytest.fixture
def asker() -> Asker:
    return Asker()


@pytest.fixture
async def proxy(tmp_path: Path, asker: Asker) -> AsyncIterator[DomainProxy]:
    async with DomainProxy([], unknown="ask", ask=asker) as proxy:
        await proxy.start(tmp_path / "proxy.sock")
        yield proxy


async def get(proxy: DomainProxy, port: int, host: str = "localhost") -> bytes:
    assert proxy.unix_socket is not None
    reader, writer = await asyncio.open_unix_connection(proxy.unix_socket)
    writer.write(f"GET http://{host}:{port}/x HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return answer


async def connect(proxy: DomainProxy, port: int) -> bytes:
    assert proxy.unix_socket is not None
    reader, writer = await asyncio.open_unix_connection(proxy.unix_socket)
    writer.write(f"CONNECT localhost:{port} HTTP/1.1\r\n\r\n".encode())
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    if head.startswith(b"HTTP/1.1 200"):
        writer.write(b"GET /tunnelled HTTP/1.0\r\n\r\n")
        head += await asyncio.wait_for(reader.read(), 10)
    else:
        head += await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return head


async def test_an_answer_once_lets_that_connection_through_and_the_next_one_is_asked_again(
    proxy: DomainProxy, asker: Asker, host_http_server: int
) -> None:
    asker.answers = [HostAnswer(True, "once", "allowed once by console (root)"), HostAnswer(True)]
    assert (await get(proxy, host_http_server)).startswith(b"HTTP/1.0 200")
    tunnelled = await connect(proxy, host_http_server)
    assert b"200 Connection Established" in tunnelled and b"GET /tunnelled" in tunnelled
    first, second = asker.questions
    assert (first.host, first.port, first.method) == ("localhost", host_http_server, "GET")
    assert second.method == "CONNECT"
    # The address it resolves to is internal: the people asked see it.
    assert first.internal is not None and first.internal.startswith("127.0.0.1")
    assert first.subject.startswith(
        f"connect to localhost:{host_http_server} (an internal address: 127.0.0.1"
    )


async def test_a_session_answer_holds_for_the_host_across_policy_updates(
    proxy: DomainProxy, asker: Asker, host_http_server: int
) -> None:
    asker.answers = [HostAnswer(True, "session", "allowed for this session by terminal (alice)")]
    for _ in range(2):
        assert (await get(proxy, host_http_server)).startswith(b"HTTP/1.0 200")
    proxy.update(["example.invalid"], unknown="ask")
    assert (await get(proxy, host_http_server)).startswith(b"HTTP/1.0 200")
    assert len(asker.questions) == 1
    # A host denied later wins over the answer.
    proxy.update([], ["localhost"], unknown="ask")
    assert (await get(proxy, host_http_server)).startswith(b"HTTP/1.1 403")
    assert len(asker.questions) == 1


async def test_a_refusal_names_the_host_what_happened_and_how_to_allow_it(
    proxy: DomainProxy, asker: Asker, host_http_server: int
) -> None:
    asker.answers = [
        HostAnswer(False, "session", "denied for this session by console (root)"),
    ]
    refused = await get(proxy, host_http_server)
    assert refused.startswith(b"HTTP/1.1 403")
    assert b"localhost is not in network.allowedDomains" in refused
    assert b"denied for this session by console (root)" in refused
    assert b"add it to allowedDomains in [sandbox.network] of ipybox.toml" in refused
    # Denied for the session: refused again without asking, the same way.
    again = await connect(proxy, host_http_server)
    assert again.startswith(b"HTTP/1.1 403") and b"denied for this session" in again
    assert len(asker.questions) == 1


@pytest.mark.parametrize(
    "why", ["nobody answered within 60 s", "nobody is connected to answer (no open web console)"]
)
async def test_an_unanswered_ask_is_a_403_that_says_so(
    proxy: DomainProxy, asker: Asker, host_http_server: int, why: str
) -> None:
    asker.answers = [HostAnswer(False, why=why), HostAnswer(True)]
    refused = await get(proxy, host_http_server)
    assert refused.startswith(b"HTTP/1.1 403") and why.encode() in refused
    # Not remembered: the next connection is asked again.
    assert (await get(proxy, host_http_server)).startswith(b"HTTP/1.0 200")


async def test_concurrent_connections_to_one_host_share_one_ask(
    proxy: DomainProxy, asker: Asker, host_http_server: int
) -> None:
    asker.answers = [HostAnswer(True, "once")]
    asker.release.clear()
    requests = [asyncio.ensure_future(get(proxy, host_http_server)) for _ in range(3)]
    requests.append(asyncio.ensure_future(connect(proxy, host_http_server)))
    for _ in range(100):
        if asker.questions:
            break
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.2)  # every connection has reached the ask
    assert len(asker.questions) == 1 and not any(request.done() for request in requests)
    asker.release.set()
    answers = await asyncio.gather(*requests)
    assert all(b" 200 " in answer for answer in answers), answers


async def test_an_always_answer_holds_until_the_next_policy_update(
    proxy: DomainProxy, asker: Asker, host_http_server: int
) -> None:
    asker.answers = [HostAnswer(True, "always"), HostAnswer(False, why="denied once by console (root)")]
    assert (await get(proxy, host_http_server)).startswith(b"HTTP/1.0 200")
    assert (await get(proxy, host_http_server)).startswith(b"HTTP/1.0 200")
    assert len(asker.questions) == 1
    # The edit the asker made arrives as an update; one that does not list the host asks again.
    proxy.update([], unknown="ask")
    assert (await get(proxy, host_http_server)).startswith(b"HTTP/1.1 403")
    assert len(asker.questions) == 2


async def test_denied_hosts_and_unknown_deny_are_never_asked_about(
    proxy: DomainProxy, asker: Asker, host_http_server: int
) -> None:
    proxy.update(["example.invalid"], ["*.localhost", "localhost"], unknown="ask")
    assert (await get(proxy, host_http_server)).startswith(b"HTTP/1.1 403")
    proxy.update(["example.invalid"])  # unknown = "deny"
    refused = await get(proxy, host_http_server)
    assert refused.startswith(b"HTTP/1.1 403") and b"localhost is not in network.allowedDomains" in refused
    assert asker.questions == []


async def test_ask_without_an_asker_refuses_saying_nobody_can_be_asked(
    tmp_path: Path, host_http_server: int
) -> None:
    async with DomainProxy([], unknown="ask") as proxy:
        await proxy.start(tmp_path / "alone.sock")
        refused = await get(proxy, host_http_server)
    assert refused.startswith(b"HTTP/1.1 403") and b"this proxy has nobody to ask" in refused


def test_ask_and_read_only_are_refused_together() -> None:
    with pytest.raises(ValueError, match="readOnly"):
        DomainProxy([], unknown="ask", read_only=True)
