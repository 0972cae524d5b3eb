"""Secrets through the DomainProxy: TLS interception with placeholder substitution, and its CA.

In one process, no kernels, with the harness of `tests.sandbox.tls_harness` (a test CA, a TLS origin on
127.0.0.1 that records every request, `http.client` through the proxy's Unix socket); the proxy allows
`localhost` (and `127.0.0.1`) exactly and verifies the origin with the test CA; the client trusts the
trust bundle, as a sandboxed client trusts it through `SSL_CERT_FILE`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import http.client
import ipaddress
import logging
import os
import shutil
import socket
import ssl
import stat
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from ipybox.sandbox.interception import (
    CA_CERT_FILE,
    CA_KEY_FILE,
    InterceptionCA,
    InterceptionError,
    SecretRoute,
    trust_bundle,
    trust_env,
    write_ca_file,
)
from ipybox.sandbox.netbridge import pipe
from ipybox.sandbox.proxy import DomainProxy
from tests.sandbox.tls_harness import (
    CHUNKS,
    NOW,
    Origin,
    fetch,
    https_through,
    key_pem,
    make_cert,
    pem,
    raw_exchange_through,
    start_origin,
    tunnel,
)

PLACEHOLDER = "ipybox-secret-github-5f2c9a0d1e7b"
VALUE = "ghp_the-real-github-token-0123456789"
OTHER_PLACEHOLDER = "ipybox-secret-gitlab-8c1d4e6f2a90"
OTHER_VALUE = "glpat-the-real-gitlab-token-9876543210"


# -- certificates


def _handshake(server: ssl.SSLContext, ca_pem: bytes, host: str) -> str:
    """`ok`, or why a client trusting `ca_pem` alone refuses what `server` presents as `host`."""
    client = ssl.create_default_context(cadata=ca_pem.decode())
    server_end, client_end = socket.socketpair()
    server_end.settimeout(10)
    client_end.settimeout(10)

    def serve() -> None:
        try:
            server.wrap_socket(server_end, server_side=True).close()
        except (OSError, ssl.SSLError):
            server_end.close()

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        client.wrap_socket(client_end, server_hostname=host).close()
        return "ok"
    except ssl.SSLCertVerificationError as e:
        return str(e.verify_message)
    finally:
        client_end.close()
        thread.join()


@dataclass
class World:
    proxy: DomainProxy
    origin: Origin
    ca: InterceptionCA
    bundle: Path
    test_ca_pem: bytes
    directory: Path

    @property
    def socket_path(self) -> Path:
        assert self.proxy.unix_socket is not None
        return self.proxy.unix_socket


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    served = await start_origin(tmp_path)
    ca = InterceptionCA.load_or_create(tmp_path / "ca", ["localhost", "gitlab.example"])
    secrets = [
        SecretRoute("github", PLACEHOLDER, VALUE, ("localhost",), frozenset({"authorization"})),
        SecretRoute("gitlab", OTHER_PLACEHOLDER, OTHER_VALUE, ("gitlab.example",)),
    ]
    bundle = trust_bundle(ca, tmp_path / "sandbox" / "bundle.pem")
    async with DomainProxy(
        ["localhost", "127.0.0.1"], secrets=secrets, ca=ca, upstream_context=served.upstream_context()
    ) as proxy:
        await proxy.start(tmp_path / "proxy.sock")
        yield World(proxy, served.origin, ca, bundle, served.test_ca_pem, tmp_path)
    served.close()


# -- the client


def https(world: World, host: str = "localhost", cafile: Path | None = None) -> http.client.HTTPConnection:
    """An `http.client` connection to the origin through the proxy, trusting `cafile` (the bundle)."""
    return https_through(world.socket_path, host, world.origin.port, cafile or world.bundle)


def raw_exchange(world: World, request: bytes) -> bytes:
    """Send `request` as bytes over an intercepted connection; everything until the proxy closes it."""
    return raw_exchange_through(world.socket_path, "localhost", world.origin.port, world.bundle, request)


def head(world: World, extra: str) -> bytes:
    return f"GET /raw HTTP/1.1\r\nHost: localhost:{world.origin.port}\r\n{extra}\r\n".encode()


# -- substitution


async def test_the_origin_gets_the_value_where_the_kernel_sent_the_placeholder(world: World) -> None:
    def run() -> tuple[int, bytes]:
        connection = https(world)
        status, body, _ = fetch(connection, "GET", "/api", {"Authorization": f"Bearer {PLACEHOLDER}"})
        connection.close()
        return status, body

    status, body = await asyncio.to_thread(run)
    assert status == 200 and body.startswith(b"GET /api body=0")
    [seen] = world.origin.seen
    assert f"Authorization: Bearer {VALUE}\r\n" in seen.head.decode()
    assert PLACEHOLDER not in seen.head.decode()


async def test_basic_credentials_carry_the_value_too(world: World) -> None:
    import base64

    credentials = base64.b64encode(f"x-access-token:{PLACEHOLDER}".encode()).decode()

    def run() -> int:
        connection = https(world)
        status, _, _ = fetch(
            connection, "GET", "/repo.git/info/refs", {"Authorization": f"Basic {credentials}"}
        )
        connection.close()
        return status

    assert await asyncio.to_thread(run) == 200
    sent = world.origin.seen[0].head.decode().split("Authorization: Basic ")[1].split("\r\n")[0]
    assert base64.b64decode(sent).decode() == f"x-access-token:{VALUE}"


async def test_requests_and_answers_pass_intact_on_one_connection(world: World) -> None:
    def run() -> list[tuple[int, bytes, str | None]]:
        connection = https(world)
        answers = []
        for method, path, body in [
            ("GET", "/chunked", None),
            ("GET", "/sized", None),
            ("POST", "/upload-chunked", [b"part one|", b"part two|", b"y" * 100_000]),
            ("POST", "/upload-sized", b"z" * 150_000),
            ("HEAD", "/head", None),
            ("GET", "/chunked", None),
        ]:
            status, data, response = fetch(connection, method, path, {"Authorization": PLACEHOLDER}, body)
            answers.append((status, data, response.getheader("Content-Length")))
        connection.close()
        return answers

    answers = await asyncio.to_thread(run)
    assert [status for status, _, _ in answers] == [200] * 6
    assert answers[0][1] == answers[5][1] == b"".join(CHUNKS)
    assert answers[1][1] == b"GET /sized body=0 conn=1"
    assert answers[2][1] == b"POST /upload-chunked body=100018 conn=1"
    assert answers[3][1] == b"POST /upload-sized body=150000 conn=1"
    assert answers[4][1] == b"" and answers[4][2] == str(len(b"HEAD /head body=0 conn=1"))
    assert {seen.connection for seen in world.origin.seen} == {1}  # one connection to the origin throughout
    assert world.origin.seen[2].body == b"part one|part two|" + b"y" * 100_000
    assert all(f"Authorization: {VALUE}\r\n" in seen.head.decode() for seen in world.origin.seen)


async def test_a_placeholder_outside_the_allowed_headers_stays_a_placeholder(world: World) -> None:
    def run() -> int:
        connection = https(world)
        status, _, _ = fetch(
            connection,
            "POST",
            f"/p/{PLACEHOLDER}?q={PLACEHOLDER}",
            {"X-Token": PLACEHOLDER},
            PLACEHOLDER.encode(),
        )
        connection.close()
        return status

    assert await asyncio.to_thread(run) == 200
    [seen] = world.origin.seen
    text = seen.head.decode()
    assert text.startswith(f"POST /p/{PLACEHOLDER}?q={PLACEHOLDER} HTTP/1.1\r\n")
    assert f"X-Token: {PLACEHOLDER}\r\n" in text  # the secret may go in Authorization only
    assert seen.body == PLACEHOLDER.encode() and VALUE not in text


# -- refusals


async def test_the_placeholder_of_another_hosts_secret_is_refused(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="ipybox.sandbox.proxy"):
        answer = await asyncio.to_thread(
            raw_exchange, world, head(world, f"Authorization: Bearer {OTHER_PLACEHOLDER}\r\n")
        )
    assert answer.startswith(b"HTTP/1.1 403 ")
    assert b"'gitlab'" in answer and b"localhost" in answer and b"gitlab.example" in answer
    assert OTHER_VALUE.encode() not in answer and OTHER_VALUE not in caplog.text
    assert "secret 'gitlab'" in caplog.text and world.origin.seen == []


async def test_a_host_header_for_another_host_is_misdirected(world: World) -> None:
    for host in ("gitlab.example", f"localhost:{world.origin.port + 1}"):
        answer = await asyncio.to_thread(
            raw_exchange,
            world,
            f"GET / HTTP/1.1\r\nHost: {host}\r\nAuthorization: {PLACEHOLDER}\r\n\r\n".encode(),
        )
        assert answer.startswith(b"HTTP/1.1 421 ") and host.encode() in answer
    assert world.origin.seen == []


@pytest.mark.parametrize(
    ("extra", "status", "why"),
    [
        (
            "Content-Length: 3\r\nTransfer-Encoding: chunked\r\n",
            b"400",
            b"both Content-Length and Transfer-Encoding",
        ),
        ("Content-Length: 3\r\nContent-Length: 3\r\n", b"400", b"repeated or malformed Content-Length"),
        ("Content-Length: 3, 3\r\n", b"400", b"repeated or malformed Content-Length"),
        ("Content-Length: +3\r\n", b"400", b"repeated or malformed Content-Length"),
        ("Transfer-Encoding: gzip, chunked\r\n", b"501", b"only 'chunked'"),
        ("X-Folded: a\r\n b\r\n", b"400", b"obsolete line folding"),
        ("X-Bare: a\nTransfer-Encoding: chunked\r\n", b"400", b"bare CR or LF"),
        ("Bad Name: a\r\n", b"400", b"malformed header line"),
        ("Upgrade: websocket\r\nConnection: Upgrade\r\n", b"501", b"no protocol upgrades"),
        (f"X-Huge: {'h' * 70_000}\r\n", b"431", b"larger than 64 KiB"),
    ],
)
async def test_requests_an_origin_could_frame_otherwise_are_refused(
    world: World, extra: str, status: bytes, why: bytes
) -> None:
    answer = await asyncio.to_thread(raw_exchange, world, head(world, extra) + b"abc")
    assert answer.split(b" ")[1] == status and why in answer, answer
    assert world.origin.seen == []


async def test_a_placeholder_in_plain_http_is_refused(
    world: World, host_http_server: int, caplog: pytest.LogCaptureFixture
) -> None:
    async def send(request: bytes) -> bytes:
        reader, writer = await asyncio.open_unix_connection(world.socket_path)
        writer.write(request)
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        return answer

    url = f"http://localhost:{host_http_server}"
    with caplog.at_level(logging.WARNING, logger="ipybox.sandbox.proxy"):
        refused = await send(f"GET {url}/x HTTP/1.1\r\nAuthorization: token {PLACEHOLDER}\r\n\r\n".encode())
    assert refused.startswith(b"HTTP/1.1 403 ") and b"clear text" in refused and b"'github'" in refused
    assert "plain http://" in caplog.text and VALUE not in caplog.text
    refused = await send(f"GET {url}/{OTHER_PLACEHOLDER} HTTP/1.1\r\n\r\n".encode())
    assert refused.startswith(b"HTTP/1.1 403 ") and b"'gitlab'" in refused
    served = await send(f"GET {url}/fine HTTP/1.1\r\n\r\n".encode())
    assert served.startswith(b"HTTP/1.0 200") and b"GET /fine" in served


# -- connection handling


async def test_the_client_sees_the_origin_close_an_idle_connection(world: World) -> None:
    def run() -> bytes:
        connection = https(world)
        fetch(connection, "GET", "/then-idle-close")
        assert connection.sock is not None
        connection.sock.settimeout(5)
        try:
            return bytes(connection.sock.recv(1))  # the origin closed after 0.2 s: so does the proxy
        finally:
            connection.close()

    assert await asyncio.to_thread(run) == b""


async def test_connection_close_ends_the_connection(world: World) -> None:
    answer = await asyncio.to_thread(
        raw_exchange, world, head(world, "Connection: close\r\n") + head(world, "")
    )
    assert answer.count(b"HTTP/1.1 200 OK") == 1 and len(world.origin.seen) == 1


async def test_pipelined_and_interim_answers_are_relayed_in_order(world: World) -> None:
    def run() -> bytes:
        raw = tunnel(world.socket_path, f"localhost:{world.origin.port}")
        context = ssl.create_default_context(cafile=world.bundle)
        with context.wrap_socket(raw, server_hostname="localhost") as tls:
            tls.sendall(head(world, "") + head(world, ""))  # two requests in one write
            upload = head(world, "Expect: 100-continue\r\nContent-Length: 5\r\n").replace(b"GET", b"PUT")
            answer = b""
            while answer.count(b"GET /raw body=0 conn=1") < 2:
                answer += tls.recv(65536)
            tls.sendall(upload)
            interim = tls.recv(65536)
            assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"  # before the body was sent
            tls.sendall(b"hello" + head(world, "Connection: close\r\n"))
            while data := tls.recv(65536):
                answer += data
            return answer

    answer = await asyncio.to_thread(run)
    assert answer.count(b"HTTP/1.1 200 OK") == 4 and b"PUT /raw body=5 conn=1" in answer
    assert answer.index(b"GET /raw body=0") < answer.index(b"PUT /raw body=5")
    assert [seen.body for seen in world.origin.seen] == [b"", b"", b"hello", b""]


async def test_an_answer_delimited_by_the_origin_closing_ends_the_connection(world: World) -> None:
    request = head(world, "").replace(b"/raw", b"/close-delimited") + head(world, "")
    answer = await asyncio.to_thread(raw_exchange, world, request)  # returns when the proxy closes
    assert answer == b"HTTP/1.1 200 OK\r\n\r\nuntil the origin closes" and len(world.origin.seen) == 1


async def test_a_host_without_secrets_is_tunnelled_untouched(world: World) -> None:
    def run() -> tuple[int, bytes, str]:
        connection = https(world, "127.0.0.1", cafile=world.directory / "test-ca.pem")
        status, body, _ = fetch(connection, "GET", f"/{PLACEHOLDER}", {"Authorization": PLACEHOLDER})
        assert isinstance(connection.sock, ssl.SSLSocket)
        der = connection.sock.getpeercert(binary_form=True)
        assert der is not None
        connection.close()
        return status, body, x509.load_der_x509_certificate(der).issuer.rfc4514_string()

    (world.directory / "test-ca.pem").write_bytes(world.test_ca_pem)
    status, _, issuer = await asyncio.to_thread(run)
    assert status == 200 and issuer == "CN=ipybox test CA"  # the origin's own certificate
    [seen] = world.origin.seen
    assert f"Authorization: {PLACEHOLDER}\r\n" in seen.head.decode()


async def test_a_client_that_does_not_trust_the_ca_is_told_by_its_tls(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    test_ca = world.directory / "test-ca.pem"
    test_ca.write_bytes(world.test_ca_pem)
    with caplog.at_level(logging.INFO, logger="ipybox.sandbox.proxy"):
        with pytest.raises(ssl.SSLCertVerificationError):
            await asyncio.to_thread(
                https, world, "localhost", test_ca
            )  # the origin's CA, not the workspace's
        for _ in range(100):
            if "interception CA" in caplog.text:
                break
            await asyncio.sleep(0.05)
    assert "TLS with a sandboxed client for localhost failed" in caplog.text and world.origin.seen == []


async def test_an_origin_that_fails_verification_is_a_502(world: World, tmp_path: Path) -> None:
    async with DomainProxy(
        ["localhost"],
        secrets=world.proxy.secrets,
        ca=world.ca,
        upstream_context=ssl.create_default_context(),  # the system's CAs: not the test CA
    ) as proxy:
        await proxy.start(tmp_path / "strict.sock")
        reader, writer = await asyncio.open_unix_connection(tmp_path / "strict.sock")
        writer.write(f"CONNECT localhost:{world.origin.port} HTTP/1.1\r\n\r\n".encode())
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
    assert answer.startswith(b"HTTP/1.1 502 ") and b"certificate verify failed" in answer


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl on this machine")
async def test_curl_gets_the_secret_substituted(world: World) -> None:
    async def bridge(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # What ipybox.sandbox.netbridge does inside the sandbox: TCP to the proxy's Unix socket.
        upstream_reader, upstream_writer = await asyncio.open_unix_connection(world.socket_path)
        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))
        upstream_writer.close()
        writer.close()

    server = await asyncio.start_server(bridge, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    url = f"https://localhost:{world.origin.port}"
    env = {"PATH": os.environ["PATH"], **trust_env(world.bundle, world.ca.cert_path)}
    process = await asyncio.create_subprocess_exec(
        *("curl", "-sS", "--proxy", f"http://127.0.0.1:{port}", "-H", f"Authorization: Bearer {PLACEHOLDER}"),
        *(f"{url}/one", f"{url}/chunked"),  # two requests, one connection
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    out, err = await asyncio.wait_for(process.communicate(), 30)
    server.close()
    assert process.returncode == 0, err
    assert out == b"GET /one body=0 conn=1" + b"".join(CHUNKS)
    assert all(f"Authorization: Bearer {VALUE}" in h for h in world.origin.heads())


# -- the CA


async def test_the_ca_signs_only_for_the_secret_hosts(world: World) -> None:
    ca_pem = world.ca.ca_pem()
    assert (
        await asyncio.to_thread(_handshake, world.ca.leaf_context("localhost"), ca_pem, "localhost") == "ok"
    )
    with pytest.raises(ValueError, match=r"not evil\.example"):
        world.ca.leaf_context("evil.example")
    # Its key, leaked, signs certificates a client still refuses for any other name.
    key = serialization.load_pem_private_key((world.directory / "ca" / CA_KEY_FILE).read_bytes(), None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    ca_cert = x509.load_pem_x509_certificate(ca_pem)
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    for name in ("evil.example", "localhost.evil.example", "127.0.0.1"):
        general: x509.GeneralName = (
            x509.IPAddress(ipaddress.ip_address(name)) if name[0].isdigit() else x509.DNSName(name)
        )
        forged = make_cert(x509.Name([]), leaf_key, ca_cert.subject, key, [general])
        (world.directory / "forged.pem").write_bytes(pem(forged) + key_pem(leaf_key))
        server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server.load_cert_chain(world.directory / "forged.pem")
        assert "subtree violation" in await asyncio.to_thread(_handshake, server, ca_pem, name)


def test_wildcards_and_addresses_are_constrained_as_matched(tmp_path: Path) -> None:
    ca = InterceptionCA.load_or_create(tmp_path, ["*.example.com", "10.1.2.3"])
    assert ca.hosts == ("*.example.com", "10.1.2.3")
    assert _handshake(ca.leaf_context("api.example.com"), ca.ca_pem(), "api.example.com") == "ok"
    assert _handshake(ca.leaf_context("10.1.2.3"), ca.ca_pem(), "10.1.2.3") == "ok"
    for host in ("example.com", "10.1.2.4", "api.example.org"):
        with pytest.raises(ValueError):
            ca.leaf_context(host)
    constraints = x509.load_pem_x509_certificate(ca.ca_pem()).extensions.get_extension_for_class(
        x509.NameConstraints
    )
    assert constraints.critical
    assert set(constraints.value.permitted_subtrees or []) == {
        x509.DNSName(".example.com"),
        x509.IPAddress(ipaddress.ip_network("10.1.2.3/32")),
    }


def test_leaf_contexts_are_kept_per_host(tmp_path: Path) -> None:
    ca = InterceptionCA.load_or_create(tmp_path, ["*.example.com"])
    first = ca.leaf_context("a.example.com")
    assert ca.leaf_context("A.Example.com.") is first
    for n in range(64):
        ca.leaf_context(f"h{n}.example.com")
    assert ca.leaf_context("a.example.com") is not first  # the least recently used went
    later = NOW + dt.timedelta(days=29, hours=12)  # a day before the leaf expires: minted again
    before = ca.leaf_context("h63.example.com")
    assert ca.leaf_context("h63.example.com", now=later) is not before


def test_the_ca_is_kept_and_made_anew_when_it_must_be(tmp_path: Path) -> None:
    first = InterceptionCA.load_or_create(tmp_path, ["localhost", "*.github.com"])
    key_file, cert_file = tmp_path / CA_KEY_FILE, tmp_path / CA_CERT_FILE
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(cert_file.stat().st_mode) == 0o644
    assert stat.S_IMODE(tmp_path.stat().st_mode) == 0o700
    again = InterceptionCA.load_or_create(tmp_path, ["*.github.com", "LOCALHOST"])
    assert again.ca_pem() == first.ca_pem()
    other_hosts = InterceptionCA.load_or_create(tmp_path, ["localhost"])
    assert other_hosts.ca_pem() != first.ca_pem() and other_hosts.hosts == ("localhost",)
    late = InterceptionCA.load_or_create(tmp_path, ["localhost"], now=NOW + dt.timedelta(days=340))
    assert late.ca_pem() != other_hosts.ca_pem()
    os.chmod(key_file, 0o640)
    assert InterceptionCA.load_or_create(tmp_path, ["localhost"]).ca_pem() != late.ca_pem()
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600


def test_a_symlinked_key_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "ca"
    InterceptionCA.load_or_create(directory, ["localhost"])
    (tmp_path / "elsewhere.pem").write_bytes((directory / CA_KEY_FILE).read_bytes())
    (directory / CA_KEY_FILE).unlink()
    (directory / CA_KEY_FILE).symlink_to(tmp_path / "elsewhere.pem")
    with pytest.raises(InterceptionError, match="is a symlink"):
        InterceptionCA.load_or_create(directory, ["localhost"])
    assert (directory / CA_KEY_FILE).is_symlink()  # refused, not replaced


@pytest.mark.root_only
@pytest.mark.skipif(os.geteuid() != 0, reason="handing a file to another user takes root")
def test_another_users_key_is_refused(tmp_path: Path) -> None:
    InterceptionCA.load_or_create(tmp_path, ["localhost"])
    os.chown(tmp_path / CA_KEY_FILE, 65534, 65534)
    with pytest.raises(InterceptionError, match="owned by uid 65534"):
        InterceptionCA.load_or_create(tmp_path, ["localhost"])


def test_trust_bundle_and_environment(tmp_path: Path) -> None:
    ca = InterceptionCA.load_or_create(tmp_path / "ca", ["localhost"])
    bundle = trust_bundle(ca, tmp_path / "trust" / "bundle.pem")
    data = bundle.read_bytes()
    assert data.endswith(ca.ca_pem()) and data.count(b"BEGIN CERTIFICATE") > 10  # the system's, then ours
    assert stat.S_IMODE(bundle.stat().st_mode) == 0o644
    # A bundle of an earlier CA that SSL_CERT_FILE points at is not trusted again.
    newer = InterceptionCA.load_or_create(tmp_path / "ca", ["localhost", "example.com"])
    os.environ["SSL_CERT_FILE"] = str(bundle)
    try:
        data_again = trust_bundle(newer, tmp_path / "trust" / "bundle2.pem").read_bytes()
    finally:
        del os.environ["SSL_CERT_FILE"]
    assert ca.ca_pem() not in data_again and data_again.count(b"BEGIN CERTIFICATE") == data.count(
        b"BEGIN CERTIFICATE"
    )
    ca_file = write_ca_file(ca, tmp_path / "trust" / "ca.pem")
    env = trust_env(bundle, ca_file)
    assert env.pop("NODE_EXTRA_CA_CERTS") == str(ca_file)
    assert set(env) == {"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "PIP_CERT", "GIT_SSL_CAINFO"}
    assert set(env.values()) == {str(bundle)}


def test_secret_routes_are_checked_and_never_show_their_value() -> None:
    route = SecretRoute(
        "github", PLACEHOLDER, VALUE, ("API.github.com", "*.GitHub.com"), frozenset({"Authorization"})
    )
    assert VALUE not in repr(route) and route.hosts == ("api.github.com", "*.github.com")
    assert route.headers == frozenset({"authorization"})
    assert route.applies_to("api.github.com") and route.applies_to("x.github.com")
    assert not route.applies_to("github.com")
    good = SecretRoute("github", PLACEHOLDER, VALUE, ("github.com",))
    bads: list[dict[str, Any]] = [
        {"value": "a\r\nX-Injected: 1"},
        {"placeholder": "short"},
        {"hosts": ()},
        {"hosts": ("https://github.com",)},
        {"headers": frozenset({"bad name"})},
    ]
    for bad in bads:
        with pytest.raises(ValueError) as raised:
            dataclasses.replace(good, **bad)
        assert "X-Injected" not in str(raised.value) and VALUE not in str(raised.value)


def test_the_proxy_checks_its_secrets(tmp_path: Path) -> None:
    ca = InterceptionCA.load_or_create(tmp_path, ["localhost"])
    route = SecretRoute("github", PLACEHOLDER, VALUE, ("localhost",))
    with pytest.raises(ValueError, match="need an InterceptionCA"):
        DomainProxy(["localhost"], secrets=[route])
    with pytest.raises(ValueError, match="was not made for"):
        DomainProxy(["*.x.org"], secrets=[SecretRoute("x", PLACEHOLDER, VALUE, ("*.x.org",))], ca=ca)
    longer = SecretRoute("longer", PLACEHOLDER + "-2", VALUE, ("localhost",))
    with pytest.raises(ValueError, match="placeholder holds"):
        DomainProxy(["localhost"], secrets=[route, longer], ca=ca)
    unverified = ssl.create_default_context()
    unverified.check_hostname = False
    with pytest.raises(ValueError, match="must verify"):
        DomainProxy(["localhost"], secrets=[route], ca=ca, upstream_context=unverified)
