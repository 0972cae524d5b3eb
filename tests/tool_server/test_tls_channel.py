"""The call channel's TLS listener, from the kernel's side and from an attacker's.

A real `CallChannel` (in process, an echo handler: the channel's own behaviour needs no MCP server) and
the real `ToolRunner`, which pins the listener's certificate; attackers speak raw sockets or TLS with
certificates of their own. The end-to-end case runs a real tool of the `everything` server through a
real `ToolServer`.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import select
import socket
import ssl
import time
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from ipybox.asgi_server import ListenError
from ipybox.in_kernel import tool_runner
from ipybox.in_kernel.tool_runner import ToolRunner, ToolRunnerError
from ipybox.tool_server.call_channel import CallChannel, ChannelLimits
from ipybox.tool_server.remote_calls import RemoteCalls
from ipybox.tool_server.tls import ChannelCertificate, load_certificate, workspace_certificate
from ipybox.tool_server.tool_server import ToolServer
from tests.servers import params
from tests.servers.processes import tagged
from tests.tool_server.conftest import TAG

TOKENS = {"token-a": "a", "token-b": "b"}
GUARD = 30  # seconds: only against a hang, never an assertion on speed


class Served:
    """A started `CallChannel` on a Unix socket and on TLS; its `run` echoes `args["echo"]`, counting runs."""

    def __init__(self, certificate: ChannelCertificate, limits: ChannelLimits | None = None) -> None:
        self.certificate = certificate
        self.runs = 0
        self.channel = CallChannel(TOKENS.get, {"run": self._run}, limits)
        self.unix = ""
        self.tls = ""

    async def _run(self, request: dict[str, Any]) -> dict[str, Any]:
        self.runs += 1
        return {"result": (request.get("args") or {}).get("echo")}

    async def start(self, tmp_path: Path) -> Served:
        self.unix = await self.channel.start(unix_socket=tmp_path / "calls.sock")
        self.tls = await self.channel.listen_tls("127.0.0.1", 0, self.certificate)
        return self

    @property
    def port(self) -> int:
        return int(self.tls.rpartition(":")[2])

    def runner(
        self, token: str = "token-a", cert: str | None = None, address: str | None = None
    ) -> ToolRunner:
        return ToolRunner(
            "s",
            address=address or self.tls,
            token=token,
            cert=cert if cert is not None else self.certificate.cert_pem,
        )


@pytest.fixture
def certificate(tmp_path: Path) -> ChannelCertificate:
    return workspace_certificate(tmp_path / "tls", "127.0.0.1")


@pytest.fixture
async def served(tmp_path: Path, certificate: ChannelCertificate) -> AsyncIterator[Served]:
    channel = await Served(certificate).start(tmp_path)
    yield channel
    await channel.channel.stop()


@pytest.fixture
def thread() -> Iterator[ThreadPoolExecutor]:
    """One thread: the kernel's connection per thread is reused from call to call."""
    with ThreadPoolExecutor(1) as pool:
        yield pool


async def call(runner: ToolRunner, echo: Any, pool: ThreadPoolExecutor | None = None) -> Any:
    run = asyncio.get_running_loop().run_in_executor(pool, runner.run_sync, "t", {"echo": echo})
    return await asyncio.wait_for(run, GUARD)


def request_line(token: str, **args: Any) -> bytes:
    line = {"token": token, "op": "run", "server": "s", "tool": "t", "args": args}
    return json.dumps(line).encode() + b"\n"


# --- a kernel pinning the certificate --------------------------------------------------------------------


async def test_a_kernel_pinning_the_certificate_calls_over_tls(served: Served) -> None:
    assert served.tls == f"tls://127.0.0.1:{served.port}"
    assert await call(served.runner(), "hello") == "hello"
    assert await call(served.runner(), "é" * 3) == "é" * 3
    assert served.runs == 2


