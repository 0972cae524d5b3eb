"""The console app in process (no server, no browser): who gets in, what each page shows, what a POST
needs, and what reaches the target."""

from __future__ import annotations

import asyncio
import html
import re
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from starlette.routing import Route

from ipybox.approval import Approved, Rejected
from ipybox.approval.ask_context import ClientView, cell_view
from ipybox.approval.asks import AskAnswer
from ipybox.approval.grants import Grant
from ipybox.approval.links import PathLink
from ipybox.approval.rule_approver import WorkspaceApprover
from ipybox.console.app import ConsoleApp
from ipybox.console.rendering import TEMPLATES_DIR
from ipybox.rules import ApprovalPolicy, AuditLog, ToolCall, Verdict
from ipybox.running.status import GatewayStatus, KernelsStatus, PolicyStatus
from tests.console.conftest import ORIGIN, PORT, csrf_of
from tests.console.targets import WorkspaceTarget, status_of

PAGES = ["/", "/asks", "/audit", "/rules", "/fragments/overview", "/events", "/asks/1-x/card", "/nowhere"]


async def answer_form(browser: httpx.AsyncClient, ask_id: str, **fields: str) -> httpx.Response:
    csrf = csrf_of((await browser.get("/asks")).text)
    return await browser.post(
        f"/asks/{ask_id}/answer", data={"csrf": csrf, **fields}, headers={"Origin": ORIGIN}
    )


async def answer_script(browser: httpx.AsyncClient, ask_id: str, **fields: str) -> httpx.Response:
    csrf = csrf_of((await browser.get("/asks")).text)
    return await browser.post(
        f"/asks/{ask_id}/answer",
        data=fields,
        headers={"Origin": ORIGIN, "X-CSRF-Token": csrf, "Accept": "application/json"},
    )


# -- access


@pytest.mark.parametrize("path", PAGES)
async def test_every_page_without_a_session_is_refused_with_a_short_page_and_no_data(
    client: httpx.AsyncClient, target: WorkspaceTarget, path: str
) -> None:
    target.ask(ToolCall("filesystem", "write_file", {"path": "very-private.md"}))
    response = await client.get(path)
    assert response.status_code == 401
    assert "ipybox console DIR" in html.unescape(response.text)
    assert "very-private.md" not in response.text and "/home/me/project" not in response.text


async def test_a_login_link_sets_an_httponly_strict_cookie_and_leaves_the_address_bar(
    client: httpx.AsyncClient, console: ConsoleApp
) -> None:
    response = await client.get(f"/login?token={console.auth.new_login_token()}")
    assert response.status_code == 200
    cookie = response.headers["set-cookie"]
    assert cookie.startswith(f"ipybox-console-{PORT}=")
    assert {"HttpOnly", "SameSite=strict", "Path=/"} <= {part.strip() for part in cookie.split(";")}
    assert '<meta http-equiv="refresh" content="0;url=/">' in response.text
    assert response.headers["referrer-policy"] == "no-referrer"
    assert (await client.get("/")).status_code == 200


async def test_a_login_link_works_once(client: httpx.AsyncClient, console: ConsoleApp) -> None:
    link = f"/login?token={console.auth.new_login_token()}"
    assert (await client.get(link)).status_code == 200
    client.cookies.clear()
    again = await client.get(link)
    assert again.status_code == 401
    assert "Run `ipybox console DIR` for a new one" in html.unescape(again.text)
    assert (await client.get("/")).status_code == 401


@pytest.mark.parametrize("query", ["", "?token=", "?token=not-a-token"])
async def test_a_wrong_login_token_is_refused(client: httpx.AsyncClient, query: str) -> None:
    response = await client.get(f"/login{query}")
    assert response.status_code == 401 and "set-cookie" not in response.headers


async def test_a_session_cookie_of_another_console_is_refused(
    client: httpx.AsyncClient, console: ConsoleApp
) -> None:
    client.cookies.set(console.site.cookie_name, "made-up-session-id")
    assert (await client.get("/")).status_code == 401


