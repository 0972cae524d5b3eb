"""The call channel under abuse (issue 14, items 1 and 2): a kernel flooding it with connections or huge
request lines costs that kernel only.

A real `CallChannel` on a Unix socket with in-process handlers (no MCP server is needed to attack the
channel itself); attackers speak raw sockets, well-behaved kernels use the real `ToolRunner`. Memory is
checked as the process's peak RSS (`VmHWM`, reset through `/proc/self/clear_refs`): a bound on memory, not
on time.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Collection
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from ipybox.in_kernel import tool_runner
from ipybox.in_kernel.tool_runner import ToolRunner, ToolRunnerError
from ipybox.tool_server.call_channel import CallChannel, ChannelLimits

MiB = 1024 * 1024
TOKENS = {"token-a": "a", "token-b": "b", "token-hostile": "hostile"}
GUARD = 30  # seconds: only against a hang, never an assertion on speed


class Channel:
    """A started `CallChannel` whose `run` echoes `args["echo"]`, counting the requests it ran; a request
    with `args["block"]` waits until `release` is set."""

    def __init__(self, limits: ChannelLimits | None = None) -> None:
        self.runs = 0
        self.release = asyncio.Event()
        self.channel = CallChannel(TOKENS.get, {"run": self._run}, limits)
        self.path = ""

    async def _run(self, request: dict[str, Any]) -> dict[str, Any]:
        self.runs += 1
        args = request.get("args") or {}
        if args.get("block"):
            await self.release.wait()
        return {"result": args.get("echo")}

    @property
    def address(self) -> str:
        return f"unix:{self.path}"

    def runner(self, token: str) -> ToolRunner:
        return ToolRunner("s", address=self.address, token=token)


@pytest.fixture
async def channel(tmp_path: Path) -> AsyncIterator[Channel]:
    served = Channel()
    served.path = (await served.channel.start(unix_socket=tmp_path / "calls.sock")).removeprefix("unix:")
    yield served
    await served.channel.stop()


async def started(tmp_path: Path, limits: ChannelLimits) -> Channel:
    served = Channel(limits)
    served.path = (await served.channel.start(unix_socket=tmp_path / "calls.sock")).removeprefix("unix:")
    return served


def request(token: str, **args: Any) -> bytes:
    line = {"token": token, "op": "run", "server": "s", "tool": "t", "args": args}
    return json.dumps(line, separators=(",", ":")).encode() + b"\n"


async def connect(served: Channel) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_unix_connection(served.path)


async def answer(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """The next answer line, `None` if the channel closed the connection instead."""
    line = await asyncio.wait_for(reader.readline(), GUARD)
    return json.loads(line) if line else None


async def closes(reader: asyncio.StreamReader) -> bytes:
    """Everything the channel still sends until it closes the connection."""
    return await asyncio.wait_for(reader.read(), GUARD)


def error_type(answer: dict[str, Any] | None) -> str | None:
    return answer.get("error", {}).get("type") if answer else None


async def call(runner: ToolRunner, echo: Any, *, pool: ThreadPoolExecutor | None = None, **args: Any) -> Any:
    loop = asyncio.get_running_loop()
    run = loop.run_in_executor(pool, runner.run_sync, "t", {"echo": echo, **args})
    return await asyncio.wait_for(run, GUARD)


# --- memory, read from the kernel's counters -------------------------------------------------------------


def _status_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} in /proc/self/status")


def reset_peak_rss() -> float:
    """Start measuring the peak RSS from now; the current RSS in MiB."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pytest.skip("needs Linux's /proc/self/clear_refs to reset the peak RSS")
    return _status_mib("VmRSS")


def peak_rss() -> float:
    return _status_mib("VmHWM")


BLOCK = b"x" * MiB  # shared by all senders: the attacker's side of this process stays small