async def test_the_pinned_certificate_is_read_from_the_kernels_environment(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IPYBOX_TOOL_SERVER", served.tls)
    monkeypatch.setenv("IPYBOX_TOOL_TOKEN", "token-b")
    monkeypatch.setenv("IPYBOX_TOOL_CERT", served.certificate.cert_pem)
    assert await call(ToolRunner("s"), 7) == 7


async def test_large_requests_and_answers_cross_tls_whole(served: Served) -> None:
    message = "".join(f"{i:08d}" for i in range(400_000))  # 3.2 MB: many TLS records each way
    assert await call(served.runner(), message) == message


async def test_one_thread_keeps_one_tls_connection_across_calls(
    served: Served, thread: ThreadPoolExecutor
) -> None:
    for i in range(20):
        assert await call(served.runner(), i, thread) == i
    assert served.channel.open_connections() == {"a": 1}


async def test_an_idle_tls_connection_is_closed_and_the_kernel_reconnects_without_noticing(
    tmp_path: Path, certificate: ChannelCertificate, thread: ThreadPoolExecutor
) -> None:
    served = await Served(certificate, ChannelLimits(idle_timeout=0.2)).start(tmp_path)
    try:
        assert await call(served.runner(), 1, thread) == 1
        await wait_for_no_connections(served)  # closed by the channel while idle
        assert await call(served.runner(), 2, thread) == 2
        assert served.runs == 2
    finally:
        await served.channel.stop()


async def test_a_request_crossing_the_idle_close_over_tls_is_sent_again_once_and_runs_once(
    tmp_path: Path,
    certificate: ChannelCertificate,
    thread: ThreadPoolExecutor,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    served = await Served(certificate, ChannelLimits(idle_timeout=0.2)).start(tmp_path)
    # The close has not reached the kernel when it checks its connection: its request goes out on the
    # closed connection and meets the channel's `idle_timeout` line instead of an answer.
    monkeypatch.setattr(tool_runner._Connection, "stale", lambda self: False)
    try:
        assert await call(served.runner(), 1, thread) == 1
        await wait_for_no_connections(served)
        assert await call(served.runner(), 2, thread) == 2
        assert served.runs == 2
    finally:
        await served.channel.stop()


async def wait_for_no_connections(served: Served) -> None:
    for _ in range(GUARD * 100):
        if not served.channel.open_connections():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"connections still open: {served.channel.open_connections()}")


def test_an_idle_connection_holding_a_tls_record_without_data_is_not_taken_for_closed(tmp_path: Path) -> None:
    # A TLS 1.3 server may send records that carry no data after the handshake (session tickets, which
    # the channel does not send, but another server in between might): the socket is readable, yet
    # nobody closed it.
    certificate = workspace_certificate(tmp_path, "127.0.0.1")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certificate.cert_path, certificate.key_path)
    assert context.num_tickets > 0
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    with ThreadPoolExecutor(1) as pool:
        accepted = pool.submit(lambda: context.wrap_socket(listener.accept()[0], server_side=True))
        conn = tool_runner._Connection(f"tls://127.0.0.1:{port}", None, certificate.cert_pem)
        server_side = accepted.result(GUARD)
    try:
        readable, _, _ = select.select([conn.sock], [], [], GUARD)
        assert readable  # the tickets
        assert not conn.stale()
        server_side.sendall(b'{"error":{"type":"idle_timeout","message":"closed"}}\n')
        server_side.close()
        select.select([conn.sock], [], [], GUARD)
        assert conn.stale()
    finally:
        conn.close()
        listener.close()


# --- attackers -------------------------------------------------------------------------------------------


def other_certificate(tmp_path: Path) -> ChannelCertificate:
    return workspace_certificate(tmp_path / "other", "127.0.0.1")


async def test_a_kernel_pinning_another_certificate_sends_nothing(served: Served, tmp_path: Path) -> None:
    impostor_pin = other_certificate(tmp_path).cert_pem
    with pytest.raises(ToolRunnerError, match="did not present the certificate this kernel pins"):
        await call(served.runner(cert=impostor_pin), "x")
    assert served.runs == 0


async def test_a_server_presenting_another_certificate_never_gets_the_token(
    tmp_path: Path, certificate: ChannelCertificate
) -> None:
    # An impostor listening where the kernel dials: the kernel pins the real certificate.
    seen: list[str] = []
    impostor = CallChannel(lambda token: seen.append(token) or "x", {"run": _echo})
    await impostor.start(unix_socket=tmp_path / "impostor.sock")
    address = await impostor.listen_tls("127.0.0.1", 0, other_certificate(tmp_path))
    try:
        runner = ToolRunner("s", address=address, token="token-a", cert=certificate.cert_pem)
        with pytest.raises(ToolRunnerError, match="did not present the certificate this kernel pins"):
            await call(runner, "x")
        assert seen == []
    finally:
        await impostor.stop()


async def _echo(request: dict[str, Any]) -> dict[str, Any]:
    return {"result": None}