@pytest.mark.parametrize("host", ["evil.example:8765", f"127.0.0.1:{PORT + 1}", "127.0.0.1", "attacker.test"])
async def test_a_request_not_addressed_to_the_console_is_refused_even_with_a_session(
    browser: httpx.AsyncClient, host: str
) -> None:
    response = await browser.get("/", headers={"Host": host})
    assert response.status_code == 421
    assert "/home/me/project" not in response.text


@pytest.mark.parametrize("host", [f"localhost:{PORT}", f"[::1]:{PORT}"])
async def test_the_other_loopback_names_of_the_console_are_its_own(
    client: httpx.AsyncClient, host: str
) -> None:
    assert (await client.get("/static/console.css", headers={"Host": host})).status_code == 200


@pytest.mark.parametrize("origin", ["http://evil.example", f"http://127.0.0.1:{PORT + 1}", "null", None])
async def test_a_post_from_a_foreign_origin_is_refused_even_with_cookie_and_csrf_token(
    browser: httpx.AsyncClient, target: WorkspaceTarget, origin: str | None
) -> None:
    ask = target.ask()
    csrf = csrf_of((await browser.get("/asks")).text)
    headers = {"Origin": origin} if origin is not None else {}
    response = await browser.post(
        f"/asks/{ask.id}/answer", data={"csrf": csrf, "accept": "allow", "scope": "once"}, headers=headers
    )
    assert response.status_code == 403
    assert target.answers == [] and target.board.get(ask.id) is ask


async def test_the_event_stream_asked_for_by_a_foreign_page_is_refused(browser: httpx.AsyncClient) -> None:
    response = await browser.get("/events", headers={"Origin": "http://evil.example"})
    assert response.status_code == 403


@pytest.mark.parametrize("csrf", [None, "", "wrong-token"])
async def test_a_post_without_the_sessions_csrf_token_is_refused(
    browser: httpx.AsyncClient, target: WorkspaceTarget, csrf: str | None
) -> None:
    ask = target.ask()
    data = {"accept": "allow", "scope": "always"} | ({"csrf": csrf} if csrf is not None else {})
    response = await browser.post(f"/asks/{ask.id}/answer", data=data, headers={"Origin": ORIGIN})
    assert response.status_code == 403
    assert "security token" in response.text
    assert target.answers == []


async def test_the_csrf_token_of_another_session_is_refused(
    browser: httpx.AsyncClient, console: ConsoleApp, target: WorkspaceTarget
) -> None:
    _, other = console.auth.new_session()
    ask = target.ask()
    response = await browser.post(
        f"/asks/{ask.id}/answer",
        data={"accept": "allow", "scope": "once"},
        headers={"Origin": ORIGIN, "X-CSRF-Token": other.csrf},
    )
    assert response.status_code == 403 and target.answers == []


async def test_every_post_route_checks_the_csrf_token(
    browser: httpx.AsyncClient, console: ConsoleApp
) -> None:
    posts = [r.path for r in console.asgi.routes if isinstance(r, Route) and "POST" in (r.methods or ())]
    assert posts  # the answer and the explain forms
    for path in posts:
        response = await browser.post(path.replace("{ask_id}", "1-x"), data={}, headers={"Origin": ORIGIN})
        assert response.status_code == 403, path


async def test_every_response_carries_the_security_headers(
    client: httpx.AsyncClient, browser: httpx.AsyncClient
) -> None:
    for response in [await browser.get("/"), await client.get("/", headers={"Host": "evil.example"})]:
        assert response.headers["content-security-policy"] == (
            "default-src 'self'; frame-ancestors 'none'; form-action 'self'"
        )
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["cache-control"] == "no-store"
        assert response.headers["referrer-policy"] == "same-origin"


async def test_the_script_and_style_sheet_are_served_without_a_session(client: httpx.AsyncClient) -> None:
    script = await client.get("/static/console.js")
    assert script.status_code == 200 and "EventSource" in script.text
    assert (await client.get("/static/console.css")).status_code == 200


