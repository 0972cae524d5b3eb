"""An in-process harness for the DomainProxy's TLS interception, shared by its tests; no kernels.

A test CA signs the certificate of an origin (an asyncio TLS server on 127.0.0.1, for `localhost` and
`127.0.0.1`, that records every request and answers with sized or chunked bodies); a proxy verifies the
origin with the test CA (`OriginServer.upstream_context()`). The client is `http.client` in a thread, over
a Unix socket the test sends `CONNECT` on itself (`tunnel`) and wraps in TLS trusting a trust bundle, as a
sandboxed client trusts it through `SSL_CERT_FILE`.

The origin answers `METHOD PATH body=N conn=C`; `/chunked` answers `CHUNKS` chunked, `/close-delimited`
an answer ended by closing, `/then-idle-close` closes 0.2 s after answering (a keep-alive timeout).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import http.client
import ipaddress
import itertools
import socket
import ssl
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

NOW = dt.datetime.now(dt.UTC)
CHUNKS = [b"first chunk|", b"second, longer chunk|", b"x" * 70_000]  # the last one spans reads


# -- certificates


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def make_cert(
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name,
    signer: ec.EllipticCurvePrivateKey,
    names: list[x509.GeneralName] | None,
) -> x509.Certificate:
    """A CA certificate (`names` None) or a server certificate for `names`, valid two days."""
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - dt.timedelta(hours=1))
        .not_valid_after(NOW + dt.timedelta(days=2))
    )
    if names is None:
        builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
    else:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False).add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
    return builder.sign(signer, hashes.SHA256())


def pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


# -- the origin


@dataclass
class Seen:
    connection: int
    head: bytes
    body: bytes


@dataclass
class Origin:
    port: int
    seen: list[Seen] = field(default_factory=list)

    def heads(self) -> list[str]:
        return [s.head.decode("latin-1") for s in self.seen]


async def _read_body(reader: asyncio.StreamReader, head: bytes) -> bytes:
    lines = head.decode("latin-1").lower().split("\r\n")
    if "transfer-encoding: chunked" in lines:
        body = b""
        while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
            body += (await reader.readexactly(size + 2))[:-2]
        while await reader.readuntil(b"\r\n") != b"\r\n":
            pass
        return body
    length = next((int(line.split(":")[1]) for line in lines if line.startswith("content-length:")), 0)
    return await reader.readexactly(length)


async def _serve_origin(
    origin: Origin, number: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    try:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                return
            if b"\r\nexpect: 100-continue\r\n" in head.lower():
                writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            body = await _read_body(reader, head)
            origin.seen.append(Seen(number, head, body))
            method, path, _ = head.split(b"\r\n")[0].decode().split(" ")
            if path == "/close-delimited":
                writer.write(b"HTTP/1.1 200 OK\r\n\r\nuntil the origin closes")
                return
            if path == "/chunked":
                chunked = (
                    b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in CHUNKS) + b"0\r\nX-Trailer: t\r\n\r\n"
                )
                writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked)
            else:
                answer = f"{method} {path} body={len(body)} conn={number}".encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(answer))
                if method != "HEAD":
                    writer.write(answer)
            await writer.drain()
            if path == "/then-idle-close":
                await asyncio.sleep(0.2)  # the origin's keep-alive timeout, shortened
                return
    except (ConnectionError, ssl.SSLError):
        pass
    finally:
        writer.close()


@dataclass
class OriginServer:
    origin: Origin
    server: asyncio.Server
    test_ca_pem: bytes  # the test CA that signed the origin's certificate

    def upstream_context(self) -> ssl.SSLContext:
        """How a proxy verifies the origin: trusting the test CA alone."""
        return ssl.create_default_context(cadata=self.test_ca_pem.decode())

    def close(self) -> None:
        self.server.close()


async def start_origin(directory: Path, *, tls: bool = True) -> OriginServer:
    """The origin on 127.0.0.1 (a free port): TLS with a certificate signed by a new test CA, or plain
    HTTP (`tls=False`)."""
    test_key = ec.generate_private_key(ec.SECP256R1())
    test_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ipybox test CA")])
    test_ca = make_cert(test_name, test_key, test_name, test_key, None)
    origin_key = ec.generate_private_key(ec.SECP256R1())
    origin_names: list[x509.GeneralName] = [
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
    ]
    origin_cert = make_cert(x509.Name([]), origin_key, test_name, test_key, origin_names)
    (directory / "origin.pem").write_bytes(pem(origin_cert) + key_pem(origin_key))
    origin_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    origin_context.load_cert_chain(directory / "origin.pem")
    connections = itertools.count(1)
    origin = Origin(0)
    server = await asyncio.start_server(
        lambda r, w: _serve_origin(origin, next(connections), r, w),
        "127.0.0.1",
        0,
        ssl=origin_context if tls else None,
    )
    origin.port = server.sockets[0].getsockname()[1]
    return OriginServer(origin, server, pem(test_ca))


# -- the client


def tunnel(socket_path: Path, authority: str) -> socket.socket:
    """A Unix socket to the proxy with a CONNECT to `authority` answered 200."""
    raw = socket.socket(socket.AF_UNIX)
    raw.settimeout(10)
    raw.connect(str(socket_path))
    raw.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
    answer = b""
    while not answer.endswith(b"\r\n\r\n"):  # byte by byte: what follows is the TLS of the tunnel
        byte = raw.recv(1)
        assert byte, answer
        answer += byte
    assert answer.startswith(b"HTTP/1.1 200 "), answer
    return raw


def https_through(socket_path: Path, host: str, port: int, cafile: Path) -> http.client.HTTPConnection:
    """An `http.client` connection to `host:port` through the proxy, trusting `cafile` (a bundle)."""
    raw = tunnel(socket_path, f"{host}:{port}")
    context = ssl.create_default_context(cafile=cafile)
    connection = http.client.HTTPConnection(host, port, timeout=10)
    connection.sock = context.wrap_socket(raw, server_hostname=host)
    return connection


def fetch(
    connection: http.client.HTTPConnection,
    method: str,
    path: str,
    headers: dict[str, str] | None = None,
    body: bytes | list[bytes] | None = None,
) -> tuple[int, bytes, http.client.HTTPResponse]:
    if isinstance(body, list):  # sent chunked, as an iterable body is
        connection.request(method, path, body=iter(body), headers=headers or {}, encode_chunked=True)
    else:
        connection.request(method, path, body=body, headers=headers or {})
    response = connection.getresponse()
    return response.status, response.read(), response


def raw_exchange_through(socket_path: Path, host: str, port: int, cafile: Path, request: bytes) -> bytes:
    """Send `request` as bytes over an intercepted connection; everything until the proxy closes it."""
    raw = tunnel(socket_path, f"{host}:{port}")
    with ssl.create_default_context(cafile=cafile).wrap_socket(raw, server_hostname=host) as tls:
        tls.sendall(request)
        answer = b""
        while data := tls.recv(65536):
            answer += data
        return answer


async def send_plain(socket_path: Path, request: bytes) -> bytes:
    """Send `request` on a new connection to the proxy; everything until it closes."""
    reader, writer = await asyncio.open_unix_connection(socket_path)
    writer.write(request)
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return answer
