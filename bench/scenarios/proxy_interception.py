"""What the sandbox's proxy adds to an HTTPS request when it terminates TLS to put a secret in (issue 36),
against a plain `CONNECT` tunnel to the same origin, in the same run.

One `DomainProxy` (in this process, on its event loop, as in the supervisor) with one secret for
`localhost`: a `CONNECT localhost:PORT` is intercepted (the proxy's own TLS to the origin, a leaf of the
workspace CA to the client, each request parsed and the placeholder in `Authorization` replaced), a
`CONNECT 127.0.0.1:PORT` is tunnelled (bytes relayed; the client's TLS goes to the origin). The origin is
a minimal asyncio TLS server in a process of its own (a certificate for both names, signed by a test CA),
answering each request `200` with a 2-byte body on a kept-alive connection. The client is a separate
Python process too (as a kernel is), `http.client` over the proxy's Unix socket, sending the same request
(with `Authorization: Bearer <placeholder>`) both ways; samples alternate in blocks of 10, so both see the
same minute of the machine.

- `proxy.{tunnel,intercept}.request`: a request on a kept-alive connection.
- `proxy.{tunnel,intercept}.connect`: a new connection with one request: Unix connect, `CONNECT` and its
  `200` (for interception: after the proxy's handshake with the origin), the client's TLS handshake, the
  request, close.
- `proxy.intercept.{request,connect}_added`: per pair of neighbouring samples, interception minus tunnel:
  their median is the added latency.

Ours only (0.9.2 has no interception). The leaf certificate is minted in the warm-ups (once per host).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import json
import secrets
import ssl
import subprocess
import sys
import tempfile
from pathlib import Path

from _protocol import emit, log, parse_args
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from ipybox.sandbox.interception import InterceptionCA, SecretRoute
from ipybox.sandbox.proxy import DomainProxy

ORIGIN = r"""
import asyncio, ssl, sys

async def serve(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
        pass
    finally:
        writer.close()

async def main():
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(sys.argv[1])
    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=context)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()

asyncio.run(main())
"""

CLIENT = r"""
import http.client, json, os, socket, ssl, sys, time

runs, warmup = int(sys.argv[1]), int(sys.argv[2])
unix, port, bundle = os.environ["BENCH_SOCKET"], int(os.environ["BENCH_PORT"]), os.environ["BENCH_BUNDLE"]
headers = {"Authorization": "Bearer " + os.environ["BENCH_PLACEHOLDER"]}
hosts = {"tunnel": "127.0.0.1", "intercept": "localhost"}
context = ssl.create_default_context(cafile=bundle)
samples = {f"{kind}.{what}": [] for kind in hosts for what in ("request", "connect")}

def connect(kind):
    host = hosts[kind]
    raw = socket.socket(socket.AF_UNIX)
    raw.connect(unix)
    raw.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
    answer = b""
    while not answer.endswith(b"\r\n\r\n"):
        answer += raw.recv(1)
    assert answer.startswith(b"HTTP/1.1 200 "), answer
    connection = http.client.HTTPConnection(host, port, timeout=10)
    connection.sock = context.wrap_socket(raw, server_hostname=host)
    return connection

def request(connection):
    connection.request("GET", "/", headers=headers)
    response = connection.getresponse()
    assert response.status == 200 and response.read() == b"ok"

def timed(fn, *args):
    start = time.perf_counter()
    result = fn(*args)
    return (time.perf_counter() - start) * 1000, result

kept = {kind: connect(kind) for kind in hosts}
done = 0
while done < warmup + runs:
    n = min(10, warmup + runs - done)
    for kind in hosts:
        for i in range(n):
            ms, _ = timed(request, kept[kind])
            if done + i >= warmup:
                samples[f"{kind}.request"].append(ms)
    done += n

def once(kind):
    connection = connect(kind)
    request(connection)
    connection.close()

done = 0
while done < warmup + runs:
    n = min(10, warmup + runs - done)
    for kind in hosts:
        for i in range(n):
            ms, _ = timed(once, kind)
            if done + i >= warmup:
                samples[f"{kind}.connect"].append(ms)
    done += n
print(json.dumps(samples))
"""


def _certificates(directory: Path) -> tuple[bytes, Path]:
    """A test CA (its PEM) and a file with the origin's certificate (localhost, 127.0.0.1) and key."""
    now = dt.datetime.now(dt.UTC)

    def cert(subject: x509.Name, key: ec.EllipticCurvePrivateKey, ca_key: ec.EllipticCurvePrivateKey,
             issuer: x509.Name, names: list[x509.GeneralName] | None) -> x509.Certificate:  # fmt: skip
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=1))
        )
        if names is None:
            builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        else:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        return builder.sign(ca_key, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bench test CA")])
    ca = cert(ca_name, ca_key, ca_key, ca_name, None)
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
    ]
    origin = cert(x509.Name([]), key, ca_key, ca_name, names)
    path = directory / "origin.pem"
    path.write_bytes(
        origin.public_bytes(serialization.Encoding.PEM)
        + key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return ca.public_bytes(serialization.Encoding.PEM), path


async def main() -> None:
    args = parse_args(__doc__ or "", default_runs=200, default_warmup=20)
    with tempfile.TemporaryDirectory(prefix="bench-proxy-") as tmp:
        workdir = Path(tmp)
        test_ca, origin_pem = _certificates(workdir)
        origin = await asyncio.create_subprocess_exec(
            sys.executable, "-c", ORIGIN, str(origin_pem), stdout=subprocess.PIPE
        )
        try:
            assert origin.stdout is not None
            port = int(await asyncio.wait_for(origin.stdout.readline(), 30))
            ca = InterceptionCA.load_or_create(workdir / "interception", ["localhost"])
            placeholder = f"ipybox-secret-bench-{secrets.token_urlsafe(24)}"
            route = SecretRoute(
                "bench", placeholder, secrets.token_hex(16), ("localhost",), frozenset({"authorization"})
            )
            bundle = workdir / "bundle.pem"
            bundle.write_bytes(test_ca + ca.ca_pem())
            upstream = ssl.create_default_context(cadata=test_ca.decode())
            async with DomainProxy(
                ["localhost", "127.0.0.1"], secrets=[route], ca=ca, upstream_context=upstream
            ) as proxy:
                unix = await proxy.start()
                log(
                    f"client: {args.runs} samples per metric after {args.warmup} warm-ups, tunnel and "
                    "interception alternating"
                )
                env = {
                    "BENCH_SOCKET": str(unix),
                    "BENCH_PORT": str(port),
                    "BENCH_BUNDLE": str(bundle),
                    "BENCH_PLACEHOLDER": placeholder,
                    "PATH": "/usr/bin:/bin",
                }
                client = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-c",
                    CLIENT,
                    str(args.runs),
                    str(args.warmup),
                    env=env,
                    stdout=subprocess.PIPE,
                )
                out, _ = await client.communicate()
                if client.returncode != 0:
                    raise SystemExit(f"the client failed (exit {client.returncode})")
        finally:
            if origin.returncode is None:
                origin.terminate()
            await origin.wait()
    samples: dict[str, list[float]] = json.loads(out.decode().strip().splitlines()[-1])
    for metric, values in samples.items():
        emit(f"proxy.{metric}", values)
    for what in ("request", "connect"):
        pairs = zip(samples[f"intercept.{what}"], samples[f"tunnel.{what}"], strict=True)
        emit(f"proxy.intercept.{what}_added", [intercepted - tunnelled for intercepted, tunnelled in pairs])


if __name__ == "__main__":
    asyncio.run(main())