def test_no_template_has_inline_script_style_or_event_handlers() -> None:
    # The CSP allows only the console's own files: anything inline would be blocked in the browser.
    for template in TEMPLATES_DIR.glob("*.html"):
        text = template.read_text()
        assert not re.search(r"<script(?![^>]*\bsrc=)", text), template.name
        assert not re.search(r"<style|\sstyle=|\son[a-z]+=", text), template.name


# -- answering


async def test_allow_once_without_javascript_reaches_the_target_and_comes_back_with_what_happened(
    browser: httpx.AsyncClient, target: WorkspaceTarget
) -> None:
    ask = target.ask()
    response = await answer_form(browser, ask.id, accept="allow", scope="once")
    assert response.status_code == 303 and response.headers["location"] == "/asks"
    assert target.answers == [(ask.id, AskAnswer(True, "once", "console", "console (tester)"))]
    assert target.board.pending == []
    page = html.unescape((await browser.get("/asks")).text)
    assert "filesystem.write_file: allowed once by console (tester)." in page
    assert "No call is waiting for an answer" in page


@pytest.mark.parametrize(("accept", "scope"), [("allow", "always"), ("deny", "session"), ("deny", "always")])
async def test_an_answer_from_the_script_gets_json_and_passes_its_scope(
    browser: httpx.AsyncClient, target: WorkspaceTarget, accept: str, scope: str
) -> None:
    ask = target.ask()
    response = await answer_script(browser, ask.id, accept=accept, scope=scope)
    assert response.json() == {
        "type": "answered",
        "id": ask.id,
        "ok": True,
        "error": None,
        "settled": 1,
        "accept": accept == "allow",
    }
    assert target.answers == [(ask.id, AskAnswer(accept == "allow", scope, "console", "console (tester)"))]  # type: ignore[arg-type]


async def test_a_refused_answer_is_shown_and_the_ask_stays(
    browser: httpx.AsyncClient, target: WorkspaceTarget
) -> None:
    ask = target.ask()
    target.refusal = "the rule would not load: ipybox.toml:40:1: rule 'always-allow-x': ..."
    scripted = await answer_script(browser, ask.id, accept="allow", scope="always")
    assert scripted.json()["ok"] is False and scripted.json()["error"] == target.refusal
    await answer_form(browser, ask.id, accept="allow", scope="always")
    page = html.unescape((await browser.get("/asks")).text)
    assert f"filesystem.write_file: not answered: {target.refusal}" in page
    assert f'data-ask-id="{ask.id}"' in page and target.board.get(ask.id) is ask


async def test_an_ask_answered_elsewhere_first_says_who_answered(
    browser: httpx.AsyncClient, target: WorkspaceTarget
) -> None:
    ask = target.ask()
    target.board.answer(ask.id, AskAnswer(False, "once", "terminal", "terminal (alice on /dev/pts/3)"))
    response = await answer_script(browser, ask.id, accept="allow", scope="once")
    assert response.json()["error"] == "already denied once by terminal (alice on /dev/pts/3)"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"accept": "maybe", "scope": "once"}, "accept: expected allow or deny, got 'maybe'"),
        ({"accept": "allow", "scope": "forever"}, "scope: expected once, session or always, got 'forever'"),
    ],
)
async def test_a_bad_answer_field_is_named(
    browser: httpx.AsyncClient, target: WorkspaceTarget, fields: dict[str, str], message: str
) -> None:
    ask = target.ask()
    response = await answer_script(browser, ask.id, **fields)
    assert response.status_code == 400 and response.json()["error"] == message
    assert target.answers == []


async def test_a_closed_asks_card_is_gone(browser: httpx.AsyncClient, target: WorkspaceTarget) -> None:
    ask = target.ask()
    assert (await browser.get(f"/asks/{ask.id}/card")).status_code == 200
    target.board.close(ask, why="no answer within 90 s")
    assert (await browser.get(f"/asks/{ask.id}/card")).status_code == 404


# -- what the pages show