def send_unterminated(path: str, token: str, total: int) -> bytes:
    """Send `total` bytes of one request line (starting with its token, as `ToolRunner` does) and no
    newline on a new connection; then what the channel answered (b"" if nothing within the guard)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(GUARD)
    try:
        sock.connect(path)
        head = b'{"token":"%s","op":"run","server":"s","tool":"t","args":{"echo":"' % token.encode()
        try:
            sock.sendall(head)
            for _ in range(total // len(BLOCK)):
                sock.sendall(BLOCK)
        except OSError:
            pass  # refused mid-send: the error line was sent before the close
        try:
            return sock.recv(64 * 1024)
        except OSError:
            return b""
    finally:
        sock.close()


async def attack_with_unterminated_lines(served: Channel, connections: int, size: int) -> list[bytes]:
    with ThreadPoolExecutor(connections) as pool:
        loop = asyncio.get_running_loop()
        sends = [
            loop.run_in_executor(pool, send_unterminated, served.path, "token-hostile", size)
            for _ in range(connections)
        ]
        return await asyncio.gather(*sends)


# --- item 2: request size --------------------------------------------------------------------------------


async def test_four_200_mib_lines_without_a_newline_are_refused_while_read_and_the_memory_stays_bounded(
    channel: Channel,
) -> None:
    before = reset_peak_rss()
    answers = await attack_with_unterminated_lines(channel, 4, 200 * MiB)
    grown = peak_rss() - before
    for line in answers:
        refusal = json.loads(line)["error"]
        assert refusal["type"] == "request_too_large"
        assert "16 MiB" in refusal["message"] and "max_request_bytes" in refusal["message"]
    # Measured: 83 -> 885 MiB before the limit (never returned); now at most the 4 large-request slots
    # of one caller (16 MiB each) are buffered.
    assert grown < 160, f"peak RSS grew by {grown:.0f} MiB"
    assert channel.runs == 0


@pytest.mark.integration  # reads 1 GiB from 64 threads
async def test_64_connections_of_one_caller_cannot_each_buffer_a_limits_worth(channel: Channel) -> None:
    before = reset_peak_rss()
    answers = await attack_with_unterminated_lines(channel, 64, 20 * MiB)
    grown = peak_rss() - before
    assert {error_type(json.loads(line)) for line in answers} == {"request_too_large"}
    # Measured: 83 -> 1367 MiB before (64 x 20 MiB); now 4 x 16 MiB plus a few chunks per connection.
    assert grown < 256, f"peak RSS grew by {grown:.0f} MiB"


async def test_a_tool_call_over_the_request_limit_fails_in_the_kernel_naming_the_limit(
    channel: Channel,
) -> None:
    with pytest.raises(ToolRunnerError, match=r"16 MiB at most .*max_request_bytes.*pass its path"):
        await call(channel.runner("token-a"), "x" * (17 * MiB))
    assert channel.runs == 0
    assert await call(channel.runner("token-a"), "after") == "after"  # a new connection, as usual


async def test_a_configured_request_limit_is_enforced_and_named(tmp_path: Path) -> None:
    served = await started(tmp_path, ChannelLimits(max_request_bytes=1 * MiB))
    try:
        assert await call(served.runner("token-a"), "y" * (MiB // 2)) == "y" * (MiB // 2)
        with pytest.raises(ToolRunnerError, match="1 MiB at most"):
            await call(served.runner("token-a"), "y" * (2 * MiB))
    finally:
        await served.channel.stop()


async def test_a_large_line_that_does_not_start_with_its_token_is_refused_before_it_is_read(
    channel: Channel,
) -> None:
    reader, writer = await connect(channel)
    line = b'{"op":"run","server":"s","tool":"t","args":{"echo":"' + b"z" * (200 * 1024)
    writer.write(line + b'"},"token":"token-a"}\n')
    refusal = await answer(reader)
    assert error_type(refusal) == "request_too_large"
    assert refusal is not None and "must start with its token" in refusal["error"]["message"]
    assert await closes(reader) == b""
    writer.close()


async def test_a_caller_large_requests_wait_for_its_own_slots_not_for_another_callers(
    channel: Channel,
) -> None:
    # The hostile caller holds its 4 large-request slots with lines that never end (and more wait).
    hostile = []
    for _ in range(8):
        reader, writer = await connect(channel)
        writer.write(b'{"token":"token-hostile","op":"run","args":{"echo":"' + b"h" * (2 * MiB))
        hostile.append((reader, writer))
    await asyncio.sleep(0)
    assert await call(channel.runner("token-b"), "b" * (4 * MiB)) == "b" * (4 * MiB)
    for _, writer in hostile:
        writer.close()


async def test_a_connection_used_with_another_callers_token_moves_to_that_caller(channel: Channel) -> None:
    with ThreadPoolExecutor(1) as thread:  # one thread: one connection, two tokens
        assert await call(channel.runner("token-a"), "a", pool=thread) == "a"
        assert await call(channel.runner("token-b"), "b" * MiB, pool=thread) == "b" * MiB
        assert channel.channel.open_connections() == {"b": 1}


async def test_limits_are_checked_when_made() -> None:
    with pytest.raises(ValueError, match="connections_per_caller must be a positive number"):
        ChannelLimits(connections_per_caller=0)
    with pytest.raises(ValueError, match="max_request_bytes must be at least"):
        ChannelLimits(max_request_bytes=1000)


# --- item 1: connections ---------------------------------------------------------------------------------


async def test_a_callers_connection_over_its_limit_is_answered_too_many_connections_and_closed(
    channel: Channel,
) -> None:
    held = []
    for i in range(64):
        reader, writer = await connect(channel)
        writer.write(request("token-hostile", echo=i))
        assert (await answer(reader)) == {"result": i}
        held.append(writer)
    reader, writer = await connect(channel)
    writer.write(request("token-hostile", echo="one more"))
    refused = await answer(reader)
    assert error_type(refused) == "too_many_connections"
    assert refused is not None and "64 open connections" in refused["error"]["message"]
    assert await closes(reader) == b""
    # Another kernel is not affected, and the hostile one can call again once it closes one.
    assert await call(channel.runner("token-b"), "b") == "b"
    held.pop().close()
    for _ in range(100):
        if channel.channel.open_connections().get("hostile") == 63:
            break
        await asyncio.sleep(0.01)
    reader, writer = await connect(channel)
    writer.write(request("token-hostile", echo="again"))
    assert await answer(reader) == {"result": "again"}
    for held_writer in [*held, writer]:
        held_writer.close()


async def test_connections_that_send_nothing_are_capped_and_the_oldest_closed_first(channel: Channel) -> None:
    silent = [await connect(channel) for _ in range(300)]  # the default cap is 256
    oldest_reader, _ = silent[0]
    refused = json.loads(await closes(oldest_reader))
    assert refused["error"]["type"] == "too_many_connections"
    assert channel.channel.open_connections().get(None, 0) <= 256
    assert await call(channel.runner("token-b"), "b") == "b"
    for _, writer in silent:
        writer.close()


async def test_a_connection_that_sends_no_request_is_closed_after_the_first_request_deadline(
    tmp_path: Path,
) -> None:
    served = await started(tmp_path, ChannelLimits(first_request_timeout=0.2))
    try:
        reader, writer = await connect(served)
        writer.write(b'{"token":"tok')  # a start, never finished
        notice = json.loads(await closes(reader))
        assert notice["error"]["type"] == "idle_timeout"
        assert "no authenticated request within 0.2 s" in notice["error"]["message"]
        writer.close()
    finally:
        await served.channel.stop()


ATTACKER = """
import json, resource, socket, sys, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
path, silent, identified = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
held, outcomes = [], {}
def connect():
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(5)
    held.append(sock)
    deadline = time.monotonic() + 5
    while True:  # a full backlog refuses at once (EAGAIN): try again for a while, as a blocking connect would
        try:
            sock.connect(path)
            return sock
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.005)
line = json.dumps({"token": "token-hostile", "op": "run", "args": {"echo": 1}}).encode() + b"\\n"
for _ in range(silent):
    try:
        connect()
    except OSError as e:
        outcomes["connect failed"] = outcomes.get("connect failed", 0) + 1
