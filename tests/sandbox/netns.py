"""Test hosts in network namespaces of the tests' own, so that tests reach servers on addresses that are
not this machine's loopback, and never any outside address.

`make_hosts(n)` makes `n` namespaces, each joined to this process's namespace by a veth pair on a /30 of
its own in 10.231.0.0/16: this side has `.1` (`NetnsHost.gateway`), the namespace `.2`
(`NetnsHost.address`), which this process reaches through the kernel's route for the /30. Nothing routes
further (the namespaces have no default route), so a server in one answers only this machine.
`origins(directory, n)` runs `tests/sandbox/netns_origin.py` in each (`ip netns exec`), TLS on 443 with a
certificate for the host's address signed by a new test CA, plain HTTP on 80, recording every request and
every byte it gets into a file the test reads (`NetnsOrigin`).

Names are `ipybt-<pid>-<worker>-<i>` (namespaces) and `ipybt<pid>o<i>` (this side's veth end, 15
characters at most), so parallel pytest workers never collide; a /30 already on an interface here is
skipped. Everything is torn down when the context ends, whatever happened (the servers stopped, the
namespaces deleted, which deletes their veth pairs), and a run killed before that is cleaned up by the
next: namespaces of ours whose process is gone are deleted first.

It takes root and `ip` (iproute2; `scripts/setup --tests` installs it): `unavailable()` says why not, and
the fixtures fail with that reason (the tests using them are marked `root_only`, as the suite's other
tests that take root).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.sandbox.tls_harness import key_pem, make_cert, pem

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "ipybt"
SUBNET = ipaddress.ip_network("10.231.0.0/16")
_BLOCKS = SUBNET.num_addresses // 4  # /30s
_NAMESPACE = re.compile(rf"^{PREFIX}-(\d+)-")
_READY_TIMEOUT = 15.0


class NetnsError(RuntimeError):
    """A test host could not be made: the message says why and what to do."""


@dataclass(frozen=True)
class NetnsHost:
    namespace: str
    veth: str  # this side's end
    gateway: str  # this side's address
    address: str  # the namespace's address

    def run(self, *command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run `command` inside the namespace."""
        return _ip("netns", "exec", self.namespace, *command, check=check)


@dataclass
class NetnsOrigin:
    host: NetnsHost
    process: subprocess.Popen[bytes]
    record: Path

    @property
    def address(self) -> str:
        return self.host.address

    def records(self) -> list[dict[str, Any]]:
        text = self.record.read_text(encoding="utf-8") if self.record.exists() else ""
        return [json.loads(line) for line in text.splitlines() if line]

    def requests(self) -> list[dict[str, Any]]:
        """The requests the origin read, in order: `tls`, `conn`, `head`, `body`."""
        return [r for r in self.records() if r["kind"] == "request"]

    def received(self) -> str:
        """Every byte it received, on every connection, as latin-1 text."""
        return "".join(r["data"] for r in self.records() if r["kind"] == "bytes")


def unavailable() -> str | None:
    """Why test hosts can't be made here, or `None`."""
    if os.geteuid() != 0:
        return "network namespaces for test hosts take root"
    if shutil.which("ip") is None:
        return "the `ip` command is missing: install iproute2 (scripts/setup --tests does, as root)"
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if check and done.returncode != 0:
        raise NetnsError(f"`ip {' '.join(args)}` failed: {done.stderr.strip() or done.returncode}")
    return done