async def test_an_ask_shows_its_call_rule_session_annotations_and_a_button_per_answer(
    browser: httpx.AsyncClient, target: WorkspaceTarget
) -> None:
    target.ask()
    page = html.unescape((await browser.get("/asks")).text)
    assert "<code>filesystem</code>.<code>write_file</code>" in page
    assert "rule <code>ask-for-writes</code>: rule 'ask-for-writes' applies" in page
    assert "<code>01234567</code>" in page  # the session, shortened
    assert "destructiveHint = true" in page
    for action in ["allow-once", "allow-session", "allow-always", "deny-once", "deny-session", "deny-always"]:
        assert f'data-action="{action}"' in page
    assert page.count(f'name="csrf" value="{csrf_of(page)}"') == 4  # "always" opens a preview first (GET)


async def test_an_ask_shows_the_client_its_history_and_the_cells_code_around_the_call(
    browser: httpx.AsyncClient, target: WorkspaceTarget
) -> None:
    code = "\n".join(f"step_{n}()" for n in range(1, 30)).replace(
        "step_20()", "fs.write_file.run('<b>x</b>')"
    )
    call = ToolCall("filesystem", "write_file", {"path": "a"}, cell=7, line=20, cell_text=code)
    at = datetime(2026, 12, 7, 23, 0, tzinfo=UTC)
    grants = {("fs", "read_file"): Grant(True, "console (root)", at)}
    client = ClientView.of("0123456789abcdef", "Claude Code 2.1", at, (3, 1), grants)
    verdict = Verdict(
        "ask", "writes", "rule 'writes' applies", tier="system", explanation="writes need a person"
    )
    ask = target.board.open(
        call,
        verdict,
        asked_of="console",
        routes=("console",),
        session="0123456789abcdef",
        cell=cell_view(call),
        client=client,
    )
    for page in [(await browser.get("/asks")).text, (await browser.get(f"/asks/{ask.id}/card")).text]:
        assert '<strong class="ask-client-name">Claude Code 2.1</strong>' in page
        assert 'title="session 01234567"' in page  # the opaque id stays, in a tooltip
        history = "started 2026-12-07 23:00:00 UTC; 4 calls so far (3 allowed, 1 denied); for this session: "
        assert html.unescape(page).count(history + "allowed fs.read_file (by console (root))") == 1
        assert '<span class="pill pill-plain ask-tier">system admin policy</span>' in page
        assert '<q class="ask-explanation">writes need a person</q>' in page
        assert "Code of cell 7, the call on line 20" in page and "as reported by the kernel" in page
        window, everything = re.findall(r"<pre class=\"code[^\"]*\">(.*?)</pre>", page, re.S)
        assert (
            '<mark class="call-line"><span class="ln">  20</span> fs.write_file.run(&#39;&lt;b&gt;x&lt;/b&gt;&#39;)'
            in window
        )
        assert "step_14()" in window and "step_13()" not in window and "step_23()" in window
        assert len(window.strip("\n").split("\n")) == 10  # one line each (`trim_blocks` eats none)
        assert "step_24()" not in window and "step_1()" in everything and "step_29()" in everything
        assert "<summary>All 29 lines</summary>" in page


async def test_a_session_answer_in_the_console_settles_the_sessions_waiting_calls_and_says_how_many(
    browser: httpx.AsyncClient, target: WorkspaceTarget, tmp_path: Path
) -> None:
    rules = ApprovalPolicy.model_validate({"rules": [{"server": "fs", "decision": "ask", "id": "fs-asks"}]})
    approver = WorkspaceApprover(
        rules, AuditLog(tmp_path / "audit.jsonl"), lambda caller: None, board=target.board, session_of=str
    )
    target.answer = approver.answer  # type: ignore[method-assign]
    with target.board.present("console"):
        calls = [
            asyncio.create_task(approver.decide(ToolCall("fs", "w", {"n": n}, caller="L1"))) for n in range(3)
        ]
        while len(target.board.pending) < 3:
            await asyncio.sleep(0.01)
        first = target.board.pending[0].id
        response = await answer_script(browser, first, accept="allow", scope="session")
        assert (response.json()["settled"], response.json()["accept"]) == (3, True)
        assert await asyncio.gather(*calls) == [Approved()] * 3
        other = asyncio.create_task(approver.decide(ToolCall("fs", "x", caller="L1")))
        while not target.board.pending:
            await asyncio.sleep(0.01)
        await answer_form(browser, target.board.pending[0].id, accept="deny", scope="session")
        assert isinstance(await other, Rejected)
    page = html.unescape((await browser.get("/asks")).text)
    assert "Denied for this session: settled 1 waiting call (fs.x, by console (tester))." in page


