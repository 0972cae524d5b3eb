"""Request rules per domain (`allowedDomains` tables with `methods`/`paths`, `readOnly`), enforced by the
DomainProxy on plain HTTP and on the TLS it intercepts; and their policy model. In one process, no kernels
(`tests.sandbox.tls_harness`: a test CA, origins on 127.0.0.1 that record every request)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ipybox.sandbox.domains import DomainFilter, target_path_error
from ipybox.sandbox.interception import InterceptionCA, trust_bundle
from ipybox.sandbox.policy import DomainRule, SandboxPolicy, SandboxPolicyError
from ipybox.sandbox.proxy import DomainProxy
from ipybox.sandbox.schema import policy_schema
from tests.sandbox.tls_harness import (
    Origin,
    OriginServer,
    fetch,
    https_through,
    raw_exchange_through,
    send_plain,
    start_origin,
    tunnel,
)

REPOS = DomainRule(host="localhost", methods=["GET", "HEAD"], paths=["/repos/**"])
REPOS_TEXT = '{ host = "localhost", methods = ["GET", "HEAD"], paths = ["/repos/**"] }'


@dataclass
class Rig:
    socket_path: Path
    origin: Origin
    bundle: Path | None = None

    def https(self, method: str, path: str) -> tuple[int, bytes]:
        assert self.bundle is not None
        connection = https_through(self.socket_path, "localhost", self.origin.port, self.bundle)
        try:
            status, body, _ = fetch(connection, method, path)
            return status, body
        finally:
            connection.close()

    def raw(self, request: bytes) -> bytes:
        assert self.bundle is not None
        return raw_exchange_through(self.socket_path, "localhost", self.origin.port, self.bundle, request)

    async def plain(self, method: str, path: str, extra: str = "") -> bytes:
        url = f"http://localhost:{self.origin.port}{path}"
        return await send_plain(
            self.socket_path, f"{method} {url} HTTP/1.1\r\nHost: x\r\n{extra}\r\n".encode()
        )


async def _rig(
    tmp_path: Path,
    served: OriginServer,
    allowed: list[str | DomainRule],
    *,
    ca: bool,
    read_only: bool = False,
) -> AsyncIterator[Rig]:
    authority = InterceptionCA.load_or_create(tmp_path / "ca", ["localhost"]) if ca else None
    bundle = trust_bundle(authority, tmp_path / "bundle.pem") if authority is not None else None
    async with DomainProxy(
        allowed, read_only=read_only, ca=authority, upstream_context=served.upstream_context()
    ) as proxy:
        yield Rig(await proxy.start(tmp_path / "proxy.sock"), served.origin, bundle)


@pytest.fixture
async def tls_origin(tmp_path: Path) -> AsyncIterator[OriginServer]:
    served = await start_origin(tmp_path)
    yield served
    served.close()


@pytest.fixture
async def plain_origin(tmp_path: Path) -> AsyncIterator[OriginServer]:
    served = await start_origin(tmp_path, tls=False)
    yield served
    served.close()


@pytest.fixture
async def plain(tmp_path: Path, plain_origin: OriginServer) -> AsyncIterator[Rig]:
    async for rig in _rig(tmp_path, plain_origin, [REPOS], ca=False):
        yield rig


@pytest.fixture
async def intercepted(tmp_path: Path, tls_origin: OriginServer) -> AsyncIterator[Rig]:
    async for rig in _rig(tmp_path, tls_origin, [REPOS, "127.0.0.1"], ca=True):
        yield rig


# -- plain HTTP


async def test_plain_http_get_is_allowed_and_post_refused_naming_the_rule(plain: Rig) -> None:
    served = await plain.plain("GET", "/repos/x?page=2")
    assert served.startswith(b"HTTP/1.1 200 ") and b"GET /repos/x?page=2 body=0" in served
    refused = await plain.plain("POST", "/repos/x", "Content-Length: 0\r\n")
    assert refused.startswith(b"HTTP/1.1 403 "), refused
    text = refused.decode()
    assert "refused POST /repos/x to localhost" in text and REPOS_TEXT in text
    assert "allows only GET, HEAD" in text and "ipybox.toml" in text
    assert len(plain.origin.seen) == 1


async def test_a_path_outside_the_globs_is_refused(plain: Rig) -> None:
    refused = await plain.plain("GET", "/admin")
    assert refused.startswith(b"HTTP/1.1 403 ") and b"allows only the paths /repos/**" in refused
    assert (await plain.plain("GET", "/repos")).startswith(b"HTTP/1.1 200 ")  # the directory itself
    assert (await plain.plain("GET", "/reposx")).startswith(b"HTTP/1.1 403 ")
    assert [seen.head.split(b" ")[1] for seen in plain.origin.seen] == [b"/repos"]


@pytest.mark.parametrize(
    "path",
    [
        "/repos/../admin",
        "/repos/%2e%2E/admin",
        "/repos/..;/admin",
        "/repos/./x",
        "/repos/a%2Fb",
        "/repos/a%5cb",
        "/repos/a\\b",
        "/repos//x",
        "/repos/a%00",
    ],
)
async def test_path_tricks_are_refused(plain: Rig, path: str) -> None:
    refused = await plain.plain("GET", path)
    assert refused.startswith(b"HTTP/1.1 400 "), refused
    assert b"send the plain path" in refused and plain.origin.seen == []


async def test_nothing_after_a_checked_plain_request_reaches_the_origin(plain: Rig) -> None:
    url = f"http://localhost:{plain.origin.port}"
    two = f"GET {url}/repos/x HTTP/1.1\r\nHost: x\r\n\r\nDELETE /repos/x HTTP/1.1\r\nHost: x\r\n\r\n"
    answer = await send_plain(plain.socket_path, two.encode())
    assert answer.count(b"HTTP/1.1 200 ") == 1
    await asyncio.sleep(0.1)
    assert [seen.head.split(b" ")[0] for seen in plain.origin.seen] == [b"GET"]


# -- intercepted TLS


async def test_intercepted_get_is_allowed_and_delete_refused(intercepted: Rig) -> None:
    status, body = await asyncio.to_thread(intercepted.https, "GET", "/repos/x")
    assert status == 200 and body.startswith(b"GET /repos/x body=0")
    status, body = await asyncio.to_thread(intercepted.https, "DELETE", "/repos/x")
    assert status == 403 and REPOS_TEXT.encode() in body and b"refused DELETE /repos/x" in body
    assert [seen.head.split(b" ")[0] for seen in intercepted.origin.seen] == [b"GET"]


async def test_an_intercepted_refusal_closes_the_connection(intercepted: Rig) -> None:
    host = f"Host: localhost:{intercepted.origin.port}\r\n"
    request = f"GET /repos/a HTTP/1.1\r\n{host}\r\nGET /admin HTTP/1.1\r\n{host}\r\nGET /repos/b HTTP/1.1\r\n{host}\r\n"
    answer = await asyncio.to_thread(intercepted.raw, request.encode())
    assert answer.count(b"HTTP/1.1 200 OK") == 1 and b"HTTP/1.1 403 " in answer
    assert b"Connection: close" in answer.split(b"HTTP/1.1 403 ")[1]
    assert [seen.head.split(b" ")[1] for seen in intercepted.origin.seen] == [b"/repos/a"]


async def test_an_absolute_url_target_is_checked_by_its_path(intercepted: Rig) -> None:
    url = f"https://localhost:{intercepted.origin.port}"
    request = f"GET {url}/admin HTTP/1.1\r\nHost: localhost:{intercepted.origin.port}\r\n\r\n"
    answer = await asyncio.to_thread(intercepted.raw, request.encode())
    assert answer.startswith(b"HTTP/1.1 403 ") and intercepted.origin.seen == []


async def test_read_only_refuses_post_to_a_plain_entry(tmp_path: Path, tls_origin: OriginServer) -> None:
    async for rig in _rig(tmp_path, tls_origin, ["localhost"], ca=True, read_only=True):
        status, body = await asyncio.to_thread(rig.https, "POST", "/anything")
        assert status == 403 and b"readOnly = true" in body and b"GET, HEAD, OPTIONS" in body
        assert b'allowedDomains entry "localhost"' in body
        assert (await asyncio.to_thread(rig.https, "GET", "/anything"))[0] == 200
        assert [seen.head.split(b" ")[0] for seen in rig.origin.seen] == [b"GET"]


async def test_a_restricted_host_without_a_ca_is_refused_on_connect(
    tmp_path: Path, tls_origin: OriginServer
) -> None:
    async for rig in _rig(tmp_path, tls_origin, [REPOS, "127.0.0.1"], ca=False):
        answer = await send_plain(
            rig.socket_path, f"CONNECT localhost:{rig.origin.port} HTTP/1.1\r\n\r\n".encode()
        )
        assert answer.startswith(b"HTTP/1.1 403 ") and b"can't be checked" in answer
        assert REPOS_TEXT.encode() in answer
        # An unrestricted host is tunnelled as before.
        (await asyncio.to_thread(tunnel, rig.socket_path, f"127.0.0.1:{rig.origin.port}")).close()


def test_the_ca_must_cover_the_restricted_hosts(tmp_path: Path) -> None:
    ca = InterceptionCA.load_or_create(tmp_path, ["api.github.com"])
    with pytest.raises(ValueError, match=r"localhost limit their requests.*not made for them"):
        DomainProxy([REPOS], ca=ca)
    with pytest.raises(ValueError, match=r"pypi\.org"):
        DomainProxy(["pypi.org", "api.github.com"], read_only=True, ca=ca)
    DomainProxy([DomainRule(host="api.github.com", methods=["GET"]), "pypi.org"], ca=ca)


# -- the filter


def test_the_most_specific_entry_wins() -> None:
    hosts = DomainFilter(
        [
            "*.example.com",
            DomainRule(host="*.api.example.com", paths=["/v1/**"]),
            DomainRule(host="api.example.com", methods=["GET"]),
        ],
        denied=["blocked.example.com"],
    )
    exact, deeper, broad = (
        hosts.rule(h) for h in ("api.example.com", "x.api.example.com", "www.example.com")
    )
    assert exact is not None and exact.methods == frozenset({"GET"}) and exact.paths is None
    assert deeper is not None and deeper.paths == ("/v1/**",) and deeper.methods is None
    assert broad is not None and not broad.restricts
    assert hosts.rule("blocked.example.com") is None and hosts.rule("example.org") is None
    assert set(hosts.restricted_entries) == {"*.api.example.com", "api.example.com"}


def test_globs_match_within_and_across_segments() -> None:
    rule = DomainFilter([DomainRule(host="h", paths=["/repos/*/issues", "/files/**"])]).rule("h")
    assert rule is not None
    allowed = ["/repos/a/issues", "/repos/a/issues?state=open", "/files", "/files/", "/files/a/b.txt"]
    refused = ["/repos/a/b/issues", "/repos/a/issues/1", "/filesx", "/"]
    assert [rule.refusal("h", "GET", path) for path in allowed] == [None] * len(allowed)
    assert all(rule.refusal("h", "GET", path) is not None for path in refused)
    assert target_path_error("/repos/a.b/..c/%2e.x") is None  # dots inside names are fine


# -- the policy


def _load(tmp_path: Path, network: dict[str, object]) -> SandboxPolicy:
    path = tmp_path / "policy.json"
    path.write_text(json.dumps({"network": network}))
    return SandboxPolicy.from_file(path)


def test_the_table_form_validates_and_strings_still_work(tmp_path: Path) -> None:
    table = {"host": "api.github.com", "methods": ["GET", "HEAD"], "paths": ["/repos/**"]}
    policy = _load(tmp_path, {"allowedDomains": ["pypi.org", "*.pythonhosted.org", table], "readOnly": True})
    network = policy.network
    assert network.allowed_domains[:2] == ["pypi.org", "*.pythonhosted.org"]
    assert network.allowed_domains[2] == DomainRule(**table)  # type: ignore[arg-type]
    assert network.read_only and network.allowed_hosts == ["pypi.org", "*.pythonhosted.org", "api.github.com"]
    assert network.restricted_hosts() == ["pypi.org", "*.pythonhosted.org", "api.github.com"]
    assert _load(tmp_path, {"allowedDomains": ["pypi.org"]}).network.restricted_hosts() == []
    assert SandboxPolicy.model_validate({"network": {"read_only": True}}).network.read_only  # snake_case too


@pytest.mark.parametrize(
    ("entry", "where", "why"),
    [
        ({"host": "a.com", "methods": ["get"]}, "allowedDomains.0.table.methods", "upper-case HTTP method"),
        ({"host": "a.com", "methods": ["CONNECT"]}, "allowedDomains.0.table.methods", "not a request"),
        ({"host": "a.com", "methods": []}, "allowedDomains.0.table.methods", "methods is empty"),
        ({"host": "a.com", "paths": ["repos/**"]}, "allowedDomains.0.table.paths", "must start with '/'"),
        ({"host": "a.com", "paths": ["/r?x"]}, "allowedDomains.0.table.paths", "query string is not matched"),
        ({"host": "a.com", "paths": ["/r/../x"]}, "allowedDomains.0.table.paths", "'..' segments"),
        ({"host": "a.com", "paths": ["/r/***"]}, "allowedDomains.0.table.paths", "not '***'"),
        ({"host": "https://a.com"}, "allowedDomains.0.table.host", "without scheme, port or path"),
        ({"host": "a.com", "method": ["GET"]}, "allowedDomains.0.table.method", "Extra inputs"),
        ({"methods": ["GET"]}, "allowedDomains.0.table.host", "Field required"),
    ],
)
def test_bad_tables_are_named(tmp_path: Path, entry: dict[str, object], where: str, why: str) -> None:
    with pytest.raises(SandboxPolicyError) as caught:
        _load(tmp_path, {"allowedDomains": [entry]})
    assert f"network.{where}" in str(caught.value) and why in str(caught.value), caught.value


def test_conflicting_entries_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SandboxPolicyError, match=r"lists 'a\.com' twice"):
        _load(tmp_path, {"allowedDomains": ["a.com", {"host": "A.com", "methods": ["GET"]}]})
    with pytest.raises(SandboxPolicyError, match="nothing is left"):
        _load(tmp_path, {"allowedDomains": [{"host": "a.com", "methods": ["POST"]}], "readOnly": True})
    assert _load(tmp_path, {"allowedDomains": ["a.com", "a.com"]}).network.allowed_hosts == ["a.com", "a.com"]


def test_the_schema_lists_the_new_keys() -> None:
    schema = policy_schema()
    network = schema["$defs"]["NetworkPolicy"]["properties"]
    assert network["readOnly"]["type"] == "boolean"
    assert {"$ref": "#/$defs/DomainRule"} in network["allowedDomains"]["items"]["oneOf"]
    assert set(schema["$defs"]["DomainRule"]["properties"]) == {"host", "methods", "paths"}
    shipped = json.loads((Path(__file__).parents[2] / "schemas" / "sandbox-policy.schema.json").read_text())
    assert shipped["$defs"]["DomainRule"] == schema["$defs"]["DomainRule"]


# -- a stdio server's sandbox, bounded by the workspace's rules

RESTRICTED_WORKSPACE = """\
[sandbox]
enabled = true
[sandbox.network]
allowedDomains = ["pypi.org", { host = "api.github.com", methods = ["GET", "HEAD"], paths = ["/repos/**"] }]
"""


@pytest.mark.parametrize(
    ("allowed", "read_only", "beyond"),
    [
        (["api.github.com"], False, "may send methods that the workspace's entry"),
        ([{"host": "api.github.com", "methods": ["GET"]}], False, "may ask for paths"),
        ([{"host": "*.github.com", "methods": ["GET"], "paths": ["/repos/**"]}], False, "not covered"),
        ([{"host": "api.github.com", "methods": ["GET"], "paths": ["/repos/**"]}], False, None),
        # readOnly allows OPTIONS too, which the workspace's entry does not.
        ([{"host": "api.github.com", "paths": ["/repos/**"]}], True, "may send methods"),
        ([{"host": "api.github.com", "methods": ["HEAD"], "paths": ["/repos/**"]}], True, None),
        (["pypi.org"], False, None),
    ],
)
def test_a_servers_sandbox_may_ask_no_more_than_the_workspaces_rules(
    tmp_path: Path, allowed: list[object], read_only: bool, beyond: str | None
) -> None:
    from ipybox.mcp_server.registration import load_workspace_config, parse_registration

    (tmp_path / "ipybox.toml").write_text(RESTRICTED_WORKSPACE)
    network = {"allowedDomains": allowed, "readOnly": read_only}
    params = {"command": "uvx", "sandbox": {"network": network}}
    registration = parse_registration(tmp_path, load_workspace_config(tmp_path), "srv", params)
    if beyond is None:
        assert registration.beyond == (), registration.beyond
    else:
        assert any(beyond in phrase for phrase in registration.beyond), registration.beyond