for _ in range(identified):
    try:
        sock = connect()
        sock.sendall(line)
        reply = sock.recv(65536)
        kind = json.loads(reply).get("error", {}).get("type", "answered") if reply else "closed"
    except (OSError, ValueError) as e:
        kind = type(e).__name__
    outcomes[kind] = outcomes.get(kind, 0) + 1
print(json.dumps(outcomes), flush=True)
sys.stdin.read()
"""


@pytest.mark.integration  # starts an attacker process
async def test_a_kernel_flooding_the_channel_cannot_exhaust_descriptors_or_stop_other_kernels_calls(
    tmp_path: Path,
) -> None:
    # The attack that took `ipybox up` to its descriptor limit (~20,000 idle connections), scaled to a
    # limit lowered for this test: the channel must keep this process below it.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 400, hard))
    served: Channel | None = None
    attacker: subprocess.Popen[str] | None = None
    try:
        served = await started(tmp_path, ChannelLimits())  # its default max_connections: half the limit
        attacker = subprocess.Popen(
            [sys.executable, "-c", ATTACKER, served.path, "400", "300"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert attacker.stdout is not None
        outcomes = json.loads(await asyncio.wait_for(asyncio.to_thread(attacker.stdout.readline), 60))
        assert outcomes.get("answered") == 64 and outcomes.get("too_many_connections") == 300 - 64
        assert served.channel.open_connections()["hostile"] == 64
        with ThreadPoolExecutor(1) as fresh:  # a thread of its own: a new connection
            assert await call(served.runner("token-b"), "still served", pool=fresh) == "still served"
    finally:
        if attacker is not None:
            attacker.kill()
            attacker.communicate(timeout=GUARD)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        if served is not None:
            await served.channel.stop()


# --- item 1: idle connections and the kernel's transparent reconnect ------------------------------------


async def wait_for_no_connections(served: Channel) -> None:
    for _ in range(GUARD * 100):
        if not served.channel.open_connections():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"connections still open: {served.channel.open_connections()}")


async def test_an_idle_connection_is_closed_and_the_kernel_reconnects_without_noticing(
    tmp_path: Path,
) -> None:
    served = await started(tmp_path, ChannelLimits(idle_timeout=0.2))
    try:
        with ThreadPoolExecutor(1) as thread:  # one thread: one reused connection
            assert await call(served.runner("token-a"), 1, pool=thread) == 1
            await wait_for_no_connections(served)  # closed by the channel while idle
            assert await call(served.runner("token-a"), 2, pool=thread) == 2
        assert served.runs == 2
    finally:
        await served.channel.stop()


async def test_a_request_crossing_the_idle_close_is_sent_again_once_and_runs_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served = await started(tmp_path, ChannelLimits(idle_timeout=0.2))
    # The close has not reached the kernel when it checks its connection: its request goes out on the
    # closed connection and meets the channel's `idle_timeout` line instead of an answer.
    monkeypatch.setattr(tool_runner._Connection, "stale", lambda self: False)
    try:
        with ThreadPoolExecutor(1) as thread:
            assert await call(served.runner("token-a"), 1, pool=thread) == 1
            await wait_for_no_connections(served)
            assert await call(served.runner("token-a"), 2, pool=thread) == 2
        assert served.runs == 2
    finally:
        await served.channel.stop()


async def test_a_connection_lost_during_a_call_is_an_error_and_never_a_resend(tmp_path: Path) -> None:
    served = await started(tmp_path, ChannelLimits())
    pending = asyncio.ensure_future(call(served.runner("token-a"), 1, block=True))
    for _ in range(GUARD * 100):
        if served.runs:
            break
        await asyncio.sleep(0.01)
    await served.channel.stop()  # the call may have run: the kernel must not send it again
    with pytest.raises(ToolRunnerError, match="connection"):
        await pending
    assert served.runs == 1


async def test_a_blocked_call_does_not_count_as_idle(tmp_path: Path) -> None:
    served = await started(tmp_path, ChannelLimits(idle_timeout=0.2))
    try:
        pending = asyncio.ensure_future(call(served.runner("token-a"), "slow", block=True))
        await asyncio.sleep(0.5)  # longer than the idle timeout, while the call runs
        served.release.set()
        assert await pending == "slow"
        assert served.runs == 1
    finally:
        await served.channel.stop()


def test_requests_start_with_their_token() -> None:
    # What lets the channel charge a large request to its caller before reading it all.
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path = Path(f"/tmp/ipybox-test-{os.getpid()}-{threading.get_ident()}.sock")
    server.bind(str(path))
    server.listen()
    try:
        sent: list[bytes] = []

        def serve() -> None:
            conn, _ = server.accept()
            sent.append(conn.recv(65536))
            conn.sendall(b'{"result":null}\n')
            conn.close()

        thread = threading.Thread(target=serve)
        thread.start()
        ToolRunner("s", address=f"unix:{path}", token="tok").run_sync("t", {"a": 1})
        thread.join(GUARD)
        assert sent[0].startswith(b'{"token":"tok",')
    finally:
        server.close()
        path.unlink(missing_ok=True)


def channel_tasks(others: Collection[asyncio.Task[object]] = ()) -> list[asyncio.Task[object]]:
    """The call channel's background tasks in this loop: its group's host, the sweep, the watchers; but
    `others` (those of channels the worker's other tests hold open on the shared loop)."""
    names = ("ipybox-tool-call channel", "ipybox-call-channel-")
    return [task for task in asyncio.all_tasks() if task.get_name().startswith(names) and task not in others]


async def test_a_kernel_closing_its_connection_during_a_long_call_cancels_the_call(tmp_path: Path) -> None:
    cancelled = asyncio.Event()

    async def run(request: dict[str, Any]) -> dict[str, Any]:
        try:
            await asyncio.sleep(GUARD)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return {"result": "late"}

    others = channel_tasks()
    channel = CallChannel(TOKENS.get, {"run": run})
    address = await channel.start(unix_socket=tmp_path / "calls.sock")
    try:
        _, writer = await asyncio.open_unix_connection(address.removeprefix("unix:"))
        writer.write(request("token-a", echo="slow"))
        await writer.drain()
        for _ in range(GUARD * 10):  # watched after a second (the sweep's `_WATCH_AFTER`)
            if any(task.get_name() == "ipybox-call-channel-watch" for task in channel_tasks(others)):
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the long call was never watched")
        writer.close()  # what `ToolRunner` does when its cell is interrupted during the call
        await asyncio.wait_for(cancelled.wait(), GUARD)
    finally:
        await channel.stop()
    assert channel_tasks(others) == []


async def test_stopping_during_a_watched_call_ends_the_sweep_and_the_watcher_before_it_returns(
    tmp_path: Path,
) -> None:
    others = channel_tasks()
    served = await started(tmp_path, ChannelLimits())
    reader, writer = await connect(served)
    writer.write(request("token-a", echo="blocked", block=True))
    await writer.drain()
    for _ in range(GUARD * 10):
        if any(task.get_name() == "ipybox-call-channel-watch" for task in channel_tasks(others)):
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("the long call was never watched")
    assert {task.get_name() for task in channel_tasks(others)} == {
        "ipybox-tool-call channel",
        "ipybox-call-channel-sweep",
        "ipybox-call-channel-watch",
    }
    await served.channel.stop()
    assert channel_tasks(others) == []
    assert await closes(reader) == b""  # the call's connection is closed, its answer never sent
    writer.close()