async def test_a_shell_command_is_shown_as_the_command(
    browser: httpx.AsyncClient, target: WorkspaceTarget
) -> None:
    target.ask(
        ToolCall("shell", "curl", {"cmd": "curl -s https://example.com"}),
        subject="curl -s https://example.com",
    )
    page = (await browser.get("/asks")).text
    assert '<span class="muted">shell</span> <code>curl -s https://example.com</code>' in page


async def test_markup_in_arguments_is_shown_as_text(
    browser: httpx.AsyncClient, target: WorkspaceTarget
) -> None:
    evil = "<script>alert(1)</script>"
    ask = target.ask(
        ToolCall(
            "filesystem",
            "write_file",
            {"path": evil, "content": "x" * 300 + '"><img src=x onerror=alert(1)>'},
        ),
        subject=None,
    )
    target.audit.record(ToolCall("fs", evil, {"q": evil}), Verdict("deny", evil, evil))
    for page in [
        (await browser.get("/asks")).text,
        (await browser.get(f"/asks/{ask.id}/card")).text,
        (await browser.get("/audit")).text,
    ]:
        assert "<script>alert" not in page and "<img src=x" not in page
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


async def test_a_path_argument_that_is_a_link_shows_where_it_leads_flagged(
    browser: httpx.AsyncClient, target: WorkspaceTarget
) -> None:
    call = ToolCall("filesystem", "write_file", {"path": "gentools/notes.md", "content": "x"})
    link = PathLink(target="/home/me/project/ipybox.toml", flag="protected")
    ask = target.board.open(
        call, target.policy.decide(call), asked_of="console", routes=("console",), links={"path": link}
    )
    for page in [(await browser.get("/asks")).text, (await browser.get(f"/asks/{ask.id}/card")).text]:
        assert re.search(
            r'<tr class="arg-link arg-link-flagged" data-link="path">\s*<th>path</th>\s*<td>is a link '
            r'<code class="link-target">→ /home/me/project/ipybox.toml \(protected\)</code>',
            page,
        )


async def test_long_argument_values_are_folded(browser: httpx.AsyncClient, target: WorkspaceTarget) -> None:
    target.ask(ToolCall("filesystem", "write_file", {"path": "a.md", "content": "line\n" * 100}))
    page = (await browser.get("/asks")).text
    assert '<tr data-arg="path">' in page and '<code class="value">a.md</code>' in page
    assert re.search(
        r'<tr data-arg="content">\s*<th>content</th>\s*<td><details><summary>line… \(500 characters\)', page
    )


async def test_the_overview_shows_servers_with_state_tools_error_and_where_in_the_file(
    browser: httpx.AsyncClient, target: WorkspaceTarget
) -> None:
    target.workspace_status = status_of(config_error="ipybox.toml:9:3: unknown key 'comand'")
    target.ask()
    for page in [(await browser.get("/")).text, (await browser.get("/fragments/overview")).text]:
        text = html.unescape(page)
        assert '<tr data-server="broken">' in page and "could not start: npx: command not found" in text
        assert "<code>ipybox.toml:12:1</code>" in page and "mcpparse/broken/x.py:3:1: SyntaxError" in page
        assert "<td>14</td>" in page
        assert "ipybox.toml:9:3: unknown key 'comand'" in text
        assert "pool of 2: 1 idle, 1 leased; 1 lease" in page
        assert '<span id="overview-pending">1</span> pending ask' in page
        assert "http://127.0.0.1:8123/mcp" in page and "restarted 1×" in page
        assert '<span class="pill pill-on" id="sandbox-state">on</span>' in page


