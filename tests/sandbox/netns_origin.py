"""A test origin run inside a network namespace (`tests/sandbox/netns.py` starts it with `ip netns exec`).

    python -m tests.sandbox.netns_origin --address 10.231.0.2 --cert origin.pem --record record.jsonl

It listens on `--address`, TLS on `--tls-port` (443; the certificate and key in `--cert`, which a test
CA signed) and plain HTTP on `--http-port` (80), and prints `ready` once both listen. It records into
`--record` (JSON lines, flushed at once, so a test reads them while it runs):

- `{"kind": "request", "tls": ..., "conn": N, "head": ..., "body": ...}` for each request it reads
  (`Content-Length` or chunked bodies; head and body as latin-1 text);
- `{"kind": "bytes", "tls": ..., "conn": N, "data": ...}` for every read on a connection, as it came:
  everything the origin received, whether or not it parsed as a request (a test looks for a secret in
  the bytes, not only in the requests the origin understood).

It answers each request `200` with `METHOD PATH body=N conn=N` and keeps the connection alive, unless
the request says `Connection: close` or is HTTP/1.0.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import ssl
import sys
from collections.abc import Awaitable, Callable
from typing import IO


class Recorder:
    def __init__(self, file: IO[str]) -> None:
        self.file = file

    def write(self, **record: object) -> None:
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()


class RecordingReader:
    """A stream reader whose every read is recorded as it came."""

    def __init__(self, reader: asyncio.StreamReader, recorder: Recorder, tls: bool, conn: int) -> None:
        self.reader, self.recorder, self.tls, self.conn = reader, recorder, tls, conn

    def _seen(self, data: bytes) -> bytes:
        if data:
            self.recorder.write(kind="bytes", tls=self.tls, conn=self.conn, data=data.decode("latin-1"))
        return data

    async def readuntil(self, separator: bytes) -> bytes:
        try:
            return self._seen(await self.reader.readuntil(separator))
        except asyncio.IncompleteReadError as e:
            self._seen(e.partial)
            raise

    async def readexactly(self, size: int) -> bytes:
        try:
            return self._seen(await self.reader.readexactly(size))
        except asyncio.IncompleteReadError as e:
            self._seen(e.partial)
            raise


async def read_body(reader: RecordingReader, head: bytes) -> bytes:
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


async def serve(
    recorder: Recorder,
    tls: bool,
    conn: int,
    stream: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
) -> None:
    reader = RecordingReader(stream, recorder, tls, conn)
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            body = await read_body(reader, head)
            recorder.write(
                kind="request", tls=tls, conn=conn, head=head.decode("latin-1"), body=body.decode("latin-1")
            )
            method, path, *_ = head.split(b"\r\n")[0].decode("latin-1").split(" ")
            answer = f"{method} {path} body={len(body)} conn={conn}".encode()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(answer) + answer)
            await writer.drain()
            request_line = head.split(b"\r\n")[0]
            if b"\r\nconnection: close\r\n" in head.lower() or request_line.endswith(b" HTTP/1.0"):
                return
    except (
        asyncio.IncompleteReadError,
        asyncio.LimitOverrunError,
        ConnectionError,
        ssl.SSLError,
        ValueError,
    ):
        pass
    finally:
        writer.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--address", required=True)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--record", required=True)
    parser.add_argument("--tls-port", type=int, default=443)
    parser.add_argument("--http-port", type=int, default=80)
    args = parser.parse_args()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(args.cert)
    connections = itertools.count(1)
    with open(args.record, "a", encoding="utf-8") as file:
        recorder = Recorder(file)

        def handler(tls: bool) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
            return lambda reader, writer: serve(recorder, tls, next(connections), reader, writer)

        servers = [
            await asyncio.start_server(handler(True), args.address, args.tls_port, ssl=context),
            await asyncio.start_server(handler(False), args.address, args.http_port),
        ]
        print("ready", flush=True)
        await asyncio.gather(*(server.serve_forever() for server in servers))


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        sys.exit(0)