def _remove(namespace: str) -> None:
    """Kill what runs in `namespace` (only processes in it: ours) and delete it with its veth pairs."""
    pids = _ip("netns", "pids", namespace, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    _ip("netns", "del", namespace, check=False)


def _remove_stale() -> None:
    """Delete namespaces of ours left by a run that was killed (their pid is gone)."""
    listed = _ip("netns", "list", check=False).stdout.splitlines()
    for line in listed:
        name = line.split()[0] if line.split() else ""
        match = _NAMESPACE.match(name)
        if match is None:
            continue
        try:
            os.kill(int(match.group(1)), 0)
        except ProcessLookupError:
            _remove(name)
        except PermissionError:
            pass  # alive (another user's: not ours to touch)


def _used_blocks() -> set[int]:
    """The /30s of 10.231.0.0/16 that an interface here has addresses in (another run's, or the machine's)."""
    used: set[int] = set()
    base = int(SUBNET.network_address)
    for line in _ip("-4", "-o", "addr", "show").stdout.splitlines():
        for word in line.split():
            try:
                network = ipaddress.ip_interface(word).network
            except ValueError:
                continue
            if isinstance(network, ipaddress.IPv4Network) and network.overlaps(SUBNET):
                first = max(int(network.network_address), base)
                last = min(int(network.broadcast_address), int(SUBNET.broadcast_address))
                used.update(range((first - base) // 4, (last - base) // 4 + 1))
    return used


@contextlib.contextmanager
def make_hosts(count: int) -> Iterator[list[NetnsHost]]:
    """`count` namespaces joined to this one (see the module's description), deleted when it ends.

    Raises:
        NetnsError: Not root, no `ip`, or a namespace or its link could not be made (the reason).
    """
    if (reason := unavailable()) is not None:
        raise NetnsError(reason)
    _remove_stale()
    pid = os.getpid()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    used = _used_blocks()
    block = (pid * 8) % _BLOCKS
    hosts: list[NetnsHost] = []
    try:
        for index in range(count):
            while block in used:
                block = (block + 1) % _BLOCKS
            used.add(block)
            base = SUBNET.network_address + 4 * block
            host = NetnsHost(
                namespace=f"{PREFIX}-{pid}-{worker}-{index}",
                veth=f"{PREFIX}{pid}o{index}",
                gateway=str(base + 1),
                address=str(base + 2),
            )
            inner = f"{PREFIX}{pid}i{index}"
            try:
                _ip("netns", "add", host.namespace)
            except NetnsError as e:
                raise NetnsError(
                    f"{e} (network namespaces need root with CAP_SYS_ADMIN and a writable /run/netns)"
                ) from None
            hosts.append(host)
            _ip("link", "add", host.veth, "type", "veth", "peer", "name", inner)
            _ip("link", "set", inner, "netns", host.namespace)
            _ip("addr", "add", f"{host.gateway}/30", "dev", host.veth)
            _ip("link", "set", host.veth, "up")
            _ip("-n", host.namespace, "addr", "add", f"{host.address}/30", "dev", inner)
            _ip("-n", host.namespace, "link", "set", inner, "up")
            _ip("-n", host.namespace, "link", "set", "lo", "up")
        yield hosts
    finally:
        for host in hosts:
            _remove(host.namespace)
            _ip("link", "del", host.veth, check=False)  # gone with the namespace, unless that failed


def origin_certificates(directory: Path, addresses: list[str]) -> tuple[bytes, list[Path]]:
    """A new test CA (its PEM) and, per address, a file with a certificate for that IP address (signed by
    the CA) and its key."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ipybox netns test CA")])
    ca = make_cert(ca_name, ca_key, ca_name, ca_key, None)
    paths = []
    for address in addresses:
        key = ec.generate_private_key(ec.SECP256R1())
        names: list[x509.GeneralName] = [x509.IPAddress(ipaddress.ip_address(address))]
        cert = make_cert(x509.Name([]), key, ca_name, ca_key, names)
        path = directory / f"origin-{address}.pem"
        path.write_bytes(pem(cert) + key_pem(key))
        paths.append(path)
    return pem(ca), paths


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
    if process.stdout is not None:
        process.stdout.close()


def _wait_ready(process: subprocess.Popen[bytes], host: NetnsHost) -> None:
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], _READY_TIMEOUT)
    line = process.stdout.readline() if ready else b""
    if line.strip() != b"ready":
        _stop(process)
        raise NetnsError(
            f"the test origin in {host.namespace} did not start (exit {process.returncode}): "
            f"{line.decode(errors='replace').strip() or 'no output'}"
        )


@contextlib.contextmanager
def origins(directory: Path, count: int) -> Iterator[tuple[list[NetnsOrigin], bytes]]:
    """`count` test hosts, each running the test origin (see the module's description), and the PEM of
    the test CA their certificates chain to; all stopped and deleted when it ends.

    Raises:
        NetnsError: As `make_hosts`, or an origin did not start.
    """
    with make_hosts(count) as hosts:
        test_ca, certs = origin_certificates(directory, [host.address for host in hosts])
        started: list[NetnsOrigin] = []
        try:
            for host, cert in zip(hosts, certs, strict=True):
                record = directory / f"record-{host.address}.jsonl"
                command = [
                    "ip", "netns", "exec", host.namespace,
                    sys.executable, "-m", "tests.sandbox.netns_origin",
                    "--address", host.address, "--cert", str(cert), "--record", str(record),
                ]  # fmt: skip
                process = subprocess.Popen(
                    command, cwd=ROOT, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL
                )
                started.append(NetnsOrigin(host, process, record))
                _wait_ready(process, host)
            yield started, test_ca
        finally:
            for origin in started:
                _stop(origin.process)