async def test_the_overview_says_where_remote_kernels_run_and_what_isolates_them(
    browser: httpx.AsyncClient, target: WorkspaceTarget
) -> None:
    gateway = GatewayStatus(
        running=False,
        url="https://eg.example:8888",
        kernelspec="python3",
        isolation="the gateway's cluster",
        requested_limits={"KERNEL_MEMORY_LIMIT": "4294967296"},
        problem="the gateway at https://eg.example:8888 does not answer",
    )
    target.workspace_status = status_of(gateway=gateway, sandbox=False)
    page = html.unescape((await browser.get("/fragments/overview")).text)
    text = " ".join(re.sub(r"<[^>]+>", "", page).split())
    assert "the gateway at https://eg.example:8888 (kernel spec python3): not answering" in text
    assert (
        "the gateway's cluster; limits asked of its kernel template: KERNEL_MEMORY_LIMIT=4294967296" in text
    )
    assert 'id="sandbox-state"' not in page  # no local sandbox to show as on or off


async def test_the_overview_shows_each_kernels_memory_cpu_and_the_limits(
    browser: httpx.AsyncClient, target: WorkspaceTarget
) -> None:
    for page in [(await browser.get("/")).text, (await browser.get("/fragments/overview")).text]:
        text = html.unescape(page)
        leased = page[page.index('data-role="leased"') : page.index('data-role="pool"')]
        assert "lease <code" in leased and ">9a8b7c6d</code>" in leased and ">0f1e2d3c</code>" in leased
        assert '<td class="memory">312 MiB</td>' in leased
        assert "1.0 GiB" in leased or "1 GiB" in leased
        assert "1 killed for memory" in leased
        assert '<td class="cpu">12.35 s</td>' in leased and '<td class="processes">14</td>' in leased
        assert "idle, 1 min 15 s" in leased
        assert '<td class="memory">52 MiB</td>' in page and "warm pool" in page
        assert "limits: memory 4 GiB, processes 256, open files 4096 (cgroup1)" in text
        assert "deleted after 30 min 00 s idle, recycled past 2 GiB; so far 2 deleted" in text


async def test_a_gateway_that_did_not_answer_leaves_the_usage_out_with_why_escaped(
    browser: httpx.AsyncClient, target: WorkspaceTarget
) -> None:
    unanswered = KernelsStatus(
        reported=False, error="the kernel gateway answered <b>502</b> to GET /api/kernels"
    )
    target.workspace_status = status_of(kernels=unanswered)
    page = (await browser.get("/fragments/overview")).text
    assert 'id="kernels-table"' not in page and "<b>502</b>" not in page
    assert "Usage not known: the kernel gateway answered &lt;b&gt;502&lt;/b&gt; to GET /api/kernels" in page
    target.workspace_status = status_of(kernels=None)  # a status built without asking the gateway
    assert 'id="kernel-usage"' not in (await browser.get("/fragments/overview")).text


# -- audit


def record_decisions(target: WorkspaceTarget, count: int) -> list[str]:
    """`count` decisions on tools t0, t1, ...; every third answered in the console (allow, always)."""
    tools = []
    for i in range(count):
        call = ToolCall("filesystem" if i % 2 else "memory", f"t{i}", {"i": i})
        if i % 3 == 0:
            target.audit.record(
                call,
                Verdict("ask", "ask-for-writes", "rule 'ask-for-writes' applies"),
                answer="allow",
                decided_by="console",
                scope="always",
                by="console (tester)",
            )
        else:
            target.audit.record(call, Verdict("deny", "no-secrets", "rule 'no-secrets' applies"))
        tools.append(f"t{i}")
    return tools


def tools_on(page: str) -> list[str]:
    return re.findall(r'data-tool="([^"]+)"', page)