def ca_and_leaf(tmp_path: Path) -> tuple[str, ChannelCertificate]:
    """A CA certificate (what the kernel pins) and a server certificate its key signed (what the server
    presents): trusted by a context that trusts the CA, yet not the pinned certificate."""
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "pinned")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "signed by the pinned key")]))
        .issuer_name(ca_name)
        .public_key(leaf_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    (tmp_path / "leaf.pem").write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "leaf.key").write_bytes(
        leaf_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    ca_pem = ca.public_bytes(serialization.Encoding.PEM).decode()
    return ca_pem, load_certificate(tmp_path / "leaf.pem", tmp_path / "leaf.key")


def handshake(context: ssl.SSLContext, port: int) -> bool:
    """Whether a TLS client with `context` completes a handshake with the listener on `port`."""
    with socket.create_connection(("127.0.0.1", port), timeout=GUARD) as raw, context.wrap_socket(raw) as tls:
        return tls.getpeercert(binary_form=True) is not None


async def test_a_certificate_signed_by_the_pinned_ones_key_is_refused_by_the_pin(tmp_path: Path) -> None:
    pinned_ca, signed = ca_and_leaf(tmp_path)
    # The chain itself verifies: a context trusting the pinned certificate accepts the signed one.
    trusting = ssl.create_default_context(cadata=pinned_ca)
    trusting.check_hostname = False
    served = await Served(signed).start(tmp_path)
    try:
        assert await asyncio.to_thread(handshake, trusting, served.port)
        # The kernel compares the fingerprint too.
        with pytest.raises(
            ToolRunnerError, match="presented a certificate other than the one this kernel pins"
        ):
            await call(served.runner(cert=pinned_ca), "x")
        assert served.runs == 0
    finally:
        await served.channel.stop()


def plain_tcp_exchange(port: int, line: bytes) -> bytes:
    """What the TLS port answers a plain-TCP client sending a request line, until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=GUARD) as sock:
        sock.sendall(line)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
        return received


async def test_a_plain_tcp_client_gets_nothing_and_the_channel_keeps_serving(served: Served) -> None:
    answer = await asyncio.to_thread(plain_tcp_exchange, served.port, request_line("token-a", echo="x"))
    assert b"result" not in answer and b"token" not in answer
    assert served.runs == 0
    assert await call(served.runner(), "still serving") == "still serving"


async def test_a_wrong_token_over_tls_gets_the_same_error_as_on_the_unix_socket(served: Served) -> None:
    errors = []
    for address in (served.tls, served.unix):
        with pytest.raises(ToolRunnerError) as raised:
            await call(served.runner(token="stolen", address=address), "x")
        errors.append(str(raised.value))
    assert errors[0] == errors[1] == "the ipybox tool server rejected this kernel's token"
    assert served.runs == 0


def closed_by_peer(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except ConnectionError:
        return True


async def test_connections_that_never_finish_a_handshake_are_capped_and_closed(
    tmp_path: Path, certificate: ChannelCertificate
) -> None:
    # Counted from accept(), before any handshake: the oldest beyond the cap are closed at once, not
    # when their handshake times out.
    limits = ChannelLimits(unidentified_connections=4, first_request_timeout=3.0)
    served = await Served(certificate, limits).start(tmp_path)
    silent = [socket.create_connection(("127.0.0.1", served.port)) for _ in range(20)]
    try:
        await asyncio.sleep(0.5)
        assert served.channel.open_connections() == {None: 4}
        assert [closed_by_peer(sock) for sock in silent] == [True] * 16 + [False] * 4
        assert await call(served.runner(), "through") == "through"
        await asyncio.sleep(limits.first_request_timeout + 1)
        assert served.channel.open_connections() == {"a": 1}  # the silent ones timed out
    finally:
        for sock in silent:
            sock.close()
        await served.channel.stop()


def silent_tls_peer(certificate: ChannelCertificate, port: int) -> tuple[bytes, float]:
    """A TLS client that handshakes, sends nothing and never answers the channel's close: what it reads
    until the close_notify, and the seconds until the channel's socket is gone (FIN or RST)."""
    context = ssl.create_default_context(cadata=certificate.cert_pem)
    context.check_hostname = False
    with socket.create_connection(("127.0.0.1", port), timeout=GUARD) as raw:
        tls = context.wrap_socket(raw)
        received = b""
        while chunk := tls.recv(65536):  # until the channel's close_notify, which this peer does not answer
            received += chunk
        start = time.monotonic()
        tcp = socket.socket(fileno=os.dup(tls.fileno()))
        tcp.settimeout(GUARD)
        try:
            tcp.recv(1)
        except ConnectionResetError:
            pass
        finally:
            tcp.close()
            tls.close()
        return received, time.monotonic() - start


async def test_a_tls_peer_that_never_answers_the_close_holds_no_socket_for_long(
    tmp_path: Path, certificate: ChannelCertificate
) -> None:
    served = await Served(certificate, ChannelLimits(first_request_timeout=0.5)).start(tmp_path)
    try:
        received, lingered = await asyncio.to_thread(silent_tls_peer, certificate, served.port)
        assert json.loads(received)["error"]["type"] == "idle_timeout"
        assert lingered < 10  # asyncio alone would wait 30 s for this peer's close_notify
    finally:
        await served.channel.stop()


async def test_stop_closes_the_tls_listener(tmp_path: Path, certificate: ChannelCertificate) -> None:
    served = await Served(certificate).start(tmp_path)
    port = served.port
    await served.channel.stop()
    assert served.channel.tls_address is None
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=GUARD).close()
    await served.channel.stop()  # idempotent