async def test_the_audit_log_is_shown_newest_first_with_scope_and_who_answered(
    browser: httpx.AsyncClient, target: WorkspaceTarget
) -> None:
    record_decisions(target, 4)
    page = (await browser.get("/audit")).text
    assert tools_on(page) == ["t3", "t2", "t1", "t0"]
    row = page[page.index('data-tool="t3"') : page.index('data-tool="t2"')]
    assert all(
        f'data-label="{label}">{text}</td>' in row
        for label, text in (("Decided by", "console"), ("Scope", "always"), ("By", "console (tester)"))
    )
    assert 'id="audit-older"' not in page


async def test_the_audit_filters_narrow_what_is_shown(
    browser: httpx.AsyncClient, target: WorkspaceTarget
) -> None:
    record_decisions(target, 12)
    assert tools_on((await browser.get("/audit?decided_by=console")).text) == ["t9", "t6", "t3", "t0"]
    assert tools_on((await browser.get("/audit?server=memory&decision=deny")).text) == [
        "t10",
        "t8",
        "t4",
        "t2",
    ]
    assert tools_on((await browser.get("/audit?tool=t1*&rule_id=no-*")).text) == ["t11", "t10", "t1"]
    assert tools_on((await browser.get("/audit?until=2000-01-01")).text) == []
    assert "No decision matches these filters" in (await browser.get("/audit?tool=none")).text


async def test_audit_pages_follow_each_other_and_give_every_entry_once(
    browser: httpx.AsyncClient, target: WorkspaceTarget
) -> None:
    tools = record_decisions(target, 130)
    seen: list[str] = []
    url: str | None = "/audit?server=memory"
    pages = 0
    while url is not None:
        page = (await browser.get(url)).text
        seen += tools_on(page)
        pages += 1
        older = re.search(r'id="audit-older" href="([^"]+)"', page)
        url = html.unescape(older.group(1)) if older else None
        assert url is None or "server=memory" in url  # the filter goes along
    assert seen == [tool for tool in reversed(tools) if int(tool[1:]) % 2 == 0]
    assert pages == 2


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("since=yesterday", "since: expected an ISO 8601 date or date-time"),
        ("decided_by=someone", "decided_by: expected one of rule, default"),
        ("before=-5", "before: expected a position in the log (a number), got '-5'"),
        ("since=2026-11-25&until=2026-11-24", "until: '2026-11-24' is not after since"),
    ],
)
async def test_bad_audit_filters_are_a_message_on_the_page(
    browser: httpx.AsyncClient, target: WorkspaceTarget, query: str, message: str
) -> None:
    record_decisions(target, 2)
    response = await browser.get(f"/audit?{query}")
    assert response.status_code == 400
    assert message in html.unescape(response.text)
    assert 'id="audit-filters"' in response.text


async def test_a_damaged_audit_line_is_counted_not_fatal(
    browser: httpx.AsyncClient, target: WorkspaceTarget
) -> None:
    record_decisions(target, 2)
    with Path(target.audit.path).open("a") as log:
        log.write('{"time": "cut off\n')
    record_decisions(target, 1)
    page = (await browser.get("/audit")).text
    assert "1 damaged line skipped on this page." in page and len(tools_on(page)) == 3


# -- rules


async def test_the_rules_are_listed_in_the_order_they_are_tried(browser: httpx.AsyncClient) -> None:
    page = (await browser.get("/rules")).text
    order = re.findall(r'<tr class="rule-row" data-rule-id="([^"]+)"', page)
    assert order == ["trusted-writes", "no-secrets", "no-rm", "ask-for-writes", "read-only", "rules[4]"]
    assert 'id="policy-default">ask</span>' in page and "90.0 s, then the call is denied" in page
    assert "application, elicitation, console, terminal" in page
    assert "<code>path: glob &#34;out/**&#34;</code>" in page and "<code>readOnlyHint = true</code>" in page


async def test_the_rules_page_shows_rules_that_fit_no_tool_and_accepts_a_changed_server(
    browser: httpx.AsyncClient, target: WorkspaceTarget
) -> None:
    pins = {
        "edge": [
            "tool 'forecast' changed: readOnlyHint: true -> false; description changed",
            "    -Old",
            "    +New <b>",
        ]
    }
    policy = PolicyStatus(pins=pins, tiers=["system: /etc/ipybox/policy.toml (1 rule)"])
    reconciler = target.workspace_status.reconciler.model_copy(
        update={
            "lint": [
                "/ws/ipybox.toml:9:1: rule 'typo': tool glob 'forcast' matches no tool (did you mean 'forecast'?)"
            ]
        }
    )
    target.workspace_status = target.workspace_status.model_copy(
        update={"policy": policy, "reconciler": reconciler}
    )
    page = (await browser.get("/rules")).text
    assert "did you mean &#39;forecast&#39;?" in page and "system: /etc/ipybox/policy.toml (1 rule)" in page
    assert "readOnlyHint: true -&gt; false" in page and "+New &lt;b&gt;" in page  # escaped, as everything
    csrf = csrf_of(page)
    response = await browser.post(
        "/pins/accept", data={"csrf": csrf, "server": "edge"}, headers={"Origin": ORIGIN}
    )
    assert response.status_code == 200 and "Pinned in ipybox.lock: edge." in response.text
    assert target.accepted == ["edge"] and 'id="pins"' not in response.text
    # Without the CSRF token nothing is accepted.
    response = await browser.post("/pins/accept", data={"server": "edge"}, headers={"Origin": ORIGIN})
    assert response.status_code == 403 and target.accepted == ["edge"]


async def explain(browser: httpx.AsyncClient, **fields: str) -> httpx.Response:
    csrf = csrf_of((await browser.get("/rules")).text)
    return await browser.post("/rules/explain", data={"csrf": csrf, **fields}, headers={"Origin": ORIGIN})


def verdicts(page: str) -> list[tuple[str, str]]:
    return re.findall(r'<div class="verdict" data-decision="(\w+)" data-rule-id="([^"]*)"', page)


async def test_explain_shows_the_deciding_rule(browser: httpx.AsyncClient) -> None:
    response = await explain(browser, server="filesystem", tool="write_file", args='{"path": "out/a.md"}')
    assert verdicts(response.text) == [("allow", "trusted-writes")]
    assert 'value="filesystem"' in response.text  # the form keeps what was typed
    response = await explain(
        browser, server="filesystem", tool="read_file", annotations='{"readOnlyHint": true}'
    )
    assert verdicts(response.text) == [("allow", "read-only")]
    response = await explain(browser, server="memory", tool="create_entities")
    assert verdicts(response.text) == [("ask", "")] and "the default" in response.text


async def test_explain_of_a_shell_line_decides_each_command(browser: httpx.AsyncClient) -> None:
    response = await explain(browser, server="shell", args='{"cmd": "ls -l && rm -rf build"}')
    assert verdicts(response.text) == [("allow", "rules[4]"), ("deny", "no-rm")]
    assert "<code>rm -rf build</code>" in response.text


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"server": "fs", "tool": "t", "args": "{path: 1}"}, "args: not valid JSON (Expecting property name"),
        ({"server": "fs", "tool": "t", "args": "[1]"}, "args: a JSON object is needed, not list"),
        (
            {"server": "fs", "tool": "t", "annotations": '{"readonly": true}'},
            "annotations: unknown annotation 'readonly'",
        ),
        (
            {"server": "fs", "tool": "t", "annotations": '{"readOnlyHint": 1}'},
            "annotations: readOnlyHint must be true or false",
        ),
        ({"server": "", "tool": "t"}, "server: give the server's name"),
        ({"server": "fs", "tool": ""}, "tool: give the tool's name"),
        ({"server": "shell", "args": '{"cmd": "echo \'open"}'}, "quote"),
    ],
)
async def test_explain_with_bad_input_names_the_field(
    browser: httpx.AsyncClient, fields: dict[str, str], message: str
) -> None:
    response = await explain(browser, **fields)
    assert response.status_code == 400
    shown = re.search(r'id="explain-error">([^<]*)<', response.text)
    assert shown and message in html.unescape(shown.group(1))