async def test_the_advertised_address_is_reported_not_the_bind(
    tmp_path: Path, certificate: ChannelCertificate
) -> None:
    channel = CallChannel(TOKENS.get, {"run": _echo})
    await channel.start(unix_socket=tmp_path / "c.sock")
    try:
        address = await channel.listen_tls("127.0.0.1", 0, certificate, advertise_host="ipybox.ns.svc")
        assert address.startswith("tls://ipybox.ns.svc:") and address == channel.tls_address
        with pytest.raises(RuntimeError, match="listens on TLS already"):
            await channel.listen_tls("127.0.0.1", 0, certificate)
    finally:
        await channel.stop()
    await channel.start(unix_socket=tmp_path / "c.sock")
    try:
        assert await channel.listen_tls("::1", 0, certificate, advertise_port=443) == "tls://[::1]:443"
    finally:
        await channel.stop()


# --- a real tool server ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
async def remote_server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ToolServer]:
    state = tmp_path_factory.mktemp("state")
    remote = RemoteCalls(certificate=workspace_certificate(state / "tls", "127.0.0.1"))
    async with ToolServer(
        servers={"everything": tagged(params.everything(), TAG)}, media_dir=state / "media", remote=remote
    ) as server:
        yield server


@pytest.mark.integration
async def test_a_tool_call_over_tls_runs_on_the_real_server(
    remote_server: ToolServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IPYBOX_TOOL_SERVER", remote_server.remote_address)
    monkeypatch.setenv("IPYBOX_TOOL_TOKEN", remote_server.add_caller("remote-kernel"))
    monkeypatch.setenv("IPYBOX_TOOL_CERT", remote_server.remote_certificate_pem)
    result = await asyncio.to_thread(ToolRunner("everything").run_sync, "echo", {"message": "over tls"})
    assert result == "Echo: over tls"
    # The listener binds loopback by default, and the Unix socket still serves local kernels.
    assert remote_server.remote_address.startswith("tls://127.0.0.1:")
    assert remote_server.calls._tls_server is not None
    assert {s.getsockname()[0] for s in remote_server.calls._tls_server.sockets} == {"127.0.0.1"}
    local = ToolRunner("everything", address=remote_server.calls_address, token=remote_server.call_token)
    assert await asyncio.to_thread(local.run_sync, "echo", {"message": "unix"}) == "Echo: unix"


async def test_a_taken_port_is_a_listen_error_and_nothing_stays_open(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as blocker:
        taken = blocker.getsockname()[1]
        remote = RemoteCalls(
            certificate=workspace_certificate(tmp_path, "127.0.0.1"), bind=f"127.0.0.1:{taken}"
        )
        server = ToolServer(remote=remote, unix_socket=tmp_path / "tools.sock")
        with pytest.raises(ListenError, match=f"cannot listen for remote kernels on 127.0.0.1:{taken}"):
            await server.start()
    assert not (tmp_path / "tools.calls.sock").exists()
    with pytest.raises((ConnectionRefusedError, FileNotFoundError)):  # the HTTP endpoints stopped too
        await asyncio.open_unix_connection(tmp_path / "tools.sock")
